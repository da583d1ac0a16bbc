"""A new candidate form against the plans made without it: for each bundled design, mask (plain,
causal) and length, plan with every form and with every form but `--form`; where the plan
with every form takes `--form` for a box, time both forward + backward round-robin in one
process (one thread, batch 1 and planned for it, the module with the form given the other's weights, outputs
checked equal first) and print the plan without
the form over the plan with it per round (median, min–max: above 1 the new form is faster) with
the bytes each keeps for backward. Cases where the form is not taken are left out. Writes
form.json and form.csv in --out.

    OMP_NUM_THREADS=1 python scripts/bench_form.py --form sdpa_padded --n 1024 4096 --repeat 5 \\
        --out docs/results/bench-cpu/padded"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import tdiag
from tdiag.bench import columns, measure_all, other_inputs, sizes_for, write_rows
from tdiag.plan.forms import FORMS, only_forms

ROOT = Path(__file__).resolve().parent.parent


def pair(path: Path, n: int, causal: bool, form: str, args: argparse.Namespace):
    """The modules planned without and with `form` and the design, or None for the modules where
    the plan with every form does not take `form` (or the design's N is not free)."""
    sizes = sizes_for(str(path), args.width, args.heads)
    every = [f.name for f in FORMS]
    designs = []
    for names in ([name for name in every if name != form], every):
        with only_forms(*names):  # a design of its own each: a design caches its plans by size
            design = tdiag.load(str(path), **sizes)
            designs.append((names, design.with_causal_mask() if causal else design))
    with_form = designs[1][1]
    if "N" not in with_form.graph.sizes or not with_form.graph.sizes["N"].is_free:
        return None, with_form
    with only_forms(*every):
        if form not in [c.taken for c in with_form.plan(N=n, B=1).choices]:
            return None, with_form
    modules = []
    for names, design in designs:
        with only_forms(*names):
            modules.append(design.module(N=n, B=1))  # planned at the batch timed
    modules[1].load_state_dict(modules[0].state_dict())
    return modules, with_form


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--form", required=True, choices=[f.name for f in FORMS])
    parser.add_argument("designs", nargs="*", help="bundled design names (default: all)")
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--masks", nargs="+", choices=("plain", "causal"), default=["plain", "causal"])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--list", action="store_true", help="only list the cases that take the form")
    parser.add_argument("--out", default="out/bench-form")
    args = parser.parse_args()
    torch.set_num_threads(1)
    paths = [ROOT / "designs" / f"{d}.td" for d in args.designs] or sorted((ROOT / "designs").glob("*.td"))
    rows = []
    for path in paths:
        for mask in args.masks:
            for n in args.n:
                modules, design = pair(path, n, mask == "causal", args.form, args)
                if modules is None:
                    continue
                print(f"{path.stem:<24} {mask:<6} N={n:<5} takes " + args.form, flush=True)
                if args.list:
                    continue
                torch.manual_seed(0)
                x = torch.randn(1, n, args.width)
                others = other_inputs(design, 1, n, "cpu")
                with torch.no_grad():
                    a, b = (m(x, **others) for m in modules)
                torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-4 * a.abs().max().item())
                without, with_ = measure_all(modules, x, False, args.repeat, others)
                row = {"design": path.stem, "mask": mask, "n": n}
                row |= columns(f"without {args.form}", without, with_, f"with {args.form}")
                row |= columns(f"with {args.form}", with_, with_, f"with {args.form}")
                rows.append(row)
                key = f"without {args.form} / with {args.form}"
                print(
                    f"  without {row[f'without {args.form} ms']:.1f} ms, with {row[f'with {args.form} ms']:.1f} ms:"
                    f" without / with {row[key]:.2f} ({row[key + ' min']:.2f}-{row[key + ' max']:.2f});"
                    f" kept {row[f'without {args.form} kept MB']:.1f} / {row[f'with {args.form} kept MB']:.1f} MB",
                    flush=True,
                )
    if args.list or not rows:
        return
    write_rows(rows, args.out, "form", vars(args))


if __name__ == "__main__":
    main()
