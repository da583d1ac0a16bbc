"""`python -m tdiag.gpu_report`: one command that proves tdiag's CUDA paths and measures them.

It records the environment, runs the `gpu`-marked tests (`pytest -m gpu`: every bundled design on
the device against the CPU float64 result, the fused SDPA backend, FlexAttention forward and
backward, torch.compile, a bf16 training step, DDP), times each design's plans against the
hand-written forms (forward + backward, round-robin, median and min–max), trains every design with
`tdiag train` and compares tdiag's mhsa with a plain nanoGPT-style model, then writes a folder with
CSV, JSON, plots and a README. Every section has a time budget and stops cleanly when it is spent
(the README says where), so the whole report fits its total budget (25 minutes on one H100).
`--device cpu` is the dry run: tiny sizes, float32, minutes on two CPU cores, the same files; CI
runs it so that the report cannot rot.

Invariant: every ratio the report states is a median of per-round ratios with its min–max, and
nothing that fails in a section stops the report: the row or the section records why."""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import datetime
import itertools
import json
import os
import platform
import re
import subprocess
import sys
import tempfile
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from . import __version__
from .errors import TdiagError, format_diagnostic

ROOT = Path(__file__).resolve().parent.parent  # the repository, when run from a checkout
SECTIONS = ("environment", "tests", "bench", "train")
BENCH_DESIGNS = ("mhsa", "thsa", "fish", "hard_fish", "mgk", "mlk")
TRAIN_DESIGNS = ("mhsa", "fish", "mgk", "thsa", "mlk")
OBJECTIVES = ("time", "flops", "memory")


@dataclass(frozen=True)
class Settings:
    """What the report runs and for how long; `for_device` gives the GPU sizes or the dry run's."""

    device: str  # "cuda" or "cpu"
    dry_run: bool  # tiny sizes: a harness check (minutes on a CPU)
    lengths: tuple[int, ...]  # sequence lengths N of the benchmarks
    tokens: int  # tokens per benchmark step: the batch is tokens // N (at least 1)
    width: int  # F of the benchmarked layers
    heads: int  # H of the benchmarked layers
    repeat: int  # timed round-robin rounds per case
    masks: tuple[str, ...]  # "plain", "causal"
    precision: str  # "bfloat16-autocast" (float32 parameters, as tdiag train runs) or "float32" (the dry run)
    layers: int  # tdiag train: transformer blocks
    train_width: int  # tdiag train: model width
    train_heads: int  # tdiag train: heads
    context: int  # tdiag train: context length
    batch: int  # tdiag train: sequences per step
    steps: int  # tdiag train: optimizer steps per design
    compile: bool  # tdiag train and the throughput comparison: torch.compile the models
    rounds: int  # throughput comparison: round-robin rounds
    round_steps: int  # throughput comparison: training steps per round
    budgets: dict[str, float] = field(default_factory=dict)  # seconds per section

    @staticmethod
    def for_device(device: str, *, dry_run: bool, minutes: float) -> Settings:
        """The GPU report's sizes (N in 1k, 4k, 16k; bf16; 6 layers of width 384, context 1024,
        compiled) or the dry run's (N in 32, 64; float32; one layer of width 32); the total time
        is shared between the sections in fixed proportions."""
        shares = {"environment": 0.01, "tests": 0.2, "bench": 0.29, "train": 0.47}  # 3% left to write
        budgets = {name: share * minutes * 60 for name, share in shares.items()}
        if dry_run:
            return Settings(device, True, (32, 64), 64, 32, 2, 3, ("plain", "causal"), "float32",
                            1, 32, 2, 32, 4, 4, False, 3, 2, budgets)  # fmt: skip
        return Settings(device, False, (1024, 4096, 16384), 16384, 512, 8, 10, ("plain", "causal"), "bfloat16-autocast",
                        6, 384, 6, 1024, 16, 200, True, 5, 20, budgets)  # fmt: skip


class Budget:
    """A section's time budget: `has_time()` before each case; `stopped` says what was left out."""

    def __init__(self, seconds: float, log: Callable[[str], None]):
        self.seconds, self.deadline, self.log = seconds, time.monotonic() + seconds, log
        self.stopped: str | None = None

    def left(self) -> float:
        return self.deadline - time.monotonic()

    def has_time(self, done: int, total: int) -> bool:
        if self.left() > 0:
            return True
        if self.stopped is None:
            self.stopped = f"time budget of {self.seconds:.0f} s spent after {done} of {total} cases"
            self.log(f"  stopped: {self.stopped}")
        return False


# ---- environment ------------------------------------------------------------------------------


def environment(settings: Settings) -> dict[str, Any]:
    """Device name, driver, CUDA, torch, Python and package versions, the commit, the planning device."""
    import torch

    from .device import DATA_SHEETS, data_sheet

    found: dict[str, Any] = {
        "date": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%d %H:%M UTC"),
        "python": platform.python_version(),
        "platform": platform.platform(),
        "torch": torch.__version__,
        "cpu_threads": torch.get_num_threads(),
        "cuda": torch.version.cuda,
        "tdiag": __version__,
        "commit": _git("rev-parse", "--short", "HEAD"),
        "packages": {name: _version(name) for name in ("lark", "networkx", "sympy", "opt_einsum", "matplotlib")},
    }
    if settings.device == "cuda":
        name = torch.cuda.get_device_name()
        found |= {"device": name, "driver": _nvidia_smi("driver_version"), "memory_gib": _gpu_memory_gib()}
        sheet = data_sheet(name)
        if sheet is not None and not os.environ.get("TDIAG_DEVICE"):
            os.environ["TDIAG_DEVICE"] = name  # plan for this GPU's data sheet (inherited by tdiag train)
        found["planning_device"] = (
            sheet.describe()
            if sheet
            else f"no data sheet for '{name}' (known: {', '.join(d.name for d in DATA_SHEETS)})"
        )
    else:
        found |= {"device": _cpu_name(), "driver": None, "memory_gib": None}
        found["planning_device"] = "this CPU, as measured (tdiag.device.local_cpu)"
    found["fla"] = _fla_status()
    return found


