"""The FiSH family at long N against a hand-written SDPA MHSA (issue 22): fwd+bwd time of a
training step (tdiag.measure.time_step, train mode, noise drawn) and bytes saved for backward
(tdiag.measure.saved_for_backward), round-robin in one process, median and min-max of the
per-round ratios.

    python scripts/bench_fish.py --n 2048 --rounds 5            # plain
    python scripts/bench_fish.py --n 2048 --rounds 5 --causal

The MHSA baseline is q, k, v projections (F -> F, no bias), torch's scaled_dot_product_attention
over H heads (is_causal when causal) and the output projection. Besides each design's default
plan, the rows show fish in eval mode (its noise off), fish with checkpoint_boxes, hard_fish
under objective memory and hard_fish with the global-head form taken regardless of the time
model (tdiag/plan/global_heads.py; the cost check bypassed for this row only)."""

from __future__ import annotations

import argparse
import statistics
from pathlib import Path

import torch
import torch.nn.functional as functional
from torch import nn

import tdiag
from tdiag.measure import saved_for_backward, time_step
from tdiag.plan import global_heads

DESIGNS = Path(__file__).resolve().parent.parent / "designs"
FAMILY = ("fish", "hard_fish", "gfish", "hard_gfish", "mish", "lfish")


class SdpaMhsa(nn.Module):
    """Multi-head self-attention written by hand around torch's fused SDPA."""

    def __init__(self, width: int, heads: int, causal: bool):
        super().__init__()
        self.heads, self.causal = heads, causal
        self.q, self.k, self.v, self.o = (nn.Linear(width, width, bias=False) for _ in range(4))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, f = x.shape

        def split(t: torch.Tensor) -> torch.Tensor:
            return t.view(b, n, self.heads, f // self.heads).transpose(1, 2)

        y = functional.scaled_dot_product_attention(
            split(self.q(x)), split(self.k(x)), split(self.v(x)), is_causal=self.causal
        )
        return self.o(y.transpose(1, 2).reshape(b, n, f))


def forced_global_heads(ctx, box, ren, others, out, fused):
    """global_heads.taken without its cost check: the form wherever it applies."""
    form = global_heads.recognise(ctx, box, ren, others, out)
    return None if isinstance(form, str) else form


def modules(n: int, width: int, heads: int, causal: bool) -> dict[str, nn.Module]:
    def build(name: str, **options) -> nn.Module:
        design = tdiag.load(DESIGNS / f"{name}.td", F=width, H=heads)
        return (design.with_causal_mask() if causal else design).module(seed=0, N=n, **options)

    torch.manual_seed(0)
    result: dict[str, nn.Module] = {"mhsa (hand-written SDPA)": SdpaMhsa(width, heads, causal)}
    result |= {f"{name} (default plan)": build(name) for name in FAMILY}
    result["fish, eval mode"] = build("fish").eval()
    result["fish, checkpoint_boxes"] = build("fish", checkpoint_boxes=True)
    result["hard_fish, objective memory"] = build("hard_fish", objective="memory")
    taken, global_heads.taken = global_heads.taken, forced_global_heads
    try:
        result["hard_fish, global-head forced"] = build("hard_fish")
    finally:
        global_heads.taken = taken
    return result


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2048)
    parser.add_argument("--width", type=int, default=256, help="F")
    parser.add_argument("--heads", type=int, default=4, help="H")
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--causal", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(args.threads)
    mods = modules(args.n, args.width, args.heads, args.causal)
    for name, module in mods.items():
        if hasattr(module, "tdiag_plan"):
            print(f"  {name}: {'; '.join(module.tdiag_plan.lowered) or 'materialized box'}")
    x = torch.randn(1, args.n, args.width)
    saved = {name: saved_for_backward(module, x).total_bytes for name, module in mods.items()}
    times: dict[str, list[float]] = {name: [] for name in mods}
    for module in mods.values():
        time_step(module, x, repeats=0, warmup=1)
    for _ in range(args.rounds):
        for name, module in mods.items():
            times[name] += time_step(module, x, repeats=1, warmup=0)
    base = next(iter(mods))
    load = Path("/proc/loadavg").read_text().split()[:3] if Path("/proc/loadavg").exists() else "?"
    print(
        f"N={args.n} F={args.width} H={args.heads} batch 1, {args.threads} thread(s), "
        f"{'causal' if args.causal else 'plain'}, {args.rounds} rounds, load average {load}"
    )
    for name in mods:
        ratios = [t / b for t, b in zip(times[name], times[base], strict=True)]
        print(
            f"{name:32s} {statistics.median(times[name]) * 1e3:8.1f} ms  time x{statistics.median(ratios):.2f} "
            f"(min {min(ratios):.2f}, max {max(ratios):.2f})  saved {saved[name]:>12,} B "
            f"(x{saved[name] / saved[base]:.1f})"
        )


if __name__ == "__main__":
    main()
