"""The footprint model against autograd at training lengths: for every bundled design, plain and
causal, at each N, the bytes the plan's report says a training step keeps for backward
(tdiag/plan/footprint.py) next to the bytes autograd keeps in one forward pass
(tdiag.measure.saved_for_backward, saved_tensors_hooks). Prints a table as it goes and writes
CSV and JSON.

    TDIAG_DEVICE_PEAK_FLOPS=1e11 TDIAG_DEVICE_BANDWIDTH=1e10 TDIAG_DEVICE_OVERHEAD=5e-6 \\
        python scripts/footprint_sweep.py --n 256,1024,4096 --out docs/results/bench-cpu/memory

The time objective's plan depends on the planning device: set the TDIAG_DEVICE_* figures (above:
the nominal CPU) for plans that do not depend on the machine. A case whose modelled peak would not
fit in `--limit-gb` is skipped and listed as such (never measured)."""

from __future__ import annotations

import argparse
import csv
import gc
import json
import os
import sys
import time
from dataclasses import asdict, dataclass
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SIZES = {"F": 256, "H": 4}
MAX_LENGTH = {"absolute_bias": "L"}  # a table over positions: its length is raised to N where shorter


@dataclass
class Case:
    """One design, mask and length: the modelled and measured bytes kept for backward."""

    design: str
    causal: bool
    n: int
    modelled: int | None
    measured: int | None
    seconds: float
    note: str = ""

    @property
    def ratio(self) -> float | None:
        return self.modelled / self.measured if self.modelled and self.measured else None


def load(path: Path, causal: bool, sizes: dict[str, int]):
    """The design at `sizes` (only those it declares and fixes), with a causal mask if asked, and
    without its own masks (graph/absent_masks.py): the sweep calls the module with the inputs only,
    so the body that runs is the one planned without them."""
    import tdiag
    from tdiag.graph.absent_masks import without_masks

    declared = tdiag.load(path).graph.sizes
    design = tdiag.load(path, **{k: v for k, v in sizes.items() if k in declared and not declared[k].is_free})
    design = design.with_causal_mask() if causal else design
    unmasked = without_masks(design.graph)
    return design if unmasked is None else tdiag.Design(unmasked, design.warnings)


def lengths_of(design, n: int) -> dict[str, int]:
    """Every run-time length at n (a cross-attention's memory length too)."""
    return {"N": n} | {k: n for k, size in design.graph.sizes.items() if size.is_free}


def planned(design, n: int, plan_batch: int | None) -> dict[str, int]:
    """The sizes a plan is made for: every length at n, and B where given (else the planner's
    default batch, as `tdiag plan` and `python -m tdiag.measure` plan)."""
    return lengths_of(design, n) | ({"B": plan_batch} if plan_batch else {})


def modelled_bytes(design, n: int, batch: int, objective: str, plan_batch: int | None = None) -> int:
    """The report's bytes kept for backward when the plan runs on a batch of `batch`."""
    lengths = lengths_of(design, n)
    return design.cost(objective=objective, **planned(design, n, plan_batch)).saved_bytes_at(B=batch, **lengths)


def measured_bytes(design, n: int, batch: int, objective: str, plan_batch: int | None = None) -> int:
    """Bytes autograd keeps after one forward pass of the compiled module on random inputs (with
    tdiag.measure's input convention)."""
    import torch

    from tdiag.measure import saved_for_backward

    lengths = lengths_of(design, n)
    module = design.module(seed=0, objective=objective, **planned(design, n, plan_batch))
    torch.manual_seed(0)
    inputs = [
        torch.randn(batch, *(int(design.graph.evaluate(a.size, **lengths)) for a in x.axes))
        for x in design.graph.inputs
    ]
    return saved_for_backward(module, *inputs).total_bytes


def run_case(
    path: Path, causal: bool, n: int, batch: int, objective: str, limit: float, plan_batch: int | None
) -> Case:
    start = time.perf_counter()
    design = load(path, causal, SIZES | {"N": n})  # N too, where a design fixes it (mgk_softe)
    if path.stem in MAX_LENGTH and design.size_values[MAX_LENGTH[path.stem]] < n:
        design = load(path, causal, SIZES | {"N": n, MAX_LENGTH[path.stem]: n})
    modelled = modelled_bytes(design, n, batch, objective, plan_batch)
    if modelled > limit:
        return Case(path.stem, causal, n, modelled, None, 0.0, f"skipped: model keeps {modelled / 1e9:.1f} GB")
    measured = measured_bytes(design, n, batch, objective, plan_batch)
    gc.collect()
    return Case(path.stem, causal, n, modelled, measured, time.perf_counter() - start)


HEADER = f"{'design':<24}{'mask':<8}{'N':>6}{'model MB':>12}{'measured MB':>13}{'ratio':>8}{'s':>7}"


def line(case: Case) -> str:
    """The case as a row under HEADER."""
    ratio = f"{case.ratio:.3f}" if case.ratio else "-"
    model = f"{case.modelled / 1e6:.2f}" if case.modelled else "-"
    measured = f"{case.measured / 1e6:.2f}" if case.measured else "-"
    mask = "causal" if case.causal else "plain"
    return f"{case.design:<24}{mask:<8}{case.n:>6}{model:>12}{measured:>13}{ratio:>8}{case.seconds:>7.1f} {case.note}"


def write(cases: list[Case], out: Path, meta: dict[str, object]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    rows = [asdict(c) | {"ratio": c.ratio} for c in cases]
    with open(out / "footprint.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "footprint.json").write_text(json.dumps({"meta": meta, "cases": rows}, indent=1) + "\n")


def main(argv: list[str] | None = None) -> int:
    import torch

    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("designs", nargs="*", help="design names (default: every bundled design)")
    parser.add_argument("--n", default="256,1024,4096", help="lengths, comma-separated")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--plan-batch", type=int, help="the batch planned for (default: the planner's, 8)")
    parser.add_argument("--objective", default="time")
    parser.add_argument("--mask", choices=["plain", "causal", "both"], default="both")
    parser.add_argument("--limit-gb", type=float, default=4.0, help="skip cases the model says keep more")
    parser.add_argument("--out", type=Path, help="folder for footprint.csv and footprint.json")
    args = parser.parse_args(argv)
    paths = sorted((ROOT / "designs").glob("*.td"))
    if args.designs:
        paths = [p for p in paths if p.stem in args.designs]
    masks = {"plain": [False], "causal": [True], "both": [False, True]}[args.mask]
    cases: list[Case] = []
    print(HEADER, flush=True)
    for n in (int(n) for n in args.n.split(",")):
        for path in paths:
            for causal in masks:
                try:
                    case = run_case(path, causal, n, args.batch, args.objective, args.limit_gb * 1e9, args.plan_batch)
                except (MemoryError, RuntimeError, ValueError) as error:
                    case = Case(path.stem, causal, n, None, None, 0.0, f"failed: {type(error).__name__}: {error}"[:200])
                cases.append(case)
                print(line(case), flush=True)
    off = [c for c in cases if c.ratio is not None and abs(c.ratio - 1) > 0.1]
    print(f"{len(cases)} cases, {len(off)} off by more than 10%, {sum(c.ratio is None for c in cases)} not measured")
    if args.out:
        device = {k: v for k, v in os.environ.items() if k.startswith("TDIAG_DEVICE")}
        meta = {"command": " ".join(sys.argv), "sizes": SIZES, "torch": torch.__version__, "device": device}
        write(cases, args.out, meta | {k: getattr(args, k) for k in ("batch", "plan_batch", "objective", "limit_gb")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