def _version(name: str) -> str | None:
    from importlib import metadata

    try:
        return metadata.version(name.replace("_", "-"))
    except metadata.PackageNotFoundError:
        return None


def _git(*args: str) -> str | None:
    try:
        result = subprocess.run(["git", "-C", str(ROOT), *args], capture_output=True, text=True, timeout=10)
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip() or None if result.returncode == 0 else None


def _nvidia_smi(query: str) -> str | None:
    try:
        result = subprocess.run(
            ["nvidia-smi", f"--query-gpu={query}", "--format=csv,noheader"], capture_output=True, text=True, timeout=20
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    return result.stdout.strip().splitlines()[0] if result.returncode == 0 and result.stdout.strip() else None


def _gpu_memory_gib() -> float:
    import torch

    return round(torch.cuda.get_device_properties(0).total_memory / 2**30, 1)


def _cpu_name() -> str:
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or platform.machine() or "cpu"


def _fla_status() -> str:
    """Whether flash-linear-attention imports; the report compares with it only then."""
    try:
        import fla  # type: ignore[import-not-found]  # noqa: F401
    except Exception as error:  # an install broken in any way is reported, not fatal
        return f"not available ({type(error).__name__}: {error})"
    return f"available ({_version('flash-linear-attention') or 'version unknown'})"


def slug(name: str) -> str:
    """A device name as a folder name: `NVIDIA H100 80GB HBM3` -> `nvidia-h100-80gb-hbm3`."""
    return re.sub(r"[^a-z0-9]+", "-", name.lower()).strip("-") or "device"


# ---- tests --------------------------------------------------------------------------------------


def run_tests(budget: Budget, log: Callable[[str], None]) -> dict[str, Any]:
    """`pytest -m gpu tests/test_gpu.py` in a subprocess, stopped when the budget is spent."""
    test_file = ROOT / "tests" / "test_gpu.py"
    flags = ["-m", "gpu", "-o", "addopts=", "-v", "-rfEs", "--durations=10", "-p", "no:cacheprovider"]  # a line a test
    command = [sys.executable, "-m", "pytest", *flags, str(test_file)]
    shown = f"python -m pytest {' '.join(flags)} tests/test_gpu.py"
    if not test_file.is_file():
        return {"command": shown, "summary": f"not run: {test_file} is absent (run the report from a checkout)"}
    log(f"  {shown}")
    try:
        result = subprocess.run(
            command, cwd=ROOT, env=_child_env(), capture_output=True, text=True, timeout=max(budget.left(), 1)
        )
        output, code = result.stdout + result.stderr, result.returncode
    except subprocess.TimeoutExpired as expired:
        output, code = _text(expired.stdout) + _text(expired.stderr), None
        budget.stopped = f"time budget of {budget.seconds:.0f} s spent: pytest was stopped"
    summary = pytest_summary(output) if code is not None else f"stopped before its summary: {tests_so_far(output)}"
    log(f"  {summary}")
    outcomes = [line for line in output.splitlines() if line.startswith(("FAILED", "ERROR", "SKIPPED"))]
    return {"command": shown, "exit_code": code, "summary": summary, "outcomes": outcomes[:60], "output": output}


def tests_so_far(output: str) -> str:
    """The outcomes of the tests that ended, counted from pytest's verbose lines (`...::name PASSED`)."""
    found = re.findall(r"::\S+ (PASSED|FAILED|SKIPPED|ERROR|XFAIL|XPASS)", output)
    counts = {outcome.lower(): found.count(outcome) for outcome in dict.fromkeys(found)}
    return ", ".join(f"{n} {outcome}" for outcome, n in counts.items()) or "no test had ended"


def pytest_summary(output: str) -> str:
    """pytest's closing line (`3 passed, 2 skipped in 4.1s`), without its `=` rule."""
    pattern = re.compile(r"\b(passed|failed|skipped|errors?|deselected|no tests ran)\b")
    lines = [line.strip(" =") for line in output.splitlines() if pattern.search(line) and " in " in line]
    return lines[-1] if lines else "no pytest summary line in its output"


def _text(data: bytes | str | None) -> str:
    return data.decode(errors="replace") if isinstance(data, bytes) else data or ""


def _child_env() -> dict[str, str]:
    """This process's environment with this tdiag first on PYTHONPATH, so children run this tdiag."""
    paths = [str(ROOT), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    return os.environ | {"PYTHONPATH": os.pathsep.join(dict.fromkeys(paths))}


# ---- benchmarks ---------------------------------------------------------------------------------


@dataclass
class BenchRow:
    """One implementation of one design at one length and mask, forward + backward."""

    design: str
    mask: str
    n: int
    batch: int
    implementation: str  # "tdiag (time)", "tdiag (flops)", ..., or a hand-written form
    ms: float | None = None  # median over rounds
    ms_min: float | None = None
    ms_max: float | None = None
    ratio: float | None = None  # tdiag (time)'s time / this row's: median of per-round ratios
    ratio_min: float | None = None
    ratio_max: float | None = None
    predicted_ms: float | None = None  # the time model's estimate (tdiag rows)
    peak_mib: float | None = None  # torch.cuda.max_memory_allocated during one step (CUDA)
    saved_mib: float | None = None  # bytes autograd keeps for backward
    same_plan_as: str | None = None  # an objective whose plan this is: timed once
    note: str = ""  # why a row has no measurement


def bench_cases(settings: Settings) -> list[tuple[int, str, str]]:
    """(N, design, mask), shortest N first, so that a budget cut drops the largest sizes."""
    return [(n, d, m) for n in settings.lengths for d in BENCH_DESIGNS for m in settings.masks]


def run_bench(settings: Settings, budget: Budget, log: Callable[[str], None]) -> list[BenchRow]:
    """Every case of `bench_cases` while the budget lasts; a case that fails (out of memory, a
    kernel that refuses) is recorded with its reason and the others go on."""
    cases = bench_cases(settings)
    rows: list[BenchRow] = []
    model = timing_model(settings.device)
    for k, (n, name, mask) in enumerate(cases):
        if not budget.has_time(k, len(cases)):
            break
        log(f"  [{k + 1}/{len(cases)}] {name} {mask} N={n}")
        rows += bench_case(settings, name, mask, n, model)
    return rows


def bench_case(settings: Settings, name: str, mask: str, n: int, model: Any) -> list[BenchRow]:
    import torch

    batch = max(1, settings.tokens // n)
    try:
        return _bench_case(settings, name, mask, n, batch, model)
    except torch.cuda.OutOfMemoryError:
        note = "out of memory"
    except Exception as error:  # a case that breaks is a row with its reason; the other cases go on
        note = _first_line(error)
    _free_memory()  # after the handler: the error's frames held the case's tensors until here
    return [BenchRow(name, mask, n, batch, "tdiag (time)", note=note)]


def _free_memory() -> None:
    import gc

    import torch

    gc.collect()
    if torch.cuda.is_available():
        torch.cuda.empty_cache()


def _first_line(error: BaseException) -> str:
    text = str(error).strip().splitlines()
    return f"{type(error).__name__}: {text[0] if text else ''}"[:200]


def _bench_case(settings: Settings, name: str, mask: str, n: int, batch: int, model: Any) -> list[BenchRow]:
    import torch

    from .bench import other_inputs

    causal = mask == "causal"
    design, compiled, keys, labels, modules = _bench_modules(settings, name, causal, n, batch)
    x = torch.randn(batch, n, settings.width, device=settings.device)
    others = other_inputs(design, batch, n, settings.device)
    rows, kept = [], []
    for label, module in zip(labels, modules, strict=True):
        refusal = _probe(module, x, causal, others)
        if refusal:
            rows.append(BenchRow(design.name, mask, n, batch, label, note=refusal))
        else:
            kept.append((label, module))
    rows += _timed_rows(settings, kept, x, causal, others, BenchRow(design.name, mask, n, batch, labels[0]))
    _add_predictions(rows, compiled, keys, model, batch)
    return _order(rows, labels)


def _bench_modules(settings: Settings, name: str, causal: bool, n: int, batch: int) -> tuple:
    """The design, its module under each objective, their plans' keys, and the labels and modules
    to time: each distinct plan once, then the hand-written forms with the same weights; under
    autocast when the precision says so."""
    import torch

    import tdiag

    from .bench import REFERENCES, sizes_for
    from .gpu_baselines import Autocast
    from .resources import design_file

    file = str(design_file(name))
    design = tdiag.load(file, **sizes_for(file, settings.width, settings.heads))
    design = design.with_causal_mask() if causal else design
    lengths = {k: n for k, size in design.graph.sizes.items() if size.is_free} | {"B": batch}
    torch.manual_seed(0)
    compiled = [design.module(lengths, device=settings.device, objective=o) for o in OBJECTIVES]
    keys = [tuple(s.description for s in m.tdiag_plan.steps) for m in compiled]
    distinct = list(dict.fromkeys(keys))
    labels = [f"tdiag ({OBJECTIVES[keys.index(key)]})" for key in distinct]
    modules = [compiled[keys.index(key)] for key in distinct]
    for label, make in [*REFERENCES.get(name, []), *EXTRA_REFERENCES.get(name, [])]:
        if label != "torch MultiheadAttention":  # the hand-written SDPA is the one users write today
            labels.append(label)
            modules.append(make(compiled[0]).to(settings.device))
    if settings.precision == "bfloat16-autocast":
        modules = [Autocast(m) for m in modules]
    return design, compiled, keys, labels, modules


def _timed_rows(settings: Settings, kept: list, x: Any, causal: bool, others: dict, first: BenchRow) -> list[BenchRow]:
    """Round-robin timing of the modules that ran; ratios to the first (tdiag's default plan),
    when it is among them."""
    import statistics

    from .bench import measure_all

    timings = measure_all([m for _, m in kept], x, causal, settings.repeat, others) if kept else []
    base = timings[0].seconds if kept and kept[0][0] == first.implementation else None
    rows = []
    for (label, _), timing in zip(kept, timings, strict=True):
        row = dataclasses.replace(first, implementation=label)
        row.ms = 1e3 * statistics.median(timing.seconds)
        row.ms_min, row.ms_max = 1e3 * min(timing.seconds), 1e3 * max(timing.seconds)
        if base is not None:
            per_round = [a / b for a, b in zip(base, timing.seconds, strict=True)]
            row.ratio, row.ratio_min, row.ratio_max = statistics.median(per_round), min(per_round), max(per_round)
        row.peak_mib = timing.cuda_peak_bytes / 2**20 if timing.cuda_peak_bytes is not None else None
        row.saved_mib = timing.saved_bytes / 2**20
        rows.append(row)
    return rows


def _probe(module: Any, x: Any, causal: bool, others: dict) -> str:
    """One untimed forward + backward; the reason it fails ('' when it runs)."""
    import torch

    from .measure import time_step

    kwargs = {"causal": causal} if getattr(module, "takes_causal", False) else others
    try:
        time_step(module, x, kwargs=kwargs, repeats=0, warmup=1)
        return ""
    except torch.cuda.OutOfMemoryError:
        refusal = "out of memory"
    except Exception as error:  # a form that cannot run (CPU flex backward, a kernel refusal) is a row's note
        refusal = _first_line(error)
    _free_memory()
    return refusal


def timing_model(device: str) -> Any:
    """The time model's device for predictions: the GPU's data sheet, or this CPU as measured;
    None for a GPU without a data sheet (no predictions)."""
    from .device import DeviceSettingError, for_device

    try:
        return for_device(device)
    except DeviceSettingError:
        return None


def _add_predictions(rows: list[BenchRow], compiled: list, keys: list, model: Any, batch: int) -> None:
    """The time model's estimate on each tdiag row; an objective whose plan another objective
    already has is added as a row of that measurement, marked `same_plan_as`."""
    from .plan.timing import plan_time

    by_label = {r.implementation: r for r in rows}
    for objective, module, key in zip(OBJECTIVES, compiled, keys, strict=True):
        first = f"tdiag ({OBJECTIVES[keys.index(key)]})"
        label = f"tdiag ({objective})"
        if label not in by_label and first in by_label:
            copy = dataclasses.replace(by_label[first], implementation=label, same_plan_as=OBJECTIVES[keys.index(key)])
            rows.append(copy)
            by_label[label] = copy
        if label in by_label and model is not None:
            by_label[label].predicted_ms = 1e3 * plan_time(module.tdiag_plan, model, B=batch)


def _order(rows: list[BenchRow], labels: list[str]) -> list[BenchRow]:
    """The objectives' rows in OBJECTIVES' order, then the hand-written forms as listed."""
    rank = {label: len(OBJECTIVES) + k for k, label in enumerate(labels)}
    rank |= {f"tdiag ({o})": k for k, o in enumerate(OBJECTIVES)}
    return sorted(rows, key=lambda r: rank.get(r.implementation, len(rank)))


def _flex_reference(mhsa: Any) -> Any:
    from .gpu_baselines import FlexAttentionMhsa

    return FlexAttentionMhsa(mhsa)


EXTRA_REFERENCES: dict[str, list[tuple[str, Callable[[Any], Any]]]] = {
    "mhsa": [("FlexAttention (hand-written)", _flex_reference)]
}


def ranking(rows: list[BenchRow]) -> list[dict[str, Any]]:
    """Per design, mask and N: whether the time model orders the objectives' distinct plans as
    they measured (each pair of distinct plans whose predictions and medians agree in sign)."""
    found = []
    cases = dict.fromkeys((r.design, r.mask, r.n) for r in rows)
    for case in cases:
        plans = [
            r
            for r in rows
            if (r.design, r.mask, r.n) == case
            and r.implementation.startswith("tdiag (")
            and r.same_plan_as is None
            and r.ms is not None
            and r.predicted_ms is not None
        ]
        pairs = [(a, b) for k, a in enumerate(plans) for b in plans[k + 1 :]]
        right = sum((a.ms - b.ms) * (a.predicted_ms - b.predicted_ms) > 0 for a, b in pairs)  # type: ignore[operator]
        found.append({"design": case[0], "mask": case[1], "n": case[2], "plans": len(plans), "pairs": len(pairs),
                      "pairs_right": right})  # fmt: skip
    return found


# ---- training -------------------------------------------------------------------------------------


def train_command(settings: Settings, design: str, folder: str) -> list[str]:
    """The `tdiag train` command of one design at the report's configuration."""
    flags = ["--layers", settings.layers, "--width", settings.train_width, "--heads", settings.train_heads,
             "--context", settings.context, "--batch", settings.batch, "--steps", settings.steps,
             "--eval-every", settings.steps, "--eval-batches", 4, "--device", settings.device]  # fmt: skip
    compile_flag = ["--compile"] if settings.compile else []
    return ["tdiag", "train", design, *map(str, flags), *compile_flag, "--no-progress", "--out", folder]


def run_training(settings: Settings, budget: Budget, log: Callable[[str], None]) -> dict[str, Any]:
    """`tdiag train` for each design (tokens/s, model FLOP/s, MFU, validation loss), then the
    round-robin throughput of tdiag's mhsa against the nanoGPT-style model. Each run gets an
    equal share of what is left of the budget, the comparison included."""
    runs: list[dict[str, Any]] = []
    with tempfile.TemporaryDirectory(prefix="tdiag-gpu-report-") as scratch:
        for k, design in enumerate(TRAIN_DESIGNS):
            if not budget.has_time(k, len(TRAIN_DESIGNS) + 1):
                break
            runs.append(
                _train_one(settings, design, Path(scratch) / design, budget.left() / (len(TRAIN_DESIGNS) + 1 - k))
            )
            log(f"  {design}: {_train_line(runs[-1])}")
    comparison: dict[str, Any] = {}
    if budget.has_time(len(TRAIN_DESIGNS), len(TRAIN_DESIGNS) + 1):
        try:
            comparison = throughput(settings, budget, log)
        except Exception as error:  # the runs above stay in the report
            comparison = {"note": f"failed: {_first_line(error)}", "traceback": traceback.format_exc()}
            log(f"  throughput {comparison['note']}")
    return {"runs": runs, "throughput": comparison}


def _train_one(settings: Settings, design: str, folder: Path, seconds: float) -> dict[str, Any]:
    command = train_command(settings, design, str(folder))
    shown = " ".join(command).replace(str(folder), "RUN")
    record: dict[str, Any] = {"design": design, "command": shown}
    started = time.monotonic()
    try:
        result = subprocess.run(
            [sys.executable, "-m", "tdiag", *command[1:]],
            env=_child_env(),
            capture_output=True,
            text=True,
            timeout=max(seconds, 1),
        )
    except subprocess.TimeoutExpired:
        return record | {"note": f"stopped: its share of the budget ({seconds:.0f} s) was spent"}
    record["seconds"] = round(time.monotonic() - started, 1)
    summary = folder / "summary.json"
    if result.returncode != 0 or not summary.is_file():
        lines = (result.stderr or result.stdout).strip().splitlines()
        return record | {"note": f"failed (exit {result.returncode}): {lines[-1] if lines else ''}"[:300]}
    found = json.loads(summary.read_text())
    keys = ("tokens_per_s", "model_flops_per_s", "mfu", "peak_flops_per_s", "final_val_loss", "parameters")
    return record | {k: found.get(k) for k in keys}


def _train_line(run: dict[str, Any]) -> str:
    if "tokens_per_s" not in run:
        return run.get("note", "")
    mfu = f", MFU {run['mfu']:.1%}" if run.get("mfu") else ""
    return f"{run['tokens_per_s']:,.0f} tokens/s{mfu}, val loss {run['final_val_loss']:.3f}"


def throughput(settings: Settings, budget: Budget, log: Callable[[str], None]) -> dict[str, Any]:
    """tdiag train's mhsa model and the nanoGPT-style model of the same shape, each compiled (when
    the settings say so) and warmed up, then trained round-robin (`rounds` rounds of `round_steps`
    steps, starting with each in turn): tokens/s per round, and tdiag's over nanoGPT's, median and
    min–max of the per-round ratios."""
    import statistics

    import torch

    from .gpu_baselines import NanoGpt
    from .train import build_model, flops_per_step, peak_flops, read_corpus
    from .train_config import TrainConfig

    config = TrainConfig(design="mhsa", layers=settings.layers, width=settings.train_width, heads=settings.train_heads,
                         context=settings.context, batch=settings.batch, device=settings.device)  # fmt: skip
    device = torch.device(settings.device)
    corpus = read_corpus(config.data, config.context)
    tdiag_model, design = build_model(config, corpus.vocab, device)
    torch.manual_seed(0)
    nano = NanoGpt(corpus.vocab, config.width, config.heads, config.layers, config.context).to(device)
    steppers = [_stepper(m, settings, corpus, device) for m in (tdiag_model, nano)]
    log("  throughput: warming up (compiling)" if settings.compile else "  throughput: warming up")
    for step in steppers:
        step(3)
    rates: list[list[float]] = [[], []]
    for r in range(settings.rounds):
        if not budget.has_time(r, settings.rounds):
            break
        for k in (r % 2, 1 - r % 2):
            seconds = steppers[k](settings.round_steps)
            rates[k].append(settings.round_steps * config.batch * config.context / seconds)
    if not rates[0]:
        return {"note": budget.stopped or "no round ran"}
    per_round = [a / b for a, b in zip(*rates, strict=True)]
    flops = flops_per_step(config, design, corpus.vocab)
    peak = peak_flops(device)
    found = {
        "tdiag_tokens_per_s": statistics.median(rates[0]),
        "nanogpt_tokens_per_s": statistics.median(rates[1]),
        "tdiag_model_flops_per_s": statistics.median(rates[0]) / (config.batch * config.context) * flops,
        "peak_flops_per_s": peak or None,  # the data sheet's bf16 figure; None on a CPU (no MFU)
        "ratio": statistics.median(per_round),
        "ratio_min": min(per_round),
        "ratio_max": max(per_round),
        "rounds": len(per_round),
    }
    log(f"  tdiag mhsa / nanoGPT SDPA tokens/s: {ratio_text(found)}")
    return found


def _stepper(model: Any, settings: Settings, corpus: Any, device: Any) -> Callable[[int], float]:
    """A function that trains `model` for k steps (bf16 autocast on CUDA, AdamW, clipping, as
    tdiag train does) and returns their seconds, the device synchronized at both ends."""
    import torch

    from .measure import synchronize_device
    from .train import batch_at, loss_of

    network: Any = torch.compile(model) if settings.compile else model
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-4, weight_decay=0.01)
    generator = torch.Generator().manual_seed(0)

    def step(count: int) -> float:
        synchronize_device(device)
        started = time.perf_counter()
        for _ in range(count):
            starts = torch.randint(len(corpus.train) - settings.context - 1, (settings.batch,), generator=generator)
            x, y = batch_at(corpus.train, starts, settings.context)
            loss = loss_of(network, x, y, device)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        synchronize_device(device)
        return time.perf_counter() - started

    return step


# ---- writing --------------------------------------------------------------------------------------


def ratio_text(found: dict[str, Any] | BenchRow, key: str = "ratio") -> str:
    """`1.03× (0.98–1.07)`: a median ratio and the min–max of its per-round ratios."""
    get = found.get if isinstance(found, dict) else lambda k: getattr(found, k)
    return f"{get(key):.3f}× ({get(key + '_min'):.3f}–{get(key + '_max'):.3f})"


def write_report(out: Path, report: dict[str, Any]) -> list[Path]:
    """report.json, bench.csv, train.csv, tests.txt, the plots and README.md in `out`."""
    import csv
    import io

    from .files import output_folder, write_output

    output_folder(out, flag="--out")
    paths = [write_output(out / "report.json", json.dumps(report, indent=2, default=str))]
    for name, rows in (("bench", report["bench"]["rows"]), ("train", report["train"].get("runs", []))):
        table = io.StringIO()
        fields = list(dict.fromkeys(k for row in rows for k in row)) or ["note"]
        writer = csv.DictWriter(table, fieldnames=fields)
        writer.writeheader()
        writer.writerows(rows)
        paths.append(write_output(out / f"{name}.csv", table.getvalue()))
    paths.append(write_output(out / "tests.txt", report["tests"].get("output", report["tests"]["summary"])))
    report["plots"] = plots(out, report)
    paths += [out / p for p in report["plots"]["files"]]
    paths.append(write_output(out / "README.md", readme(report)))
    return paths


def plots(out: Path, report: dict[str, Any]) -> dict[str, Any]:
    """bench.png (ms against N per design, one panel per mask) and train.png (tokens/s per
    design); without matplotlib, none, and the reason."""
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt
    except ImportError as error:
        return {"files": [], "note": f"no plots: matplotlib is not installed ({error})"}
    files = []
    rows = [r for r in report["bench"]["rows"] if r["ms"] is not None and r["same_plan_as"] is None]
    if rows:
        _bench_plot(plt, rows, out / "bench.png")
        files.append("bench.png")
    runs = [r for r in report["train"].get("runs", []) if r.get("tokens_per_s")]
    if runs:
        fig, ax = plt.subplots(figsize=(7, 4))
        ax.bar([r["design"] for r in runs], [r["tokens_per_s"] for r in runs])
        ax.set(ylabel="tokens/s (tdiag train)", title=f"training throughput on {report['environment']['device']}")
        fig.tight_layout()
        fig.savefig(out / "train.png", dpi=110)
        plt.close(fig)
        files.append("train.png")
    return {"files": files, "note": ""}


def _bench_plot(plt: Any, rows: list[dict[str, Any]], path: Path) -> None:
    """One panel per design: ms against N, a colour per implementation, causal dashed."""
    designs = list(dict.fromkeys(r["design"] for r in rows))
    columns = min(3, len(designs))
    lines = -(-len(designs) // columns)
    fig, axes = plt.subplots(lines, columns, figsize=(5.5 * columns, 4.2 * lines), squeeze=False)
    for ax, design in zip(axes.flat, designs, strict=False):
        mine = [r for r in rows if r["design"] == design]
        implementations = list(dict.fromkeys(r["implementation"] for r in mine))
        for (k, implementation), mask in itertools.product(enumerate(implementations), ("plain", "causal")):
            points = sorted((r for r in mine if (r["implementation"], r["mask"]) == (implementation, mask)),
                            key=lambda r: r["n"])  # fmt: skip
            if points:
                ax.plot([p["n"] for p in points], [p["ms"] for p in points], marker="o", color=f"C{k}",
                        linestyle="--" if mask == "causal" else "-", label=f"{implementation} {mask}")  # fmt: skip
        ax.set(xscale="log", yscale="log", xlabel="N", ylabel="forward + backward ms (median)", title=design)
        ax.legend(fontsize=6)
    for ax in list(axes.flat)[len(designs) :]:
        ax.set_visible(False)
    fig.tight_layout()
    fig.savefig(path, dpi=100)
    plt.close(fig)


def readme(report: dict[str, Any]) -> str:
    """The report's README: device and versions, every command, sizes, each section's table with
    min–max next to every ratio, and what was stopped or not run and why."""
    env, settings = report["environment"], report["settings"]
    lines = [f"# tdiag GPU report: {env['device']}{' (dry run)' if settings['dry_run'] else ''}", ""]
    lines += [f"- {label}: {value}" for label, value in _environment_lines(env)]
    lines += ["", "## Commands", "", "```", report["command"], report["tests"]["command"]]
    lines += [run["command"] for run in report["train"].get("runs", [])]
    lines += ["# the benchmarks and the nanoGPT comparison run inside the report (run_bench, throughput)"]
    lines += ["```", "", "## Sizes", ""]
    lines += [f"- benchmarks: N in {settings['lengths']}, {settings['tokens']} tokens a step (batch = tokens // N), "
              f"F={settings['width']}, H={settings['heads']}, {settings['precision']}, masks {settings['masks']}, "
              f"{settings['repeat']} round-robin rounds, forward + backward",
              f"- training: layers {settings['layers']}, width {settings['train_width']}, "
              f"heads {settings['train_heads']}, context {settings['context']}, batch {settings['batch']}, "
              f"{settings['steps']} steps, "
              f"compile {settings['compile']}; throughput: {settings['rounds']} rounds of {settings['round_steps']} "
              "steps",
              f"- time budgets (s): {json.dumps({k: round(v) for k, v in settings['budgets'].items()})}"]  # fmt: skip
    lines += ["", "## Sections", ""] + [f"- {name}: {text}" for name, text in report["sections"].items()]
    lines += ["", "## Tests (`pytest -m gpu`)", "", report["tests"]["summary"], ""]
    lines += [f"- {line}" for line in report["tests"].get("outcomes", [])] + ["", "The whole output: tests.txt.", ""]
    lines += _bench_lines(report) + _train_lines(report)
    lines += ["", "## Plots", "", report["plots"]["note"] or ", ".join(report["plots"]["files"]) or "no data to plot"]
    return "\n".join(lines) + "\n"


def _environment_lines(env: dict[str, Any]) -> list[tuple[str, Any]]:
    packages = ", ".join(f"{k} {v or 'absent'}" for k, v in env["packages"].items())
    fla = env["fla"] + (
        ": no comparison yet (tdiag has no chunkwise scan design to set beside its kernels)"
        if env["fla"].startswith("available")
        else ": no comparison with its kernels"
    )
    return [
        ("date", env["date"]),
        ("device", env["device"]),
        ("driver", env["driver"] or "none (no GPU)"),
        ("CUDA", env["cuda"] or "none (CPU build of torch)"),
        ("torch", f"{env['torch']} ({env['cpu_threads']} CPU threads)"),
        ("Python", env["python"]),
        ("platform", env["platform"]),
        ("tdiag", f"{env['tdiag']} at commit {env['commit'] or 'unknown'}"),
        ("planning device (time objective)", env["planning_device"]),
        ("packages", packages),
        ("flash-linear-attention", fla),
    ]


def _bench_lines(report: dict[str, Any]) -> list[str]:
    rows = report["bench"]["rows"]
    lines = ["## Benchmarks (forward + backward)", "",
             "ratio: tdiag (time)'s time over this row's, the median of per-round ratios (min–max); above 1 the "
             "row is faster than tdiag's default plan.", "",
             "| design | mask | N | batch | implementation | ms (min–max) | tdiag/this | predicted ms | peak MiB | "
             "saved MiB | note |", "|" + " --- |" * 11]  # fmt: skip
    for r in rows:
        measured = f"{r['ms']:.3f} ({r['ms_min']:.3f}–{r['ms_max']:.3f})" if r["ms"] is not None else "—"
        ratio = ratio_text(r) if r["ratio"] is not None else "—"
        note = r["note"] or (f"the plan of {r['same_plan_as']}" if r["same_plan_as"] else "")
        cells = [r["design"], r["mask"], r["n"], r["batch"], r["implementation"], measured, ratio,
                 _num(r["predicted_ms"]), _num(r["peak_mib"], 1), _num(r["saved_mib"], 1), note]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    lines += ["", "### Does the time model rank the objectives' plans right?", ""]
    lines += ["| design | mask | N | distinct plans | pairs ordered as measured |", "| --- | --- | --- | --- | --- |"]
    for r in report["bench"]["ranking"]:
        lines.append(f"| {r['design']} | {r['mask']} | {r['n']} | {r['plans']} | {r['pairs_right']} of {r['pairs']} |")
    return lines


def _mfu(found: dict[str, Any]) -> str:
    peak = found.get("peak_flops_per_s")
    return f"{found['tdiag_model_flops_per_s'] / peak:.1%}" if peak else "— (no data-sheet peak)"


def _num(value: float | None, digits: int = 3) -> str:
    return "—" if value is None else f"{value:.{digits}f}"


def _train_lines(report: dict[str, Any]) -> list[str]:
    train = report["train"]
    lines = ["", "## Training (`tdiag train`)", "", "| design | tokens/s | model TFLOP/s | MFU | val loss | note |",
             "| --- | --- | --- | --- | --- | --- |"]  # fmt: skip
    for run in train.get("runs", []):
        flops = run.get("model_flops_per_s")
        cells = [run["design"], _num(run.get("tokens_per_s"), 0), _num(flops / 1e12 if flops else None, 4),
                 f"{run['mfu']:.1%}" if run.get("mfu") else "— (no data-sheet peak)" if "mfu" in run else "—",
                 _num(run.get("final_val_loss")), run.get("note", "")]  # fmt: skip
        lines.append("| " + " | ".join(str(c) for c in cells) + " |")
    found = train.get("throughput") or {}
    lines += ["", "### tdiag's mhsa against a nanoGPT-style model with SDPA (same shape)", ""]
    if "ratio" in found:
        lines += [f"- tdiag mhsa: {found['tdiag_tokens_per_s']:,.0f} tokens/s; nanoGPT: "
                  f"{found['nanogpt_tokens_per_s']:,.0f} tokens/s (medians of {found['rounds']} rounds)",
                  f"- tokens/s ratio tdiag/nanoGPT: {ratio_text(found)}"]  # fmt: skip
        lines.append(f"- tdiag mhsa: {found['tdiag_model_flops_per_s'] / 1e12:.4f} TFLOP/s, MFU {_mfu(found)}")
    else:
        lines.append(f"- not measured: {found.get('note', 'the section did not reach it')}")
    return lines


# ---- the command ------------------------------------------------------------------------------------


# What a section that failed leaves in the report, given its error.
EMPTY: dict[str, Callable[[str], Any]] = {
    "tests": lambda error: {"command": "python -m pytest -m gpu tests/test_gpu.py", "summary": f"failed: {error}"},
    "bench": lambda error: [],
    "train": lambda error: {"runs": [], "throughput": {"note": f"failed: {error}"}},
}


def build(settings: Settings, command: str, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Run the sections in order within their budgets and return the whole report."""
    started = time.monotonic()
    report: dict[str, Any] = {"command": command, "settings": dataclasses.asdict(settings), "sections": {}}
    log("environment")
    report["environment"] = environment(settings)
    log(f"  {report['environment']['device']}, torch {report['environment']['torch']}")
    report["sections"]["environment"] = "completed"
    sections: list[tuple[str, Callable[[Budget], Any]]] = [
        ("tests", lambda b: run_tests(b, log)),
        ("bench", lambda b: run_bench(settings, b, log)),
        ("train", lambda b: run_training(settings, b, log)),
    ]
    for name, section in sections:
        log(f"{name} (budget {settings.budgets[name]:.0f} s)")
        budget = Budget(settings.budgets[name], log)
        begun = time.monotonic()
        try:
            report[name] = section(budget)
            outcome = budget.stopped or "completed"
        except Exception as error:  # a section that breaks is reported; the sections after it still run
            report[name] = EMPTY[name](_first_line(error))
            report.setdefault("tracebacks", {})[name] = traceback.format_exc()
            outcome = f"failed ({_first_line(error)}; traceback in report.json)"
            log(f"  {outcome}")
        report["sections"][name] = f"{outcome} ({time.monotonic() - begun:.0f} s)"
    rows = report["bench"]
    report["bench"] = {"rows": [dataclasses.asdict(r) for r in rows], "ranking": ranking(rows)}
    report["seconds"] = round(time.monotonic() - started, 1)
    return report


class UsageError(Exception):
    """A bad flag: one line, exit 2, no traceback."""


def parse(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog="python -m tdiag.gpu_report",
        description="Prove tdiag's CUDA paths and measure them (gpu tests, benchmarks, training) in one report folder.",
        formatter_class=argparse.ArgumentDefaultsHelpFormatter,
    )
    parser.add_argument(
        "--device",
        choices=("auto", "cuda", "cpu"),
        default="auto",
        help="cuda: the GPU report; cpu: the dry run (tiny sizes); auto: cuda when available",
    )
    parser.add_argument("--dry-run", action="store_true", help="tiny sizes on any device (implied by --device cpu)")
    parser.add_argument("--out", default="", help="report folder (default: docs/results/gpu-DEVICE-DATE)")
    parser.add_argument("--minutes", type=_positive_minutes, default=25.0, help="total time budget")
    return parser.parse_args(argv)


def _positive_minutes(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number of minutes, got '{text}'") from None
    if not 0 < value < 24 * 60:
        raise argparse.ArgumentTypeError(f"expected minutes between 0 and 1440, got {text}")
    return value


def resolve(args: argparse.Namespace) -> Settings:
    """The settings for the parsed flags; `--device cuda` without a usable CUDA is a usage error."""
    if args.device == "cpu":  # the dry run on one thread, set before torch starts (the planner keys on it)
        for variable in ("OMP_NUM_THREADS", "MKL_NUM_THREADS"):
            os.environ.setdefault(variable, "1")
    import torch

    device = args.device
    if device == "auto":
        device = "cuda" if torch.cuda.is_available() else "cpu"
    if device == "cuda" and not torch.cuda.is_available():
        built = f"torch {torch.__version__}" + ("" if torch.version.cuda else ", a build without CUDA")
        raise UsageError(
            f"python -m tdiag.gpu_report: error: argument --device: cuda is not available here ({built}); "
            "use --device cpu for the dry run"
        )
    return Settings.for_device(device, dry_run=args.dry_run or device == "cpu", minutes=args.minutes)


def default_out(environment: dict[str, Any], settings: Settings) -> Path:
    """docs/results/gpu-DEVICE-DATE under the working folder (the repository's root, as `make
    gpu-report` runs it), like `tdiag train`'s runs/."""
    name = slug(environment["device"]) if settings.device == "cuda" else "cpu-dry-run"
    return Path("docs") / "results" / f"gpu-{name}-{datetime.date.today().isoformat()}"


def main(argv: Sequence[str] | None = None) -> int:
    try:
        args = parse(argv)
        if args.out:
            from .files import check_output

            check_output(args.out, folder=True, flag="--out")
        settings = resolve(args)
    except UsageError as error:
        print(error, file=sys.stderr)
        return 2
    except TdiagError as error:
        print("\n".join(format_diagnostic(d) for d in error.diagnostics), file=sys.stderr)
        return 2
    command = "python -m tdiag.gpu_report " + " ".join(argv if argv is not None else sys.argv[1:])
    report = build(settings, command.strip(), log=lambda text: print(text, flush=True))
    out = Path(args.out) if args.out else default_out(report["environment"], settings)
    try:
        paths = write_report(out, report)
    except TdiagError as error:
        print("\n".join(format_diagnostic(d) for d in error.diagnostics), file=sys.stderr)
        return 1
    print(f"wrote {len(paths)} files to {out} in {report['seconds']:.0f} s")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
