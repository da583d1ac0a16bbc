"""Decoding with a cache against re-running the prefix (issue 25, tdiag/decode.py,
tdiag/decode_step.py): a compiled causal module given a prompt of P positions, then G new
positions one at a time, three ways: the cache stepping by generated code (the compiled step,
`module(x, cache=cache)`), the cache stepping by the reference evaluator
(`DecodeCache(module, compiled=False)`), and re-running the module over the whole sequence so
far, keeping its last row. Round-robin in one process (the ways run in turn within each round,
the order rotated every round); per token the median (min–max) of the rounds, and each round's
ratio of the reference step and the re-run to the compiled step. All three are checked to give
the same outputs first (float32, 1e-4).

    OMP_NUM_THREADS=1 python scripts/bench_decode.py --designs mhsa llama deepseek_mla --prompt 256 --new 256

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
from tdiag.decode import DecodeCache
from tdiag.decode_step import form_of, pin_form

ROOT = Path(__file__).resolve().parent.parent


def with_cache(module: torch.nn.Module, x: torch.Tensor, prompt: int, compiled: bool = True) -> torch.Tensor:
    cache = DecodeCache(module, compiled=compiled)
    outputs = [module(x[:, :prompt], cache=cache)]
    outputs += [module(x[:, t : t + 1], cache=cache) for t in range(prompt, x.shape[1])]
    return torch.cat(outputs, 1)


def reference_step(module: torch.nn.Module, x: torch.Tensor, prompt: int) -> torch.Tensor:
    return with_cache(module, x, prompt, compiled=False)


def re_run(module: torch.nn.Module, x: torch.Tensor, prompt: int) -> torch.Tensor:
    outputs = [module(x[:, :prompt])]
    outputs += [module(x[:, : t + 1])[:, -1:] for t in range(prompt, x.shape[1])]
    return torch.cat(outputs, 1)


def timed(way, module: torch.nn.Module, x: torch.Tensor, prompt: int) -> float:
    start = time.perf_counter()
    way(module, x, prompt)
    return time.perf_counter() - start


def spread(values: list[float]) -> str:
    values = sorted(values)
    return f"{values[len(values) // 2]:.2f} ({values[0]:.2f}-{values[-1]:.2f})"


def compare_forms(args: argparse.Namespace) -> None:
    """The compiled step with the plain and the absorbed form pinned (decode_step.pin_form), in
    turn within each round; the planner's choice and estimates beside."""
    total = args.prompt + args.new
    for name in args.designs:
        modules = {}
        for form in ("plain", "absorbed"):
            design = tdiag.load(ROOT / "designs" / f"{name}.td", F=args.width, H=args.heads).with_causal_mask()
            if form_of(design.graph) is None:
                break
            chosen = form_of(design.graph)
            pin_form(design.graph, form)
            modules[form] = design.module(N=total).eval()
        if not modules:
            print(f"{name:<13} has no absorbed form")
            continue
        x = torch.randn(1, total, args.width, generator=torch.Generator().manual_seed(0))
        times: dict[str, list[float]] = {form: [] for form in modules}
        with torch.no_grad():
            outputs = [with_cache(module, x, args.prompt) for module in modules.values()]  # same seed: same weights
            difference = (outputs[0] - outputs[-1]).abs().max().item()
            assert difference < 1e-4, (name, difference)
            for round_ in range(args.repeat):
                for form in list(modules)[round_ % 2 :] + list(modules)[: round_ % 2]:
                    times[form].append(timed(with_cache, modules[form], x, args.prompt) / args.new)
        ratio = spread([p / a for a, p in zip(times["absorbed"], times["plain"], strict=True)])
        print(
            f"{name:<13} "
            + "  ".join(f"{form} {spread([1e3 * t for t in times[form]])} ms" for form in modules)
            + f"  | plain/absorbed {ratio}  [{chosen}]",
            flush=True,
        )


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
                f"{name:<6} prompt {prompt:5}  {module.new_cache().kind}"
                f" {spread([1e3 * t for t in new_times])} ms/token"
                f"  {old.kind} {spread([1e3 * t for t in old_times])} ms/token"
                f"  {old.kind} / {module.new_cache().kind} {spread(ratios)}"
                f"  [max |difference| {difference:.1e}]",
                flush=True,
            )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--designs", nargs="+", default=["mhsa", "llama", "deepseek_mla"])
    parser.add_argument("--width", type=int, default=64, help="F")
    parser.add_argument("--heads", type=int, default=4, help="H")
    parser.add_argument(
        "--prompt", type=int, nargs="+", default=[256], help="one length, or several with --against old"
    )
    parser.add_argument("--new", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument(
        "--forms", action="store_true", help="for a design with an absorbed form: the compiled step in each form"
    )
    parser.add_argument("--against", choices=["re-run", "old"], default="re-run")
    args = parser.parse_args()
    torch.set_num_threads(1)
    if args.against == "old":
        against_old(args)
        return
    args.prompt = args.prompt[0]
    total = args.prompt + args.new
    print(
        f"F={args.width} H={args.heads}, batch 1, float32, prompt {args.prompt}, {args.new} new positions one at"
        f" a time; per-token ms of the new positions (prompt included) median (min-max) over {args.repeat} rounds"
    )
    if args.forms:
        compare_forms(args)
        return
    for name in args.designs:
        design = tdiag.load(ROOT / "designs" / f"{name}.td", F=args.width, H=args.heads).with_causal_mask()
        module = design.module(N=total).eval()
        x = torch.randn(1, total, args.width, generator=torch.Generator().manual_seed(0))
        ways = {"compiled step": with_cache, "reference step": reference_step, "re-run": re_run}
        times: dict[str, list[float]] = {way: [] for way in ways}
        with torch.no_grad():
            results = {way: run(module, x, args.prompt) for way, run in ways.items()}
            difference = max((y - results["compiled step"]).abs().max().item() for y in results.values())
            assert difference < 1e-4, (name, difference)
            order = list(ways)
            for round_ in range(args.repeat):
                for way in order[round_ % 3 :] + order[: round_ % 3]:
                    times[way].append(timed(ways[way], module, x, args.prompt) / args.new)
        cache = module.new_cache()
        how = "compiled" if cache.step is not None and cache.step.reason is None else f"reference ({cache.step.reason})"
        base = times["compiled step"]
        reference = spread([b / a for a, b in zip(base, times["reference step"], strict=True)])
        rerun = spread([b / a for a, b in zip(base, times["re-run"], strict=True)])
        print(
            f"{name:<13} "
            + "  ".join(f"{way} {spread([1e3 * t for t in times[way]])} ms" for way in ways)
            + f"  | reference/compiled {reference}  re-run/compiled {rerun}"
            + f"  [{how}; cached {', '.join(cache.rule.cached)}; max |difference| {difference:.1e}]",
            flush=True,
        )


if __name__ == "__main__":
    main()
