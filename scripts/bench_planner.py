"""Is the default objective ever slower, and does time track FLOPs? For each design, sequence
length and mask (plain, causal) this times the plan of each objective (time, flops, memory) and
a hand-written SDPA multi-head attention, forward and backward, round-robin in one process, and
prints side by side:

- each objective's milliseconds (median, min–max over rounds) and its predicted milliseconds
  (tdiag.plan.timing.plan_time on the measured local CPU, tdiag.device.local_cpu);
- time/flops and time/memory: the default objective's time over each other plan's, median of the
  per-round ratios with min–max (above 1: the default is slower);
- "time/FLOPs vs SDPA": the default plan's time relative to SDPA MHSA divided by its FLOPs
  relative to mhsa's plan, both counted as the kernels do them (cost.py `kernel_flops`: a
  block-skipping causal kernel does about half). 1 means the design runs as efficiently per
  FLOP as a hand-written SDPA MHSA.

    python scripts/bench_planner.py hard_fish lfish mgk --n 128 512 --out out/bench-planner
    python scripts/bench_planner.py mhsa --n 1024 --masks causal --repeat 5

Single thread by default (--threads; OMP_NUM_THREADS is set before torch starts, so the
planner's device, keyed by that thread count, is the one timed), batch 1, F=256, H=4; each
module is planned at the sizes it is timed at, the batch included (the time objective's choices
depend on it: a score tensor of batch 8 no longer fits in the caches). `--flush-denormal` times
everything with subnormal floats flushed to zero, as `tdiag train` runs on a CPU (../docs/results/
bench-cpu/denormals). Writes planner.json, planner.csv and (with matplotlib) planner.png in --out.
"""

from __future__ import annotations

import argparse
import csv
import io
import json
import os
import platform
import statistics
import sys
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))

OBJECTIVES = ("time", "flops", "memory")


@dataclass
class Result:
    design: str
    causal: bool
    n: int
    ms: dict[str, float] = field(default_factory=dict)  # objective (and "sdpa") -> median ms
    ms_min: dict[str, float] = field(default_factory=dict)
    ms_max: dict[str, float] = field(default_factory=dict)
    predicted_ms: dict[str, float] = field(default_factory=dict)
    ratio: dict[str, float] = field(default_factory=dict)  # "flops", "memory" -> time plan / that plan
    ratio_min: dict[str, float] = field(default_factory=dict)
    ratio_max: dict[str, float] = field(default_factory=dict)
    same_plan: dict[str, bool] = field(default_factory=dict)  # objective -> its plan is the time plan's
    kernel_flops: float = 0.0
    mhsa_kernel_flops: float = 0.0
    efficiency: float = 0.0  # (time / SDPA time) / (kernel FLOPs / mhsa kernel FLOPs)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("designs", nargs="+", help="bundled design names or .td files")
    parser.add_argument("--n", type=int, nargs="+", default=[128, 512], help="sequence lengths")
    parser.add_argument("--masks", nargs="+", choices=("plain", "causal"), default=["plain", "causal"])
    parser.add_argument("--objectives", default=",".join(OBJECTIVES), help="comma-separated, the default first")
    parser.add_argument("--repeat", type=int, default=7, help="timed rounds")
    parser.add_argument("--batch", type=int, default=1)
    parser.add_argument("--width", type=int, default=256, help="F")
    parser.add_argument("--heads", type=int, default=4, help="H")
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument(
        "--flush-denormal",
        action="store_true",
        help="flush subnormal floats to zero for the whole run, as `tdiag train` does on a CPU",
    )
    parser.add_argument("--out", type=Path, default=None, help="folder for planner.json, .csv, .png")
    args = parser.parse_args(argv)
    os.environ["OMP_NUM_THREADS"] = os.environ["MKL_NUM_THREADS"] = str(args.threads)
    import torch

    torch.set_num_threads(args.threads)
    if args.flush_denormal and not torch.set_flush_denormal(True):
        parser.error("--flush-denormal: this CPU has no flush-to-zero mode")
    objectives = [o.strip() for o in args.objectives.split(",") if o.strip()]
    cases = [(d, m == "causal", n) for d in args.designs for m in args.masks for n in args.n]
    results = []
    started = time.perf_counter()
    skipped = []
    for k, (design, causal, n) in enumerate(cases):
        label = f"{Path(design).stem} {'causal' if causal else 'plain'} N={n}"
        print(f"[{k + 1}/{len(cases)}] {label} ...", end="", flush=True)
        fixed = fixed_length(design)
        if fixed is not None and fixed != n:
            skipped.append(f"{label}: the design fixes N = {fixed}")
            print(f" skipped: the design fixes N = {fixed}", flush=True)
            continue
        try:
            result = measure(design, causal, n, objectives, args)
        except (RuntimeError, ValueError, MemoryError) as error:  # one case lost, not the run
            skipped.append(f"{label}: {type(error).__name__}: {str(error).splitlines()[0]}")
            print(f" failed: {skipped[-1]}", flush=True)
            continue
        results.append(result)
        print(f" {result.ms[objectives[0]]:.1f} ms ({time.perf_counter() - started:.0f} s so far)", flush=True)
        if args.out is not None:
            write(results, objectives, args, plot=False)  # what is measured survives a later failure
    print()
    print(table(results, objectives))
    for line in skipped:
        print(f"not measured: {line}")
    if args.out is not None:
        for path in write(results, objectives, args):
            print(f"wrote {path}")
    return 0


