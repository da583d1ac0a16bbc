"""A training run's settings (TrainConfig) and the `tdiag train` flags that fill them, apart from
tdiag.train so that building the command line never imports torch."""

from __future__ import annotations

import argparse
import dataclasses
import math
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from .design import DEFAULT_OBJECTIVE, OBJECTIVES
from .resources import default_corpus

DEFAULT_DATA = default_corpus()


@dataclass
class TrainConfig:
    design: str  # the .td file whose attention the model uses
    data: str = str(DEFAULT_DATA)  # UTF-8 text, plain or gzipped (default: the bundled Shakespeare)
    layers: int = 2  # transformer blocks
    width: int = 128  # model width: the design's F
    heads: int = 4  # the design's H, where it has one
    context: int = 128  # context length in characters: the size of the n and m legs
    batch: int = 16  # sequences per step (the global batch under DDP)
    steps: int = 2000  # optimizer steps (about two minutes on 2 CPU cores at the defaults)
    lr: float = 3e-3  # AdamW peak learning rate (cosine decay, 50 warm-up steps)
    eval_every: int = 200  # steps between evaluations and checkpoints
    eval_batches: int = 8  # validation batches per evaluation
    seed: int = 0  # parameters, batches and sampling
    sizes: dict[str, int] = field(default_factory=dict)  # the design's own sizes, e.g. {"M": 2}
    device: str = "auto"  # cpu, cuda, ... (auto: cuda when available)
    compile: bool = False  # torch.compile the model
    peak_tflops: float = 0.0  # the device's peak for MFU (0: from the device name where known)
    objective: str = DEFAULT_OBJECTIVE  # planning objective: "time" (estimated step time), "flops", "memory"
    out: str = ""  # run folder (default runs/<design>-<seed>)


# ---- values a flag (or a saved config.json) may take -----------------------------------------


def positive_int(text: str) -> int:
    """A whole number >= 1 (argparse type: a bad value is a usage error naming the flag)."""
    value = _int(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"expected a positive whole number, got {value}")
    return value


def natural_int(text: str) -> int:
    """A whole number >= 0."""
    value = _int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a whole number >= 0, got {value}")
    return value


MAX_SEED = 2**63 - 1 - 2**20  # torch seeds a generator with a 64-bit number; each layer takes seed + its index


def seed_int(text: str) -> int:
    """A seed: a whole number from 0 to MAX_SEED."""
    value = natural_int(text)
    if value > MAX_SEED:
        raise argparse.ArgumentTypeError(f"expected a whole number at most {MAX_SEED:,}, got {value:,}")
    return value


def run_folder_name(text: str) -> str:
    """--resume's run folder: a path, not nothing."""
    if not text:
        raise argparse.ArgumentTypeError("expected a run folder, got nothing")
    return text


def positive_float(text: str) -> float:
    """A finite number > 0 (`nan` and `inf` are refused: a learning rate of nan trains nothing)."""
    value = _float(text)
    if not value > 0:
        raise argparse.ArgumentTypeError(f"expected a positive number, got {text}")
    return value


def natural_float(text: str) -> float:
    """A finite number >= 0."""
    value = _float(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"expected a number >= 0, got {text}")
    return value


def objective_name(text: str) -> str:
    """A planning objective: time, flops or memory."""
    if text not in OBJECTIVES:
        raise argparse.ArgumentTypeError(f"unknown objective '{text}'; expected one of: {', '.join(OBJECTIVES)}")
    return text


def design_name(text: str) -> str:
    """A design: a .td file or a bundled design's name (whether it exists is checked on loading)."""
    if not text:
        raise argparse.ArgumentTypeError("expected a design file or a bundled design's name, got nothing")
    return text


DEVICE = re.compile(r"auto|cpu|mps|(cuda|xpu|hpu|npu|privateuseone)(:[0-9]+)?")


def device_name(text: str) -> str:
    """`auto`, `cpu`, `cuda`, `cuda:1`, ... (whether it exists is checked when the run starts)."""
    if not DEVICE.fullmatch(text):
        raise argparse.ArgumentTypeError(f"unknown device '{text}'; expected one of: auto, cpu, cuda, cuda:N, mps")
    return text


