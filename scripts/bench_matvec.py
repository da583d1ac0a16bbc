"""Matrix-vector products through codegen's `_matvec` against the plain `a @ v` it replaced: for
each design whose plan multiplies a score tensor by one value per head (Tuformer's head-only,
Kronecker and skip cores: heads of width 1), time forward + backward of the module as compiled
now and of the same plan printed with `a @ v`, modelled and priced as before (`Matmul.matvec`
patched off, which codegen, the footprint and the time model all read), round-robin in one
process (one thread, batch 1, planned for it, F = 256, H = 4, the two given one set of weights
and checked equal first), and print before / after per round (median, min–max) with the bytes
each keeps for backward.

    OMP_NUM_THREADS=1 python scripts/bench_matvec.py --n 1024 4096 --repeat 5 --out docs/results/bench-cpu/matvec"""

from __future__ import annotations

import argparse
import contextlib
from collections.abc import Iterator
from pathlib import Path
from unittest import mock

import torch

import tdiag
from tdiag.bench import columns, measure_all, sizes_for, write_rows
from tdiag.plan.program import Matmul

ROOT = Path(__file__).resolve().parent.parent
DESIGNS = (
    "based",
    "cosformer",
    "lfish",
    "mlk",
    "mlstm",
    "performer",
    "single_head",
    "skip_right",
    "smlk",
    "thsa_elu",
    "trainable_heads_only",
    "kronecker",
    "skip_left",
    "thsa",
    "thsa_poly",
)  # the bundled designs whose plans at N = 1024 (F = 256, H = 4) have a matrix-vector product


@contextlib.contextmanager
def as_before() -> Iterator[None]:
    """Plans priced and printed as before `_matvec`: every matmul a plain `a @ b`."""
    with mock.patch.object(Matmul, "matvec", property(lambda op: False)):
        yield


def modules(stem: str, n: int, causal: bool, args: argparse.Namespace) -> list[torch.nn.Module] | None:
    sizes = sizes_for(str(ROOT / "designs" / f"{stem}.td"), args.width, args.heads)
    built = []
    for before in (True, False):
        with as_before() if before else contextlib.nullcontext():
            design = tdiag.load(str(ROOT / "designs" / f"{stem}.td"), **sizes)
            design = design.with_causal_mask() if causal else design
            built.append((design.source(N=n, B=1), design.module(N=n, B=1)))  # planned at the batch timed
    (_, old), (new_source, new) = built
    if "_matvec(" not in new_source:
        return None
    new.load_state_dict(old.state_dict())
    x = torch.randn(1, n, args.width)
    with torch.no_grad():
        expected = old(x)
        torch.testing.assert_close(new(x), expected, rtol=1e-4, atol=1e-4 * expected.abs().max().item())
    return [old, new]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("designs", nargs="*", default=list(DESIGNS))
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--masks", nargs="+", choices=("plain", "causal"), default=["plain", "causal"])
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default="out/bench-matvec")
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for stem in args.designs:
        for mask in args.masks:
            for n in args.n:
                torch.manual_seed(0)
                built = modules(stem, n, mask == "causal", args)
                if built is None:
                    print(f"{stem:<22} {mask:<6} N={n:<5} no matrix-vector product", flush=True)
                    continue
                before, after = measure_all(built, torch.randn(1, n, args.width), False, args.repeat)
                row = {"design": stem, "mask": mask, "n": n}
                row |= columns("before", before, after, "after") | columns("after", after, after, "after")
                rows.append(row)
                print(
                    f"{stem:<22} {mask:<6} N={n:<5} before {row['before ms']:.1f} ms, after {row['after ms']:.1f} ms:"
                    f" before / after {row['before / after']:.2f}"
                    f" ({row['before / after min']:.2f}-{row['before / after max']:.2f});"
                    f" kept {row['before kept MB']:.1f} / {row['after kept MB']:.1f} MB",
                    flush=True,
                )
    if not rows:
        return
    write_rows(rows, args.out, "matvec", vars(args))


if __name__ == "__main__":
    main()
