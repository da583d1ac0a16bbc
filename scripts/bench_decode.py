"""Decoding with a cache against re-running the prefix (issue 25, tdiag/decode.py): a compiled
causal module given a prompt of P positions, then G new positions one at a time, either with
`module(x, cache=cache)` or by re-running the module over the whole sequence so far and keeping
its last row. Round-robin in one process (the two ways alternate within each round, order
swapped every round); each round's time ratio re-run / cache, printed as the median and min–max
beside the medians. Both ways are checked to give the same outputs first (float32, 1e-4).

    OMP_NUM_THREADS=1 python scripts/bench_decode.py --designs mhsa llama --prompt 256 --new 256 --repeat 5
"""

from __future__ import annotations

import argparse
import time
from pathlib import Path

import torch

import tdiag

ROOT = Path(__file__).resolve().parent.parent


def with_cache(module: torch.nn.Module, x: torch.Tensor, prompt: int) -> torch.Tensor:
    cache = module.new_cache()
    outputs = [module(x[:, :prompt], cache=cache)]
    outputs += [module(x[:, t : t + 1], cache=cache) for t in range(prompt, x.shape[1])]
    return torch.cat(outputs, 1)


def re_run(module: torch.nn.Module, x: torch.Tensor, prompt: int) -> torch.Tensor:
    outputs = [module(x[:, :prompt])]
    outputs += [module(x[:, : t + 1])[:, -1:] for t in range(prompt, x.shape[1])]
    return torch.cat(outputs, 1)


def timed(way, module: torch.nn.Module, x: torch.Tensor, prompt: int) -> float:
    start = time.perf_counter()
    way(module, x, prompt)
    return time.perf_counter() - start


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--designs", nargs="+", default=["mhsa", "llama"])
    parser.add_argument("--width", type=int, default=64, help="F")
    parser.add_argument("--heads", type=int, default=4, help="H")
    parser.add_argument("--prompt", type=int, default=256)
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    args = parser.parse_args()
    torch.set_num_threads(1)
    total = args.prompt + args.new
    print(
        f"F={args.width} H={args.heads}, batch 1, float32, prompt {args.prompt}, {args.new} new positions one at a time"
    )
    for name in args.designs:
        design = tdiag.load(ROOT / "designs" / f"{name}.td", F=args.width, H=args.heads).with_causal_mask()
        module = design.module(N=total)
        x = torch.randn(1, total, args.width, generator=torch.Generator().manual_seed(0))
        with torch.no_grad():
            difference = (with_cache(module, x, args.prompt) - re_run(module, x, args.prompt)).abs().max().item()
            assert difference < 1e-4, (name, difference)
            cached, rerun = [], []
            for round_ in range(args.repeat):
                ways = [(with_cache, cached), (re_run, rerun)]
                for way, times in ways if round_ % 2 == 0 else ways[::-1]:
                    times.append(timed(way, module, x, args.prompt))
        ratios = sorted(b / a for a, b in zip(cached, rerun, strict=True))
        print(
            f"{name:<6} cache {1e3 * sorted(cached)[len(cached) // 2]:8.1f} ms  "
            f"re-run {1e3 * sorted(rerun)[len(rerun) // 2]:8.1f} ms  "
            f"re-run / cache {ratios[len(ratios) // 2]:.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})  "
            f"[{module.new_cache().kind}; max |difference| {difference:.1e}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
