"""Decoding with a cache against re-running the prefix (issue 25, tdiag/decode.py): a compiled
causal module given a prompt of P positions, then G new positions one at a time, either with
`module(x, cache=cache)` or by re-running the module over the whole sequence so far and keeping
its last row. Round-robin in one process (the two ways alternate within each round, order
swapped every round); each round's time ratio re-run / cache, printed as the median and min–max
beside the medians. Both ways are checked to give the same outputs first (float32, 1e-4).

    OMP_NUM_THREADS=1 python scripts/bench_decode.py --designs mhsa llama --prompt 256 --new 256 --repeat 5

With `--against old`, the per-token time of a cache of the design's kind against the kind it
has without its recurrent state (`decode_rule(graph, state=False)`: "kv", or "prefix", which
re-runs the module over the sequence so far): after the same prompt (not timed), `--new`
positions one at a time, each round's time divided by them; medians (min–max) over the rounds.

    OMP_NUM_THREADS=1 python scripts/bench_decode.py --against old --designs mlk gla --prompt 256 2048 --new 32
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


def tokens(module: torch.nn.Module, x: torch.Tensor, prompt: int, rule) -> tuple[float, torch.Tensor]:
    """Seconds per new position after the prompt (not timed), decoded one at a time by a cache
    of `rule` (None: the design's own), and the outputs."""
    cache = module.new_cache()
    if rule is not None:
        cache.rule = rule
    outputs = [module(x[:, :prompt], cache=cache)]
    start = time.perf_counter()
    outputs += [module(x[:, t : t + 1], cache=cache) for t in range(prompt, x.shape[1])]
    return (time.perf_counter() - start) / (x.shape[1] - prompt), torch.cat(outputs, 1)


def spread(values: list[float], scale: float = 1.0) -> str:
    ordered = sorted(values)
    return f"{scale * ordered[len(ordered) // 2]:.3f} ({scale * ordered[0]:.3f}-{scale * ordered[-1]:.3f})"


def against_old(args: argparse.Namespace) -> None:
    """Per-token time of the design's cache against its kind without the recurrent state."""
    from tdiag.decode import decode_rule

    print(f"F={args.width} H={args.heads}, batch 1, float32, {args.new} new positions one at a time after the prompt")
    for name in args.designs:
        design = tdiag.load(ROOT / "designs" / f"{name}.td", F=args.width, H=args.heads).with_causal_mask()
        for prompt in args.prompt:
            module = design.module(N=prompt + args.new)
            old = decode_rule(module.tdiag_plan.graph, state=False)
            x = torch.randn(1, prompt + args.new, args.width, generator=torch.Generator().manual_seed(0))
            with torch.no_grad():
                difference = (tokens(module, x, prompt, None)[1] - tokens(module, x, prompt, old)[1]).abs().max().item()
                assert difference < 1e-4, (name, prompt, difference)
                new_times, old_times = [], []
                for round_ in range(args.repeat):
                    ways = [(None, new_times), (old, old_times)]
                    for rule, times in ways if round_ % 2 == 0 else ways[::-1]:
                        times.append(tokens(module, x, prompt, rule)[0])
            ratios = [b / a for a, b in zip(new_times, old_times, strict=True)]
            print(
                f"{name:<6} prompt {prompt:5}  {module.new_cache().kind} {spread(new_times, 1e3)} ms/token"
                f"  {old.kind} {spread(old_times, 1e3)} ms/token"
                f"  {old.kind} / {module.new_cache().kind} {spread(ratios)}"
                f"  [max |difference| {difference:.1e}]",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--designs", nargs="+", default=["mhsa", "llama"])
    parser.add_argument("--width", type=int, default=64, help="F")
    parser.add_argument("--heads", type=int, default=4, help="H")
    parser.add_argument(
        "--prompt", type=int, nargs="+", default=[256], help="one length, or several with --against old"
    )
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--against", choices=["re-run", "old"], default="re-run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.against == "old":
        against_old(args)
        return
    args.prompt = args.prompt[0]
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
