"""The planner's goldens: for every bundled design x objective (time, flops, memory) x {plain,
causal}, the hash of the standalone module `tdiag compile` writes (its call-mask bodies
included), the plan's box choices (every candidate's cost or refusal, the form taken), its
rewrites taken and refused, and the cost report's formulas. A refactor of the compiler that
claims to keep behaviour keeps this file unchanged (`make goldens-check`).

Plans are made for the nominal CPU, with no measured device file, so the goldens do not depend on
the machine or on a measurement made earlier (as tests/conftest.py plans for the suite). Designs
made alike share their plans (tdiag/shared_plans.py, as in the suite): a design's causal variant is
the one its compiled module plans for `is_causal`, planned once.

    python scripts/goldens.py record                 # writes tests/goldens/plans.json
    python scripts/goldens.py check                  # exit 1 and the differing entries if any
    python scripts/goldens.py check --designs mhsa gla
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
GOLDENS = ROOT / "tests" / "goldens" / "plans.json"
OBJECTIVES = ("time", "flops", "memory")


def nominal_device() -> None:
    """Plan for the nominal CPU's figures with an empty device cache (tdiag/device.py)."""
    from tdiag import device

    os.environ["XDG_CACHE_HOME"] = tempfile.mkdtemp(prefix="tdiag-goldens-")
    os.environ.pop(device.DEVICE_ENV, None)
    nominal = device.NOMINAL_CPU
    os.environ[device.PEAK_FLOPS_ENV] = repr(nominal.peak_flops)
    os.environ[device.BANDWIDTH_ENV] = repr(nominal.bandwidth)
    os.environ[device.OVERHEAD_ENV] = repr(nominal.overhead)


def choice_record(choice) -> dict:
    """One box's decision as plain data: each candidate's cost (or refusal) and the form taken."""
    candidates = [
        {
            "form": c.form,
            "cost": None if c.cost is None else [repr(c.cost.time), repr(c.cost.kept), c.cost.flops],
            "refusal": c.refusal,
        }
        for c in choice.candidates
    ]
    return {"site": choice.site, "taken": choice.taken, "rule": choice.rule, "candidates": candidates}


def plan_record(design, objective: str) -> dict:
    """The golden entry of one design planned for one objective at its default sizes."""
    from tdiag.cost import cost_report

    plan = design.plan(objective=objective)
    source = design.source(objective=objective)
    report = cost_report(plan, "flop")
    return {
        "source_sha256": hashlib.sha256(source.encode()).hexdigest(),
        "source_lines": source.count("\n"),
        "choices": [choice_record(c) for c in plan.choices],
        "lowered": list(plan.lowered),
        "refused": list(plan.refused),
        "cost": {name: str(formula) for name, formula in report.formulas().items()},
    }


def causal_variant(design):
    """The design with its causal mask, or None where it has no query and key legs to mask."""
    from tdiag import TdiagError

    try:
        return design.with_causal_mask()
    except TdiagError:
        return None


def entry(name: str) -> dict:
    """Every golden record of one bundled design: objective x {plain, causal}, or the error."""
    import tdiag

    design = tdiag.load(name)
    out: dict = {}
    for kind, variant in (("plain", design), ("causal", causal_variant(design))):
        for objective in OBJECTIVES:
            key = f"{kind}/{objective}"
            if variant is None:
                out[key] = {"error": "no causal mask"}
                continue
            try:
                out[key] = plan_record(variant, objective)
            except Exception as error:  # a design that does not plan is a golden too
                out[key] = {"error": f"{type(error).__name__}: {error}"[:300]}
    return out


def differences(old: dict, new: dict, prefix: str = "") -> list[str]:
    """Paths at which two golden records differ."""
    if isinstance(old, dict) and isinstance(new, dict):
        found = []
        for key in sorted(set(old) | set(new)):
            found += differences(old.get(key), new.get(key), f"{prefix}/{key}" if prefix else key)
        return found
    return [] if old == new else [prefix]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0], allow_abbrev=False)
    parser.add_argument("action", choices=("record", "check"))
    parser.add_argument("--designs", nargs="*", help="bundled design names (default: all)")
    parser.add_argument("--file", type=Path, default=GOLDENS)
    args = parser.parse_args(argv)

    nominal_device()
    sys.path.insert(0, str(ROOT))
    from tdiag.resources import bundled_designs
    from tdiag.shared_plans import sharing

    names = args.designs or bundled_designs()
    started, cpu = time.perf_counter(), time.process_time()
    records = {}
    with sharing():
        for i, name in enumerate(names, 1):
            records[name] = entry(name)
            print(f"[{i}/{len(names)}] {name} ({time.perf_counter() - started:.0f} s)", file=sys.stderr, flush=True)
    print(f"planned in {time.perf_counter() - started:.0f} s ({time.process_time() - cpu:.0f} s CPU)", file=sys.stderr)

    if args.action == "record":
        kept = json.loads(args.file.read_text()) if args.file.exists() and args.designs else {}
        kept.update(records)
        args.file.parent.mkdir(parents=True, exist_ok=True)
        args.file.write_text(json.dumps(dict(sorted(kept.items())), indent=1, sort_keys=True) + "\n")
        print(f"wrote {args.file}: {len(kept)} designs")
        return 0

    golden = json.loads(args.file.read_text())
    changed = [path for name in names for path in differences(golden.get(name), records[name], name)]
    for path in changed:
        print(f"differs: {path}")
    print(f"{len(names)} designs, {len(changed)} differing entries")
    return 1 if changed else 0


if __name__ == "__main__":
    raise SystemExit(main())
