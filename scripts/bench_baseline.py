"""The issue's "no slower than the pre-redesign plan", as one command (`make bench-baseline`):
compile every bundled design with tdiag as it was at an older commit into standalone files,
then time them next to today's plans with `tdiag bench --baseline`, plain and causal.

    python scripts/bench_baseline.py 40fcdb1 --baseline out/baseline --out out/bench-baseline
    python scripts/bench_baseline.py 40fcdb1 --baseline out/baseline --out out/b --repeat 2 \
        --designs mhsa hard_gfish          # a quick check on a few designs

Step 1 checks the commit out with `git archive` into a temporary folder and runs *that* tree's
`tdiag compile` (its own planner, its own design files) as `BASELINE/NAME.py` and
`BASELINE/NAME.causal.py`, with the sizes `tdiag bench` builds today's modules with (F and H
where the design has them, planned for N = --n). A design the old commit does not have gets no
baseline file; `tdiag bench` then times it without one. Step 2 runs
`tdiag bench DESIGNS --objective time,flops --baseline BASELINE` into OUT/plain and OUT/causal
(bench.json, bench.csv, bench.png each). `--skip-compile` reuses the files already in BASELINE.
"""

from __future__ import annotations

import argparse
import io
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tdiag  # noqa: E402  (the checkout's tdiag, not an installed one)


def bench_sizes(design_file: Path, width: int, heads: int) -> dict[str, int]:
    """The sizes `tdiag bench` sets on a design (tdiag/bench.py `_sizes_for`): F and H where
    the design declares them with a value, so the old and new modules have equal shapes."""
    graph = tdiag.load(str(design_file)).graph
    wanted = {"F": width, "H": heads}
    return {k: v for k, v in wanted.items() if k in graph.sizes and not graph.sizes[k].is_free}


def export_commit(commit: str, folder: Path) -> None:
    """The commit's tracked files, without touching the repository's worktrees."""
    archive = subprocess.run(["git", "-C", str(ROOT), "archive", commit], check=True, capture_output=True).stdout
    with tarfile.open(fileobj=io.BytesIO(archive)) as tar:
        tar.extractall(folder, filter="data")


def compile_baseline(old_tree: Path, names: list[str], out: Path, args: argparse.Namespace) -> list[str]:
    """Run the old tree's `tdiag compile` for each design it has, plain and causal; return the
    names it compiled. The old package shadows the installed one through PYTHONPATH."""
    out.mkdir(parents=True, exist_ok=True)
    env = os.environ | {"PYTHONPATH": str(old_tree)}
    compiled = []
    for name in names:
        old_file = old_tree / "designs" / f"{name}.td"
        if not old_file.is_file():
            print(f"  {name}: not in {args.commit}; no baseline")
            continue
        sets = [
            arg
            for k, v in bench_sizes(ROOT / "designs" / f"{name}.td", args.width, args.heads).items()
            for arg in ("--set", f"{k}={v}")
        ]
        for causal in (False, True):
            target = out / f"{name}{'.causal' if causal else ''}.py"
            command = [sys.executable, "-m", "tdiag", "compile", str(old_file), "-o", str(target), *sets]
            command += ["--plan-n", str(args.n)] + (["--causal"] if causal else [])
            result = subprocess.run(command, cwd=old_tree, env=env, capture_output=True, text=True)
            if result.returncode != 0:
                sys.exit(f"{name}: the old compile failed:\n{result.stdout}{result.stderr}")
        compiled.append(name)
        print(f"  {name}: {out / name}.py, {out / name}.causal.py")
    return compiled


def run_bench(names: list[str], args: argparse.Namespace) -> None:
    files = [str(ROOT / "designs" / f"{name}.td") for name in names]
    for causal in (False, True):
        folder = Path(args.out) / ("causal" if causal else "plain")
        command = [sys.executable, "-m", "tdiag", "bench", *files, "--objective", args.objective]
        command += ["--baseline", str(args.baseline), "--out", str(folder), "--repeat", str(args.repeat)]
        command += ["--n", str(args.n), "--width", str(args.width), "--heads", str(args.heads)]
        command += ["--causal"] if causal else []
        print("$", " ".join(command), flush=True)
        subprocess.run(command, cwd=ROOT, env=os.environ | {"PYTHONPATH": str(ROOT)}, check=True)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("commit", help="the commit whose plans are the baseline, e.g. 40fcdb1")
    parser.add_argument("--baseline", required=True, help="folder for the old standalone files NAME[.causal].py")
    parser.add_argument("--out", required=True, help="folder for plain/ and causal/ bench results")
    parser.add_argument("--designs", nargs="+", help="design names (default: every designs/*.td)")
    parser.add_argument("--repeat", type=int, default=10)
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--objective", default="time,flops", help="the first (the default plan) is what ratios are to")
    parser.add_argument("--skip-compile", action="store_true", help="reuse the files already in --baseline")
    parser.add_argument("--compile-only", action="store_true", help="write the baseline files and stop")
    args = parser.parse_args(argv)
    names = args.designs or sorted(p.stem for p in (ROOT / "designs").glob("*.td"))
    if not args.skip_compile:
        with tempfile.TemporaryDirectory(prefix="tdiag-baseline-") as temporary:
            export_commit(args.commit, Path(temporary))
            compile_baseline(Path(temporary), names, Path(args.baseline).resolve(), args)
    if not args.compile_only:
        run_bench(names, args)


if __name__ == "__main__":
    main()
