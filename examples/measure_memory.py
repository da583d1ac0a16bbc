"""How far the cost model's peak memory is from what autograd really keeps: for every design,
plain and causal, at a few sequence lengths, the bytes saved for backward (tdiag.measure, without
parameters and input) against the cost report's saved bytes for the batch (plan/footprint.py).
The goal of the cost model is a ratio within 10% of 1 everywhere.

    python examples/measure_memory.py --out out/measure_memory.csv
    python examples/measure_memory.py designs/fish.td --n 128 --breakdown   # which op saves what
"""

from __future__ import annotations

import argparse
import csv
import glob
from dataclasses import asdict, dataclass
from pathlib import Path

import torch

import tdiag
from tdiag.design import OBJECTIVES
from tdiag.measure import saved_for_backward

DESIGNS = Path(__file__).resolve().parent.parent / "designs"


@dataclass
class Row:
    design: str
    mode: str  # plain or causal
    n: int
    batch: int
    saved_bytes: int  # measured: autograd's saved storages
    saved_elements: float  # saved_bytes / 4 (float32; a bool mask counts a quarter per entry)
    model_elements: int  # the cost report's saved bytes for the batch / 4
    ratio: float  # model / measured


def design_at(path: str, n: int, width: int, heads: int, causal: bool) -> tdiag.Design:
    """The design with F, H (and N where the design fixes it) set, for the sizes it declares."""
    declared = tdiag.load(path).graph.sizes
    wanted = {"F": width, "H": heads, "N": n}
    sizes = {k: v for k, v in wanted.items() if k in declared and not declared[k].is_free}
    design = tdiag.load(path, **sizes)
    return design.with_causal_mask() if causal else design


def measure(design: tdiag.Design, n: int, batch: int, objective: str) -> tuple[int, int, str]:
    """Measured saved bytes, the model's peak elements for the batch, and the breakdown table."""
    module = design.module(seed=0, N=n, objective=objective)
    torch.manual_seed(0)
    inputs = [
        torch.randn(batch, *(int(design.graph.evaluate(a.size, N=n)) for a in x.axes)) for x in design.graph.inputs
    ]
    saved = saved_for_backward(module, *inputs)
    model = design.cost(objective=objective, N=n).saved_bytes_at(N=n, B=batch) // 4
    return saved.total_bytes, model, saved.table()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("designs", nargs="*", metavar="FILE.td", help="default: designs/*.td")
    parser.add_argument("--n", type=int, nargs="+", default=[64, 128], help="sequence lengths")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--width", type=int, default=64, help="F, where the design has it")
    parser.add_argument("--heads", type=int, default=4, help="H, where the design has it")
    parser.add_argument("--objective", choices=OBJECTIVES, default="flops")
    parser.add_argument("--breakdown", action="store_true", help="print each design's saved-tensor table")
    parser.add_argument("--out", help="write the table as CSV here")
    args = parser.parse_args(argv)
    files = args.designs or sorted(glob.glob(str(DESIGNS / "*.td")))
    rows: list[Row] = []
    header = f"{'design':<22} {'mode':<7} {'N':>5} {'measured/4':>12} {'model x B':>12} {'model/meas':>10}"
    print(header)
    for file in files:
        for causal in (False, True):
            mode = "causal" if causal else "plain"
            for n in args.n:
                try:
                    design = design_at(file, n, args.width, args.heads, causal)
                except tdiag.TdiagError as error:
                    print(f"{Path(file).stem:<22} {mode:<7} skipped: {str(error).splitlines()[0]}")
                    break
                saved, model, breakdown = measure(design, n, args.batch, args.objective)
                row = Row(design.name, mode, n, args.batch, saved, saved / 4, model, model / (saved / 4))
                rows.append(row)
                print(
                    f"{row.design:<22} {mode:<7} {n:>5} {row.saved_elements:>12,.0f} {model:>12,} {row.ratio:>10.3f}",
                    flush=True,
                )
                if args.breakdown:
                    print("    " + breakdown.replace("\n", "\n    "))
    if args.out and rows:
        out = Path(args.out)
        out.parent.mkdir(parents=True, exist_ok=True)
        with out.open("w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(asdict(rows[0])))
            writer.writeheader()
            writer.writerows(asdict(r) for r in rows)
        print(f"wrote {out}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
