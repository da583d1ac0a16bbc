"""Subnormal floats on the CPU: each design's compiled module (the default plan, planned at the
batch it is timed at) timed forward + backward with the CPU's flush-to-zero off (torch's default)
and on (`torch.set_flush_denormal(True)`), round-robin in one process (one thread, batch 1,
F = 256, H = 4), and printed side by side: off / on per round (median, min–max).

A score or decay below 2^-126 (exp of less than about -87) is subnormal in float32; x86 cores
multiply and add subnormals tens of times slower than normal numbers, so a softmax box whose
scores spread that far (ALiBi's slope times a distance, a Gaussian kernel) and an exponential
decay over many positions (RetNet, Lightning, GLA, Mamba-2) run their matmuls on them at a
fraction of the peak. Flushing changes no value above 2^-126.

    OMP_NUM_THREADS=1 python scripts/bench_denormals.py --n 512 2048 --repeat 5 \\
        --out docs/results/bench-cpu/denormals"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

import tdiag  # noqa: E402
from tdiag.bench import Timing, _sizes_for, columns, write_rows  # noqa: E402
from tdiag.measure import time_step  # noqa: E402

DESIGNS = (
    "mhsa",
    "alibi",
    "relative_bias",
    "t5",
    "mgk",
    "smgk",
    "fish",
    "retnet",
    "lightning",
    "gla",
    "mamba2_ssd",
    "forgetting_attention",
    "stick_breaking",
)


def module(stem: str, n: int, causal: bool, args: argparse.Namespace) -> torch.nn.Module:
    file = str(ROOT / "designs" / f"{stem}.td")
    design = tdiag.load(file, **_sizes_for(file, args.width, args.heads))
    design = design.with_causal_mask() if causal else design
    lengths = {k: n for k, size in design.graph.sizes.items() if size.is_free} | {"B": 1}
    return design.module(lengths)


def measure(m: torch.nn.Module, x: torch.Tensor, repeat: int) -> tuple[Timing, Timing]:
    """Rounds alternating which setting runs first; the setting is restored to off after."""
    for flush in (False, True):
        torch.set_flush_denormal(flush)
        time_step(m, x, repeats=0, warmup=2)
    times: dict[bool, list[float]] = {False: [], True: []}
    try:
        for r in range(repeat):
            for flush in (r % 2 == 1, r % 2 == 0):
                torch.set_flush_denormal(flush)
                times[flush] += time_step(m, x, repeats=1, warmup=0)
    finally:
        torch.set_flush_denormal(False)
    return Timing(times[False], 0, None), Timing(times[True], 0, None)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("designs", nargs="*", default=list(DESIGNS))
    parser.add_argument("--n", type=int, nargs="+", default=[512, 1024])
    parser.add_argument("--masks", nargs="+", choices=("plain", "causal"), default=["plain", "causal"])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="out/bench-denormals")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if not torch.set_flush_denormal(True):
        sys.exit("this CPU has no flush-to-zero mode (torch.set_flush_denormal returned False)")
    torch.set_flush_denormal(False)
    rows = []
    for stem in args.designs:
        for mask in args.masks:
            for n in args.n:
                torch.manual_seed(0)
                m = module(stem, n, mask == "causal", args)
                off, on = measure(m, torch.randn(1, n, args.width), args.repeat)
                row = {"design": stem, "mask": mask, "n": n}
                row |= columns("off", off, on, "on") | columns("on", on, on, "on")
                row = {k: v for k, v in row.items() if "kept" not in k}
                rows.append(row)
                print(
                    f"{stem:<22} {mask:<6} N={n:<5} off {row['off ms']:.1f} ms, on {row['on ms']:.1f} ms:"
                    f" off / on {row['off / on']:.2f} ({row['off / on min']:.2f}-{row['off / on max']:.2f})",
                    flush=True,
                )
    write_rows(rows, args.out, "denormals", vars(args))


if __name__ == "__main__":
    main()
