"""Causal MGK, fwd+bwd: the ordinary SDPA form (causal mask as a boolean attn_mask over (n, m r))
against the repeated-query form (forms/sdpa_repeated.py, is_causal on the repeated rows), each
plan built with only one of the two forms available, timed round-robin in one process (single
thread, batch 1), min–max over the repeats, with the bytes kept for backward as the footprint
model says and as torch's saved-tensor hooks measure them.

    python scripts/bench_mgk_causal.py --n 1024 4096 --repeat 3"""

from __future__ import annotations

import argparse
import time

import torch

import tdiag
from tdiag.measure import saved_for_backward
from tdiag.plan import BATCH_SIZE, forms
from tdiag.plan.footprint import footprint


def build(form_left_out: str, n: int, design: str):
    """The compiled causal design at F=256, H=4 planned without `form_left_out`, and the bytes
    its footprint model says autograd keeps at a batch of one."""
    everything = forms.FORMS
    forms.FORMS = [f for f in everything if f.name != form_left_out]
    try:
        d = tdiag.load(design, F=256, H=4).with_causal_mask()
        module = d.module(N=n)
    finally:
        forms.FORMS = everything
    plan = module.tdiag_plan
    saved = footprint(plan, plan.sizes | {"B": 1}).saved_bytes
    return module, int(plan.graph.evaluate(saved, **plan.sizes).xreplace({BATCH_SIZE: 1}))


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--n", type=int, nargs="+", default=[1024])
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--design", default="mgk")
    args = parser.parse_args()
    torch.set_num_threads(1)
    for n in args.n:
        built = {
            "sdpa (attn_mask)": build("sdpa_repeated", n, args.design),
            "sdpa_repeated": build("sdpa", n, args.design),
        }
        modules = {name: module for name, (module, _) in built.items()}
        x = torch.randn(1, n, 256, generator=torch.Generator().manual_seed(0))
        for name, (module, model) in built.items():
            measured = saved_for_backward(module, x).total_bytes
            taken = [c.taken for c in module.tdiag_plan.choices]
            print(f"N={n} {name}: taken {taken}, kept for backward: model {model:,} B, measured {measured:,} B")
        x.requires_grad_()
        times: dict[str, list[float]] = {name: [] for name in modules}
        for _ in range(args.repeat):
            for name, module in modules.items():
                start = time.perf_counter()
                module(x).sum().backward()
                times[name].append(time.perf_counter() - start)
        base = times["sdpa (attn_mask)"]
        for name, ts in times.items():
            ratios = [t / b for t, b in zip(ts, base, strict=True)]
            spread = f"{min(ts) * 1e3:.0f}–{max(ts) * 1e3:.0f} ms"
            print(f"N={n} {name}: {spread}, ratio to attn_mask {min(ratios):.2f}–{max(ratios):.2f}")


if __name__ == "__main__":
    main()
