"""Causal chunked linear attention against its plain form: for each bundled design that takes
the linear-time order with causal prefix sums, time fwd+bwd of the plain and the causal module
round-robin in one process (one thread, batch 1) and print causal / plain with its min–max over
rounds, and the bytes each keeps for backward. With --baseline DIR, also a causal module compiled
earlier (`DIR/N/STEM.causal.py` or `DIR/STEM.causal.py`, e.g. by `tdiag compile --causal` at main) in the same rounds.

    python scripts/bench_chunked.py --n 1024 4096 --repeat 7 [--baseline DIR]"""

from __future__ import annotations

import argparse
from pathlib import Path

import torch

import tdiag
from tdiag.bench import load_baseline, measure_all

DESIGNS = ("lfish", "mlk", "performer", "smlk", "thsa_elu")


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[1024, 4096])
    parser.add_argument("--designs", nargs="+", default=list(DESIGNS))
    parser.add_argument("--width", type=int, default=256)
    parser.add_argument("--heads", type=int, default=4)
    parser.add_argument("--repeat", type=int, default=7)
    parser.add_argument("--baseline", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    root = Path(tdiag.__file__).resolve().parent.parent / "designs"
    print(
        f"{'design':<10} {'N':>5} {'plain ms':>9} {'causal ms':>9} {'causal/plain (min-max)':>24}"
        f" {'plain kept':>11} {'causal kept':>11}" + ("  base/plain (min-max)   base kept" if args.baseline else "")
    )
    for stem in args.designs:
        design = tdiag.load(str(root / f"{stem}.td"), F=args.width, H=args.heads)
        for n in args.n:
            torch.manual_seed(0)
            plain = design.module(N=n)
            causal = design.with_causal_mask().module(N=n)
            modules = [plain, causal]
            if args.baseline:
                folder = Path(args.baseline) / str(n)
                old = load_baseline(folder if folder.is_dir() else Path(args.baseline), stem, True)
                old.load_state_dict(causal.state_dict())
                modules.append(old)
            x = torch.randn(1, n, args.width)
            timings = measure_all(modules, x, False, args.repeat)
            p = timings[0].seconds
            cells = []
            for t in timings[1:]:
                r = sorted(c / q for c, q in zip(t.seconds, p, strict=True))
                cells.append(f"{r[len(r) // 2]:6.2f} ({r[0]:.2f}-{r[-1]:.2f})")
            med = [sorted(t.seconds)[len(t.seconds) // 2] * 1e3 for t in timings]
            kept = [t.saved_bytes / 1e6 for t in timings]
            line = f"{stem:<10} {n:>5} {med[0]:9.1f} {med[1]:9.1f} {cells[0]:>24} {kept[0]:10.1f}M {kept[1]:10.1f}M"
            if args.baseline:
                line += f"  {cells[1]:>20} {kept[2]:10.1f}M"
            print(line, flush=True)


if __name__ == "__main__":
    main()
