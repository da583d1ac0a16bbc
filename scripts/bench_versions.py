"""Two versions of tdiag's generated modules timed side by side: `write` has a checkout (ROOT, its
own tdiag and design files) write `design.source()` of each case as OUT/NAME.MASK.N.py (F = 256,
H = 4 where the design has them, planned at N, batch 1 and one thread); `time` loads OLD/... and NEW/...,
gives them one set of weights, checks them equal, and times forward + backward round-robin in one
process (one thread, batch 1), printing new / old per round (median, min–max) and the bytes each
keeps for backward. A case is NAME:MASK:N (MASK plain or causal).

    git worktree add /tmp/old HEAD~1
    python scripts/bench_versions.py write /tmp/old out/versions/old mgk_harde:causal:1024
    python scripts/bench_versions.py write . out/versions/new mgk_harde:causal:1024
    OMP_NUM_THREADS=1 python scripts/bench_versions.py time --old out/versions/old --new out/versions/new \\
        --repeat 5 mgk_harde:causal:1024"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

WRITER = """
import sys
root, out = sys.argv[1], sys.argv[2]
sys.path.insert(0, root)
import tdiag
from tdiag.bench import _sizes_for
for case in sys.argv[3:]:
    name, mask, n = case.split(":")
    file = f"{root}/designs/{name}.td"
    design = tdiag.load(file, **_sizes_for(file, 256, 4))
    design = design.with_causal_mask() if mask == "causal" else design
    lengths = {k: int(n) for k, size in design.graph.sizes.items() if size.is_free} | {"B": 1}
    open(f"{out}/{name}.{mask}.{n}.py", "w").write(design.source(lengths))
"""


def time_cases(args: argparse.Namespace) -> None:
    import torch

    sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
    from tdiag.bench import columns, measure_all, module_from_file

    torch.set_num_threads(1)
    for case in args.cases:
        name, mask, n = case.split(":")
        stem = f"{name}.{mask}.{n}"
        paths = [Path(folder) / f"{stem}.py" for folder in (args.old, args.new)]
        old, new = (module_from_file(path, f"version_{k}_{stem.replace('.', '_')}") for k, path in enumerate(paths))
        new.load_state_dict(old.state_dict())
        x = torch.randn(1, int(n), 256)
        with torch.no_grad():
            torch.testing.assert_close(new(x), old(x), rtol=1e-4, atol=1e-5)
        before, after = measure_all([old, new], x, False, args.repeat)
        row = columns("old", before, before, "old") | columns("new", after, before, "old")
        print(
            f"{name:<10} {mask:<6} N={n:<5} old {row['old ms']:8.1f} ms  new {row['new ms']:8.1f} ms"
            f"  new/old {row['new / old']:.2f} ({row['new / old min']:.2f}-{row['new / old max']:.2f})"
            f"  kept {row['old kept MB']:.1f} / {row['new kept MB']:.1f} MB",
            flush=True,
        )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    commands = parser.add_subparsers(dest="command", required=True)
    write = commands.add_parser("write", help="generate the cases' modules with the checkout ROOT")
    write.add_argument("root")
    write.add_argument("out")
    write.add_argument("cases", nargs="+")
    timed = commands.add_parser("time", help="time OLD's modules against NEW's")
    timed.add_argument("--old", required=True)
    timed.add_argument("--new", required=True)
    timed.add_argument("--repeat", type=int, default=5)
    timed.add_argument("cases", nargs="+")
    args = parser.parse_args()
    if args.command == "write":
        Path(args.out).mkdir(parents=True, exist_ok=True)
        root = str(Path(args.root).resolve())
        out = str(Path(args.out).resolve())
        threads = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}  # planned for the one thread timed
        subprocess.run(
            [sys.executable, "-c", WRITER, root, out, *args.cases], check=True, cwd="/", env=os.environ | threads
        )
    else:
        time_cases(args)


if __name__ == "__main__":
    main()