def _int(text: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a whole number, got '{text}'") from None


def _float(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected a number, got '{text}'") from None
    if not math.isfinite(value):
        raise argparse.ArgumentTypeError(f"expected a finite number, got {text}")
    return value


# The rule for each TrainConfig field a flag sets; config.json is held to the same rules on --resume.
RULES: dict[str, Callable[[str], object]] = {
    "layers": positive_int,
    "width": positive_int,
    "heads": positive_int,
    "context": positive_int,
    "batch": positive_int,
    "steps": positive_int,
    "eval_every": positive_int,
    "eval_batches": positive_int,
    "seed": seed_int,
    "lr": positive_float,
    "peak_tflops": natural_float,
    "device": device_name,
    "objective": objective_name,
    "design": design_name,
}


def config_problems(saved: Mapping[str, object], *, complete: bool = False) -> list[str]:
    """What is wrong with a saved run config (config.json), one line per field; [] when it is good.
    `complete`: every setting must be there (tdiag writes them all; one left out would silently
    take today's default, not the value the run was started with)."""
    fields = {f.name: f for f in dataclasses.fields(TrainConfig)}
    problems = [f"unknown setting '{k}'" for k in saved if k not in fields]
    required = fields if complete else ("design",)
    problems += [f"missing setting '{k}'" for k in required if k not in saved]
    for name, value in saved.items():
        if name not in fields:
            continue
        expected = {"int": int, "float": (int, float), "str": str, "bool": bool}.get(str(fields[name].type))
        if expected is not None and (not isinstance(value, expected) or (expected is int and isinstance(value, bool))):
            problems.append(f"{name} is {value!r}, not {a_type(str(fields[name].type))}")
            continue
        rule = RULES.get(name)
        try:
            if rule is not None:
                rule(str(value))
        except argparse.ArgumentTypeError as error:
            problems.append(f"{name}: {error}")
    sizes = saved.get("sizes", {})
    if not isinstance(sizes, dict) or not all(
        isinstance(k, str) and isinstance(v, int) and not isinstance(v, bool) and v > 0 for k, v in sizes.items()
    ):
        problems.append(f"sizes is {sizes!r}, not a mapping of size names to positive whole numbers")
    return problems


# ---- resuming: what a flag may change in a run already under way ----------------------------------

# Settings that do not alter the steps already taken: how many steps in all, how often and how
# thoroughly to evaluate, and where and how fast to run them. Every other setting is the run's.
RESUMABLE = ("steps", "eval_every", "eval_batches", "device", "compile", "peak_tflops")


def resume_refusals(started: TrainConfig, wanted: Mapping[str, object]) -> list[str]:
    """One line for each setting in `wanted` that differs from the run's and may not change on
    resume (a setting equal to the run's is fine); [] when every one may be applied."""
    refusals = []
    for name, value in wanted.items():
        if name in RESUMABLE or name == "out" or value == getattr(started, name):
            continue
        flag = {"sizes": "--set", "design": "the design"}.get(name, "--" + name.replace("_", "-"))
        refusals.append(
            f"{flag} cannot change on resume: the run was started with {name}={_shown(getattr(started, name))}"
        )
    return refusals


def resumed(started: TrainConfig, wanted: Mapping[str, Any]) -> TrainConfig:
    """The run's settings with the resumable ones of `wanted` applied (refuse the others first)."""
    return dataclasses.replace(started, **{k: v for k, v in wanted.items() if k in RESUMABLE})


def _shown(value: object) -> str:
    if isinstance(value, dict):
        return ",".join(f"{k}={v}" for k, v in value.items()) or "(none)"
    return str(value)


class _Given(argparse.Action):
    """Store a flag's value and note in `given` that the user gave it: --resume must tell a flag
    given at its default value (`--steps 2000`) from one left out."""

    def __call__(self, parser, namespace, values, option_string=None) -> None:  # type: ignore[override]
        setattr(namespace, self.dest, self.const if self.nargs == 0 else values)
        namespace.given = {*getattr(namespace, "given", ()), self.dest}


def given_settings(args: argparse.Namespace) -> dict[str, object]:
    """The TrainConfig settings the user gave explicitly on the command line, by field name."""
    named = getattr(args, "given", ())
    given = {f.name: getattr(args, f.name) for f in dataclasses.fields(TrainConfig) if f.name in named}
    if args.sizes:
        given["sizes"] = dict(args.sizes)
    return given


def a_type(name: str) -> str:
    return {"int": "a whole number", "float": "a number", "str": "text", "bool": "true or false"}.get(name, name)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `tdiag train` (and `python -m tdiag.train`), defaulting to TrainConfig's values."""
    defaults = TrainConfig(design="")
    parser.add_argument(
        "designs", nargs="*", metavar="FILE.td", help="a .td file, or a bundled design's name (e.g. fish)"
    )
    parser.add_argument(
        "--compare", action="store_true", help="train every design given with the same data and seed, and compare"
    )
    parser.add_argument(
        "--resume",
        type=run_folder_name,
        metavar="RUN",
        help="continue the run in this folder from its checkpoint (default: a new run)",
    )
    parser.add_argument(
        "--seeds",
        type=positive_int,
        default=1,
        help="with --compare: train each design with this many seeds (--seed, --seed + 1, ...) and give "
        "its loss's mean and spread",
    )
    parser.add_argument("--overwrite", action="store_true", help="replace a run already in the run folder")
    parser.add_argument("--nproc", type=positive_int, default=1, help="data-parallel processes (runs torchrun)")
    parser.add_argument(
        "--data",
        default=defaults.data,
        action=_Given,
        metavar="TEXT",
        help="UTF-8 text to model, plain or gzipped (default: the bundled Shakespeare corpus, %(default)s)",
    )
    helps = {
        "layers": "transformer blocks",
        "width": "model width: the design's F",
        "heads": "the design's H, where it has one",
        "context": "context length in characters: the size of the n and m legs",
        "batch": "sequences per step (the global batch under --nproc)",
        "steps": "optimizer steps (with --resume: the new total)",
        "eval_every": "steps between evaluations and checkpoints",
        "eval_batches": "validation batches per evaluation",
        "seed": "seed of parameters, batches and sampling",
    }
    for name, text in helps.items():
        parser.add_argument(
            f"--{name.replace('_', '-')}", type=RULES[name], default=getattr(defaults, name), action=_Given, help=text
        )
    parser.add_argument(
        "--lr",
        type=positive_float,
        default=defaults.lr,
        action=_Given,
        help="AdamW peak learning rate (cosine decay, 50 warm-up)",
    )
    parser.add_argument(
        "--device",
        type=device_name,
        default=defaults.device,
        action=_Given,
        help="cpu, cuda, cuda:N, mps; auto: cuda when available",
    )
    parser.add_argument("--compile", action=_Given, nargs=0, const=True, default=False, help="torch.compile the model")
    parser.add_argument(
        "--peak-tflops",
        type=natural_float,
        default=0.0,
        action=_Given,
        help="device peak for MFU; 0: a known GPU's bf16 data-sheet figure",
    )
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default=DEFAULT_OBJECTIVE,
        action=_Given,
        help="planning objective: time (estimated step time), flops or memory (fused attention kernels)",
    )
    parser.add_argument(
        "--out",
        default="",
        help="run folder (default: runs/DESIGN-seedSEED; with --compare the comparison's folder, runs/compare)",
    )
    parser.add_argument(
        "--no-progress", action="store_true", help="no progress bar (the line of each evaluation is printed either way)"
    )


def config_from(args: argparse.Namespace, design: str, sizes: dict[str, int]) -> TrainConfig:
    """The settings of one design's run from parsed `tdiag train` flags; under --compare each
    design's run folder is chosen by the caller."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields and k not in ("design", "sizes", "out")}
    return TrainConfig(design=design, sizes=sizes, out=args.out if not args.compare else "", **values)
