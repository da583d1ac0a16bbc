"""Two box forms of one design, fwd+bwd: by default causal MGK with the ordinary SDPA form (causal
mask as a boolean attn_mask over (n, m r)) against the repeated-query form (forms/sdpa_repeated.py,
is_causal on the repeated rows), each plan built with the other form(s) named left out of the
registry, timed round-robin in one process (single thread, batch 1), min–max over the repeats,
ratios to the first form, with the bytes kept for backward as the footprint model says and as
torch's saved-tensor hooks measure them.

    python scripts/bench_mgk_causal.py --n 1024 4096 --repeat 3
    python scripts/bench_mgk_causal.py --design absolute_bias --plain --forms sdpa materialized --set F=512 --set H=8"""

from __future__ import annotations

import argparse
import time

import torch

import tdiag
from tdiag.measure import saved_for_backward
from tdiag.plan import BATCH_SIZE, forms
from tdiag.plan.footprint import footprint


def build(left_out: list[str], n: int, design: str, sizes: dict[str, int], causal: bool):
    """The compiled design planned without the forms `left_out`, and the bytes its footprint model
    says autograd keeps at a batch of one."""
    everything = forms.FORMS
    forms.FORMS = [f for f in everything if f.name not in left_out]
    try:
        d = tdiag.load(design, **sizes)
        module = (d.with_causal_mask() if causal else d).module(N=n)
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
    parser.add_argument("--forms", nargs="+", default=["sdpa", "sdpa_repeated"])
    parser.add_argument("--set", action="append", default=["F=256", "H=4"], metavar="SIZE=VALUE")
    parser.add_argument("--plain", action="store_true", help="no causal mask")
    args = parser.parse_args()
    torch.set_num_threads(1)
    sizes = {k: int(v) for k, _, v in (s.partition("=") for s in args.set)}
    for n in args.n:
        built = {
            form: build([f for f in args.forms if f != form], n, args.design, sizes, not args.plain)
            for form in args.forms
        }
        modules = {name: module for name, (module, _) in built.items()}
        x = torch.randn(1, n, sizes["F"], generator=torch.Generator().manual_seed(0))
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
        base = times[args.forms[0]]
        for name, ts in times.items():
            ratios = [t / b for t, b in zip(ts, base, strict=True)]
            spread = f"{min(ts) * 1e3:.0f}–{max(ts) * 1e3:.0f} ms"
            print(f"N={n} {name}: {spread}, ratio to {args.forms[0]} {min(ratios):.2f}–{max(ratios):.2f}")


if __name__ == "__main__":
    main()
