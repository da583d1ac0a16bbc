"""A training run's settings (TrainConfig) and the `tdiag train` flags that fill them, apart from
tdiag.train so that building the command line never imports torch."""

from __future__ import annotations

import argparse
import dataclasses
from dataclasses import dataclass, field
from pathlib import Path

from .design import OBJECTIVES

DEFAULT_DATA = Path(__file__).resolve().parent.parent.parent / "shared" / "data" / "shakespeare_gut.txt.gz"


@dataclass
class TrainConfig:
    design: str  # the .td file whose attention the model uses
    data: str = str(DEFAULT_DATA)  # UTF-8 text, plain or gzipped
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
    objective: str = "flops"  # planning objective: "memory" prefers fused attention kernels
    out: str = ""  # run folder (default runs/<design>-<seed>)


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """The flags of `tdiag train` (and `python -m tdiag.train`), defaulting to TrainConfig's values."""
    defaults = TrainConfig(design="")
    parser.add_argument("designs", nargs="*", metavar="FILE.td")
    parser.add_argument("--compare", action="store_true", help="train every design given and compare them")
    parser.add_argument("--resume", metavar="RUN", help="continue the run in this folder from its checkpoint")
    parser.add_argument("--nproc", type=int, default=1, help="data-parallel processes (runs torchrun)")
    parser.add_argument("--data", default=defaults.data)
    for name in ("layers", "width", "heads", "context", "batch", "steps", "eval_every", "eval_batches", "seed"):
        parser.add_argument(f"--{name.replace('_', '-')}", type=int, default=getattr(defaults, name))
    parser.add_argument("--lr", type=float, default=defaults.lr)
    parser.add_argument("--device", default=defaults.device)
    parser.add_argument("--compile", action="store_true", help="torch.compile the model")
    parser.add_argument(
        "--peak-tflops", type=float, default=0.0, help="device peak for MFU (default: known GPUs' bf16 data sheet)"
    )
    parser.add_argument(
        "--objective",
        choices=OBJECTIVES,
        default="flops",
        help="planning objective: flops (default), memory (fused attention kernels) or time (estimated step time)",
    )
    parser.add_argument("--out", default="", help="run folder (compare: the folder for the comparison)")
    parser.add_argument("--no-progress", action="store_true")


def config_from(args: argparse.Namespace, design: str, sizes: dict[str, int]) -> TrainConfig:
    """The settings of one design's run from parsed `tdiag train` flags; under --compare each
    design's run folder is chosen by the caller."""
    fields = {f.name for f in dataclasses.fields(TrainConfig)}
    values = {k: v for k, v in vars(args).items() if k in fields and k not in ("design", "sizes", "out")}
    return TrainConfig(design=design, sizes=sizes, out=args.out if not args.compare else "", **values)