def fixed_length(design: str) -> int | None:
    """N where the design fixes it (a buffer over the positions, as MGK's EM prior), else None."""
    import tdiag

    size = tdiag.load(_file(design)).graph.sizes.get("N")
    return None if size is None or size.is_free else int(size.definition)


def _file(design: str) -> str:
    return design if design.endswith(".td") else str(ROOT / "designs" / f"{design}.td")


def measure(design: str, causal: bool, n: int, objectives: list[str], args: argparse.Namespace) -> Result:
    import torch

    import tdiag
    from tdiag.bench import SdpaAttention, _sizes_for, measure_all, other_inputs
    from tdiag.cost import cost_report
    from tdiag.device import local_cpu
    from tdiag.plan.timing import plan_time

    torch.manual_seed(0)
    model = local_cpu()
    loaded = tdiag.load(_file(design), **_sizes_for(_file(design), args.width, args.heads))
    loaded = loaded.with_causal_mask() if causal else loaded
    lengths = {k: n for k, size in loaded.graph.sizes.items() if size.is_free} | {"B": args.batch}  # planned as timed
    modules = [loaded.module(lengths, objective=o) for o in objectives]
    mhsa = tdiag.load(_file("mhsa"), **_sizes_for(_file("mhsa"), args.width, args.heads))
    mhsa = mhsa.with_causal_mask() if causal else mhsa
    sdpa = SdpaAttention(mhsa.module({"N": n, "B": args.batch}, objective="time"))
    x = torch.randn(args.batch, n, args.width)
    # an objective whose plan is another's (the same steps) is timed once: its ratio is 1
    keys = [tuple(s.description for s in m.tdiag_plan.steps) for m in modules]
    distinct = list(dict.fromkeys(keys))
    timed = measure_all(
        [*(modules[keys.index(key)] for key in distinct), sdpa],
        x,
        causal,
        args.repeat,
        other_inputs(loaded, args.batch, n, "cpu"),
    )
    timings = [timed[distinct.index(key)] for key in keys] + [timed[-1]]
    result = Result(Path(design).stem, causal, n)
    for name, timing in zip([*objectives, "sdpa"], timings, strict=True):
        result.ms[name] = 1e3 * statistics.median(timing.seconds)
        result.ms_min[name], result.ms_max[name] = 1e3 * min(timing.seconds), 1e3 * max(timing.seconds)
    plans = [m.tdiag_plan for m in modules]
    for name, plan in zip(objectives, plans, strict=True):
        result.predicted_ms[name] = 1e3 * plan_time(plan, model, B=args.batch)
        result.same_plan[name] = [s.description for s in plan.steps] == [s.description for s in plans[0].steps]
    for name, timing in zip(objectives[1:], timings[1 : len(objectives)], strict=True):
        per_round = [a / b for a, b in zip(timings[0].seconds, timing.seconds, strict=True)]
        result.ratio[name] = statistics.median(per_round)
        result.ratio_min[name], result.ratio_max[name] = min(per_round), max(per_round)
    result.kernel_flops = float(cost_report(plans[0]).at()["kernel_flops"])
    result.mhsa_kernel_flops = float(cost_report(mhsa.plan(N=n, B=args.batch, objective="time")).at()["kernel_flops"])
    result.efficiency = (result.ms[objectives[0]] / result.ms["sdpa"]) / (
        result.kernel_flops / result.mhsa_kernel_flops
    )
    return result


