"""Chunkwise decayed attention against hand-written PyTorch: for RetNet's multi-scale retention
(designs/retnet.td), time fwd+bwd of tdiag's module (the planner's chunked form), a hand-written
chunkwise implementation of the same block (Sun et al. 2023 eq. 7, written as the papers' and
flash-linear-attention's PyTorch reference chunk forms are: the decay matrix within a chunk,
chunk states decayed to the chunk's end, a loop over chunks carrying the state) with the same
weights, and tdiag's masked O(N²) form (the same design planned at a length where the planner
keeps the masked product), round-robin in one process (one thread, batch 1). Prints each time
over tdiag's with its min-max over rounds, the bytes each keeps for backward, and writes
JSON/CSV/PNG to --out. The hand-written block is checked equal to tdiag's in float64 first.

    OMP_NUM_THREADS=1 python scripts/bench_decay.py --n 1024 4096 --repeat 5 --out docs/results/bench-cpu/decay"""

from __future__ import annotations

import argparse
import csv
import json
import platform
import re
from pathlib import Path

import torch
import torch.nn.functional as functional
from torch import nn

import tdiag
from tdiag.bench import measure_all

ROOT = Path(__file__).resolve().parent.parent


class HandWrittenRetention(nn.Module):
    """Multi-scale retention, chunkwise (RetNet eq. 7-8), from leg-shaped weights of retnet.td."""

    def __init__(self, compiled: nn.Module, chunk: int = 64):
        super().__init__()
        self.wq, self.wk, self.wv = (nn.Parameter(getattr(compiled, w).detach().clone()) for w in ("WQ", "WK", "WV"))
        self.wg, self.wo = nn.Parameter(compiled.WG.detach().clone()), nn.Parameter(compiled.WO.detach().clone())
        self.chunk = chunk

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, f = x.shape
        h, d, e = self.wq.shape[1], self.wq.shape[2], self.wv.shape[2]
        q = (x @ self.wq.reshape(f, h * d)).view(b, n, h, d).transpose(1, 2)
        k = (x @ self.wk.reshape(f, h * d)).view(b, n, h, d).transpose(1, 2)
        v = (x @ self.wv.reshape(f, h * e)).view(b, n, h, e).transpose(1, 2)
        theta = 10000.0 ** (-2 * torch.arange(d // 2, dtype=x.dtype) / d)
        angle = torch.arange(n, dtype=x.dtype)[:, None] * theta
        cos, sin = angle.cos().repeat_interleave(2, -1), angle.sin().repeat_interleave(2, -1)

        def rotate(t):
            pairs = t.unflatten(-1, (d // 2, 2))
            return t * cos + torch.stack([-pairs[..., 1], pairs[..., 0]], -1).flatten(-2) * sin

        o = self.retention(rotate(q), rotate(k), v)  # [b, h, n, e]
        o = o - o.mean(-1, keepdim=True)
        o = o * torch.rsqrt(o.square().mean(-1, keepdim=True) + 1e-5)
        gate = functional.silu(x @ self.wg.reshape(f, h * e)).view(b, n, h, e)
        return (gate * o.transpose(1, 2)).reshape(b, n, h * e) @ self.wo.reshape(h * e, f)

    def retention(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> torch.Tensor:
        h, n = q.shape[1], q.shape[2]
        c = self.chunk
        count = -(-n // c)
        q, k, v = (functional.pad(t, (0, 0, 0, count * c - n)).unflatten(2, (count, c)) for t in (q, k, v))
        log_gamma = torch.log(1 - 2.0 ** (-5 - torch.arange(h, dtype=q.dtype)))
        i = torch.arange(c, dtype=q.dtype)
        lag = i[:, None] - i[None, :]
        within = torch.exp((log_gamma[:, None, None] * lag).masked_fill(lag < 0, float("-inf")))  # [h, c, c]
        inner = ((q @ k.transpose(-1, -2)) * within[:, None]) @ v
        to_end = torch.exp(log_gamma[:, None] * (c - 1 - i))  # [h, c]
        states = (k * to_end[:, None, :, None]).transpose(-1, -2) @ v  # [b, h, count, d, e]
        across = torch.exp(log_gamma * c)[:, None, None]
        state = torch.zeros_like(states[:, :, 0])
        earlier = []
        for chunk in range(count):
            earlier.append(state)
            state = across * state + states[:, :, chunk]
        since_start = torch.exp(log_gamma[:, None] * (i + 1))  # [h, c]
        cross = (q * since_start[:, None, :, None]) @ torch.stack(earlier, 2)
        return (inner + cross).flatten(2, 3)[:, :, :n]


def check_equal(design: tdiag.Design) -> float:
    """Max |hand-written − tdiag| in float64 at a length off the chunk size."""
    compiled = design.module(N=4096, dtype=torch.float64)
    hand = HandWrittenRetention(compiled).double()
    x = torch.randn(2, 150, compiled.WQ.shape[0], dtype=torch.float64)
    with torch.no_grad():
        return float((hand(x) - compiled(x)).abs().max())


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    design = tdiag.load(ROOT / "designs" / "retnet.td", F=args.width, H=args.heads)
    error = check_equal(design)
    print(f"hand-written vs tdiag, float64, N=150: max |difference| {error:.2e}")
    assert error < 1e-9, error
    names = ("tdiag", "hand-written chunkwise", "tdiag masked N^2")
    print(f"{'N':>5} " + " ".join(f"{name + ' ms':>24}" for name in names) + "   ratios to tdiag (min-max)")
    rows = []
    for n in args.n:
        torch.manual_seed(0)
        chunked = design.module(N=n)
        masked = design.module(N=8)  # planned short: the masked product
        assert "_decayed_earlier" in chunked.tdiag_source and "_decayed_earlier" not in masked.tdiag_source
        masked.load_state_dict(chunked.state_dict())
        modules = [chunked, HandWrittenRetention(chunked), masked]
        timings = measure_all(modules, torch.randn(1, n, args.width), False, args.repeat)
        base = timings[0].seconds
        row = {"n": n, "chunk": _chunk(chunked)}
        cells = []
        for name, t in zip(names, timings, strict=True):
            ratios = sorted(a / b for a, b in zip(t.seconds, base, strict=True))
            row |= {
                f"{name} ms": 1e3 * sorted(t.seconds)[len(t.seconds) // 2],
                f"{name} kept MB": t.saved_bytes / 1e6,
                f"{name} / tdiag": ratios[len(ratios) // 2],
                f"{name} / tdiag min": ratios[0],
                f"{name} / tdiag max": ratios[-1],
            }
            cells.append(f"{ratios[len(ratios) // 2]:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})")
        rows.append(row)
        times = " ".join(f"{row[name + ' ms']:24.1f}" for name in names)
        print(f"{n:>5} {times}   {'  '.join(cells[1:])}", flush=True)
        print("      kept for backward MB: " + ", ".join(f"{name} {row[name + ' kept MB']:.1f}" for name in names))
    if args.out:
        write(Path(args.out), rows, args, error)


def _chunk(module: nn.Module) -> int:
    found = (re.search(r"chunks of C = (\d+)", line) for line in module.tdiag_plan.lowered)
    return next(int(match.group(1)) for match in found if match)


def write(out: Path, rows: list[dict], args: argparse.Namespace, error: float) -> None:
    out.mkdir(parents=True, exist_ok=True)
    settings = {"width": args.width, "heads": args.heads, "repeat": args.repeat, "batch": 1, "threads": 1}
    settings |= {"torch": torch.__version__, "machine": platform.platform(), "float64 max difference": error}
    (out / "decay.json").write_text(json.dumps({"settings": settings, "rows": rows}, indent=2))
    with (out / "decay.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    for name in ("tdiag", "hand-written chunkwise", "tdiag masked N^2"):
        ax.plot([r["n"] for r in rows], [r[f"{name} ms"] for r in rows], marker="o", label=name)
    ax.set(xscale="log", yscale="log", xlabel="N", ylabel="fwd+bwd ms (median)", title="RetNet MSR, F=256, H=4")
    ax.legend()
    fig.tight_layout()
    fig.savefig(out / "decay.png", dpi=120)
    plt.close(fig)


if __name__ == "__main__":
    main()