def table(results: list[Result], objectives: list[str]) -> str:
    default, others = objectives[0], objectives[1:]
    header = f"{'design':<12} {'mask':<6} {'N':>5}"
    for o in [*objectives, "sdpa"]:
        header += f" {o + ' ms (min–max)':>24}"
    for o in objectives:
        header += f" {'pred ' + o:>10}"
    for o in others:
        header += f" {default + '/' + o + ' (min–max)':>26}"
    header += f" {'time/FLOPs vs SDPA':>19}"
    lines = [header]
    for r in results:
        line = f"{r.design:<12} {'causal' if r.causal else 'plain':<6} {r.n:>5}"
        for o in [*objectives, "sdpa"]:
            line += f" {f'{r.ms[o]:.2f} ({r.ms_min[o]:.2f}–{r.ms_max[o]:.2f})':>24}"
        for o in objectives:
            line += f" {r.predicted_ms[o]:>10.2f}"
        for o in others:
            same = " =" if r.same_plan[o] else "  "
            line += f" {f'{r.ratio[o]:.2f} ({r.ratio_min[o]:.2f}–{r.ratio_max[o]:.2f}){same}':>26}"
        line += f" {r.efficiency:>19.2f}"
        lines.append(line)
    lines.append("")
    lines.append("'=': the same plan as the default objective's (timed once: its ratio is 1 by construction)")
    return "\n".join(lines)


def write(results: list[Result], objectives: list[str], args: argparse.Namespace, plot: bool = True) -> list[Path]:
    """planner.json and planner.csv in args.out, and with `plot` (and matplotlib) planner.png."""
    import torch

    args.out.mkdir(parents=True, exist_ok=True)
    settings = {
        "batch": args.batch,
        "F": args.width,
        "H": args.heads,
        "threads": args.threads,
        "flush_denormal": args.flush_denormal,
        "repeat": args.repeat,
        "objectives": objectives,
        "machine": platform.platform(),
        "torch": torch.__version__,
        "load_average": os.getloadavg(),
    }
    rows = [asdict(r) for r in results]
    paths = [args.out / "planner.json", args.out / "planner.csv"]
    paths[0].write_text(json.dumps({"settings": settings, "results": rows}, indent=2))
    flat = io.StringIO()
    names = [*objectives, "sdpa"]
    fields = ["design", "causal", "n"]
    fields += [f"{o}_{key}" for o in names for key in ("ms", "ms_min", "ms_max")]
    fields += [f"{o}_predicted_ms" for o in objectives]
    fields += [f"{objectives[0]}_over_{o}{end}" for o in objectives[1:] for end in ("", "_min", "_max")]
    fields += ["kernel_flops", "mhsa_kernel_flops", "efficiency"]
    writer = csv.DictWriter(flat, fieldnames=fields)
    writer.writeheader()
    for r in results:
        row = {"design": r.design, "causal": r.causal, "n": r.n}
        for o in names:
            row |= {f"{o}_ms": r.ms[o], f"{o}_ms_min": r.ms_min[o], f"{o}_ms_max": r.ms_max[o]}
        row |= {f"{o}_predicted_ms": r.predicted_ms[o] for o in objectives}
        for o in objectives[1:]:
            base = f"{objectives[0]}_over_{o}"
            row |= {base: r.ratio[o], f"{base}_min": r.ratio_min[o], f"{base}_max": r.ratio_max[o]}
        row |= {"kernel_flops": r.kernel_flops, "mhsa_kernel_flops": r.mhsa_kernel_flops, "efficiency": r.efficiency}
        writer.writerow(row)
    paths[1].write_text(flat.getvalue())
    if not plot:
        return paths
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError:
        return paths
    series = sorted({(r.design, r.causal) for r in results})
    fig, axes = plt.subplots(1, 2, figsize=(12, 4.5))
    for design, causal in series:
        points = sorted((r for r in results if (r.design, r.causal) == (design, causal)), key=lambda r: r.n)
        label = f"{design} {'causal' if causal else 'plain'}"
        ns = [r.n for r in points]
        worst = [max(r.ratio.values(), default=1.0) for r in points]
        low = [max(r.ratio_min.values(), default=1.0) for r in points]
        high = [max(r.ratio_max.values(), default=1.0) for r in points]
        style = "--" if causal else "-"
        line = axes[0].plot(ns, worst, marker="o", linestyle=style, label=label)[0]
        axes[0].fill_between(ns, low, high, color=line.get_color(), alpha=0.1)
        axes[1].plot(
            ns, [r.efficiency for r in points], marker="o", linestyle=style, color=line.get_color(), label=label
        )
    axes[0].axhline(1.0, color="grey", lw=0.8)
    axes[0].set(
        xscale="log", xlabel="N", ylabel="default time / best other objective", title="default objective vs others"
    )
    axes[1].axhline(1.0, color="grey", lw=0.8)
    axes[1].set(xscale="log", xlabel="N", ylabel="(time / SDPA) / (FLOPs / mhsa)", title="time per FLOP vs SDPA MHSA")
    axes[1].legend(fontsize=7)
    fig.tight_layout()
    fig.savefig(args.out / "planner.png", dpi=110)
    plt.close(fig)
    return [*paths, args.out / "planner.png"]


if __name__ == "__main__":
    sys.exit(main())
