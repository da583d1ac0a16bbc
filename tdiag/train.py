"""Train any design as the attention of a small decoder-only character language model
(design notes §7). One process or data-parallel under torchrun (gloo on CPU, NCCL on GPU).
Each run writes a folder (locked while it runs, see tdiag.runs): config.json, a copy of the
design's files, log.csv and log.jsonl (every evaluation), checkpoint.pt (resumable, written at
the start, at every evaluation and on Ctrl-C or SIGTERM: always the state of a completed step, so
that a resumed run takes the steps an uninterrupted one takes), loss.png and sample.txt.

    tdiag train designs/fish.td
    tdiag train --compare designs/mhsa.td designs/thsa.td designs/fish.td
    torchrun --nproc_per_node=2 -m tdiag.train designs/mhsa.td"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import hashlib
import json
import math
import os
import signal
import statistics
import sys
import time
from collections.abc import Iterator
from contextlib import ExitStack, contextmanager
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as functional
from torch import nn

import tdiag

from .decode import DecodeCache, NotDecodableError
from .device import data_sheet
from .errors import Diagnostic, TdiagError
from .files import node_kind
from .runs import (
    claim_folder,
    config_text,
    copy_design,
    design_copy,
    read_run_config,
    recorded_design,
    write_atomically,
    writing,
)
from .train_config import RESUMABLE, TrainConfig, resume_refusals

# ---- data ------------------------------------------------------------------------------------


@dataclass
class Corpus:
    """Characters as integer ids, split 90/10 into training and validation text."""

    chars: list[str]
    train: torch.Tensor
    val: torch.Tensor
    sha256: str = ""  # of the file's bytes: a resumed run must read the text its run was started with

    @property
    def vocab(self) -> int:
        return len(self.chars)

    def decode(self, ids: list[int]) -> str:
        return "".join(self.chars[i] for i in ids)

    def unigram_loss(self) -> float:
        """Cross-entropy of the validation text under the training text's character frequencies:
        the loss a model that ignores context reaches."""
        counts = torch.bincount(self.train, minlength=self.vocab).double() + 1.0
        log_p = (counts / counts.sum()).log()
        return float(-log_p[self.val].mean())


def read_corpus(path: str, context: int) -> Corpus:
    """A UTF-8 text file as character ids, split 90/10; gzipped files (by their magic bytes,
    whatever their name) are decompressed."""
    file = Path(path)
    kind = node_kind(file)
    if kind is not None:  # a FIFO or a device would block a read or never end
        raise TdiagError(Diagnostic(f"cannot read data file '{path}': it is {kind}, not a text file"))
    if not file.is_file():
        raise TdiagError(
            Diagnostic(f"no data file '{path}'", hint="pass --data PATH to a UTF-8 text file (.txt or .gz)")
        )
    try:
        raw = file.read_bytes()
        text = (gzip.decompress(raw) if raw[:2] == b"\x1f\x8b" else raw).decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError) as error:
        raise TdiagError(Diagnostic(f"cannot read '{path}' as UTF-8 text: {error}")) from None
    if not text.strip():
        raise TdiagError(Diagnostic(f"data file '{path}' is empty"))
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(ids))
    corpus = Corpus(chars, ids[:split], ids[split:], hashlib.sha256(raw).hexdigest())
    if len(corpus.val) <= context + 1:
        raise TdiagError(
            Diagnostic(
                f"the context ({context} characters) is longer than the validation text ({len(corpus.val)} characters)",
                hint="use a shorter --context or a longer data file",
            )
        )
    return corpus


def batch_at(data: torch.Tensor, starts: torch.Tensor, context: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows = starts[:, None] + torch.arange(context + 1)
    chunk = data[rows]
    return chunk[:, :-1], chunk[:, 1:]


# ---- model -----------------------------------------------------------------------------------


class Block(nn.Module):
    def __init__(self, attention: nn.Module, width: int):
        super().__init__()
        self.norm1, self.norm2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attention = attention
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor, cache: DecodeCache | None = None) -> torch.Tensor:
        x = x + (self.attention(self.norm1(x)) if cache is None else self.attention(self.norm1(x), cache=cache))
        return x + self.mlp(self.norm2(x))


class LanguageModel(nn.Module):
    """Token and position embeddings, pre-norm blocks with the compiled design as attention."""

    def __init__(self, attentions: list[nn.Module], vocab: int, width: int, context: int):
        super().__init__()
        self.tokens = nn.Embedding(vocab, width)
        self.positions = nn.Embedding(context, width)
        self.blocks = nn.ModuleList(Block(a, width) for a in attentions)
        self.norm = nn.LayerNorm(width)
        self.head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor, caches: list[DecodeCache] | None = None) -> torch.Tensor:
        """Logits at the positions of `ids`; with `caches` (one per block, `new_caches()`), those
        positions follow the ones the caches hold, and the caches are extended by them."""
        start = caches[0].length if caches else 0
        x = self.tokens(ids) + self.positions(torch.arange(start, start + ids.shape[-1], device=ids.device))
        for k, block in enumerate(self.blocks):
            x = block(x, caches[k] if caches else None)
        return self.head(self.norm(x))

    def new_caches(self) -> list[DecodeCache] | None:
        """A decoding cache per block (tdiag/decode.py), or None where some block's design cannot
        decode with one exactly as the model is run here: a design that reads the run-time length
        as a number (its outputs depend on how many positions are given, and sampling gives it the
        whole context) or one no cache serves."""
        try:
            caches = [DecodeCache(block.attention) for block in self.blocks]
        except NotDecodableError:
            return None
        return None if any(cache.rule.reads_length for cache in caches) else caches


def design_for(config: TrainConfig, source: str | None = None) -> tdiag.Design:
    """The causal design at the model's sizes; its input and output width must be the model's.
    `source`: the file to read it from (a resumed run's copy), else `config.design`."""
    source = source or config.design
    base = tdiag.load(source)
    graph = base.graph
    if len(graph.inputs) != 1 or len(graph.outputs) != 1:
        inputs = ", ".join(t.name for t in graph.inputs) or "none"
        raise TdiagError(
            Diagnostic(
                f"design '{base.name}' has {len(graph.inputs)} input(s) ({inputs}) and {len(graph.outputs)} "
                "output(s); tdiag train runs a causal language model, whose layers take one input "
                "sequence and give one output",
                (graph.inputs[1].span if len(graph.inputs) > 1 else graph.tensors[graph.outputs[-1]].span,),
                "a cross-attention needs a second sequence (an encoder's output); train it in your own model, "
                "with design.module()",
            )
        )
    sizes = dict(config.sizes)
    if "F" in base.graph.sizes and "F" not in sizes:
        sizes["F"] = config.width
    if "H" in base.graph.sizes and "H" not in sizes:
        sizes["H"] = config.heads
    if "N" in base.graph.sizes and not base.graph.sizes["N"].is_free:
        sizes["N"] = config.context
    design = tdiag.load(source, **sizes).with_causal_mask()
    graph = design.graph
    x, y = graph.inputs[0], graph.tensors[graph.outputs[0]]
    widths = {int(graph.evaluate(x.axes[-1].size)), int(graph.evaluate(y.axes[-1].size))}
    if widths != {config.width}:
        raise TdiagError(
            Diagnostic(
                f"design '{design.name}' maps width {sorted(widths)} but the model width is {config.width}",
                (x.span,),
                "give the design's width size the model width, e.g. --set F=" + str(config.width),
            )
        )
    return design


def build_model(
    config: TrainConfig, vocab: int, device: torch.device, source: str | None = None
) -> tuple[LanguageModel, tdiag.Design]:
    design = design_for(config, source)
    first = design.module(seed=config.seed, N=config.context, device=device, objective=config.objective)
    _check_model_fits(config, vocab, sum(p.numel() for p in first.parameters()))
    attentions = [first] + [
        design.module(seed=config.seed + k, N=config.context, device=device, objective=config.objective)
        for k in range(1, config.layers)
    ]
    torch.manual_seed(config.seed)
    model = LanguageModel(attentions, vocab, config.width, config.context).to(device)
    return model, design


def _check_model_fits(config: TrainConfig, vocab: int, attention_parameters: int) -> None:
    """Refuse, before the layers are built, a model whose parameters, gradients and AdamW's two
    moments (four float32 copies) would not fit in memory (tdiag.LIMITS, the machine's own)."""
    width = config.width
    block = attention_parameters + 8 * width * width + 9 * width  # + the 4x MLP and two LayerNorms
    parameters = config.layers * block + (2 * vocab + config.context + 2) * width
    needed, limit = 4 * 4 * parameters, tdiag.LIMITS.bytes_limit()
    if needed > limit:
        raise TdiagError(
            Diagnostic(
                f"the model ({config.layers:,} layers of width {width:,}, {parameters:,} parameters) would need "
                f"{needed / 2**30:,.1f} GiB for its parameters, gradients and optimizer state, more than the "
                f"{limit / 2**30:,.1f} GiB available",
                hint="use fewer --layers, a smaller --width or --context (or raise tdiag.LIMITS.max_bytes)",
            )
        )


def flops_per_step(config: TrainConfig, design: tdiag.Design, vocab: int) -> int:
    """Training FLOPs of one step from tdiag's own cost of the attention, plus the MLPs, the
    output head and 2x for the backward pass."""
    attention = design.cost(objective=config.objective, N=config.context).at(N=config.context)["flops"]
    mlp = 2 * config.context * 2 * config.width * 4 * config.width
    head = 2 * config.context * config.width * vocab
    forward = config.layers * (attention + mlp) + head
    return int(3 * forward * config.batch)


# ---- training ----------------------------------------------------------------------------------


@dataclass
class Distributed:
    rank: int = 0
    world: int = 1
    started: bool = False  # this call started the process group, so its caller ends it

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def setup_distributed(device: torch.device) -> Distributed:
    """The torchrun process group (started here, or the one already running: --compare trains
    several designs in one group); one process without torchrun."""
    if "RANK" not in os.environ:
        return Distributed()
    import torch.distributed as dist

    started = not dist.is_initialized()
    if started:
        dist.init_process_group("nccl" if device.type == "cuda" else "gloo")
    return Distributed(dist.get_rank(), dist.get_world_size(), started)


def teardown_distributed(dist: Distributed, *, wait: bool) -> None:
    """End the process group `dist` started, while the interpreter is alive: gloo work still held
    when Python exits aborts the process. `wait` first lets every process finish (not after an
    interrupt, where a peer may never arrive)."""
    if not dist.started:
        return
    import torch.distributed

    if wait:
        torch.distributed.barrier()
    torch.distributed.destroy_process_group()


def resolve_device(name: str) -> torch.device:
    """`auto` -> cuda when available, else cpu; a device this machine lacks is a clear error."""
    if name == "auto":
        name = "cuda" if torch.cuda.is_available() else "cpu"
    if name.startswith("cuda") and "LOCAL_RANK" in os.environ:
        name = f"cuda:{os.environ['LOCAL_RANK']}"
    try:
        device = torch.device(name)
    except RuntimeError:
        raise TdiagError(Diagnostic(f"unknown device '{name}'", hint="use --device cpu, cuda or cuda:N")) from None
    if device.type != "cpu":
        try:
            torch.empty(0, device=device)
        except (RuntimeError, AssertionError, AttributeError):  # torch's "not compiled with" / "no device"
            raise TdiagError(
                Diagnostic(f"device '{name}' is not available on this machine", hint="use --device cpu (or auto)")
            ) from None
    return device


def global_batch(generator: torch.Generator, data: torch.Tensor, config: TrainConfig, rank: int, world: int):
    """The same global batch on every rank (one generator), each rank taking its slice."""
    starts = torch.randint(len(data) - config.context - 1, (config.batch,), generator=generator)
    share = config.batch // world
    return batch_at(data, starts[rank * share : (rank + 1) * share], config.context)


def loss_of(model: nn.Module, x: torch.Tensor, y: torch.Tensor, device: torch.device) -> torch.Tensor:
    with torch.autocast(device.type, dtype=torch.bfloat16, enabled=device.type == "cuda"):
        logits = model(x.to(device))
    return functional.cross_entropy(logits.float().flatten(0, 1), y.to(device).flatten())


@torch.no_grad()
def evaluate(model: nn.Module, corpus: Corpus, config: TrainConfig, device: torch.device) -> float:
    model.eval()
    generator = torch.Generator().manual_seed(1234)
    losses = []
    for _ in range(config.eval_batches):
        starts = torch.randint(len(corpus.val) - config.context - 1, (config.batch,), generator=generator)
        losses.append(float(loss_of(model, *batch_at(corpus.val, starts, config.context), device)))
    model.train()
    return sum(losses) / len(losses)


@torch.no_grad()
def sample(
    model: LanguageModel,
    corpus: Corpus,
    config: TrainConfig,
    device: torch.device,
    length: int = 400,
    prompt: list[int] | None = None,
    seed: int | None = None,
    use_cache: bool = True,
) -> str:
    """Text drawn from the model after `prompt` (character ids; by default the first context of
    the training text); where its outputs are not finite numbers (a diverged run), the text so far
    and a line saying so. While the text fits in the context, each new character is computed from
    the decoding caches of the model's layers (`use_cache`, where the design has one), else the
    model is re-run over the last `context` characters (padded to the context) for each new one;
    both draw the same characters."""
    model.eval()
    generator = torch.Generator(device="cpu").manual_seed(config.seed if seed is None else seed)
    ids = corpus.train[: config.context].tolist() if prompt is None else list(prompt)
    out: list[int] = []
    ending = ""
    caches = model.new_caches() if use_cache else None
    fed = 0  # the characters the caches hold
    for _ in range(length):
        if caches is not None and len(ids) <= config.context:
            with torch.no_grad():
                logits = model(torch.tensor(ids[fed:], device=device)[None], caches)
            fed, last = len(ids), logits[0, -1]
        else:
            window = torch.tensor(ids[-config.context :], device=device)[None]
            with torch.no_grad():
                logits = model(torch.cat([window, window.new_zeros(1, config.context - window.shape[1])], 1))
            last = logits[0, window.shape[1] - 1]
        probabilities = last.float().softmax(-1).cpu()
        if not torch.isfinite(probabilities).all():
            ending = (
                "\n[sampling stopped: the model's outputs are not finite numbers; the run diverged, try a lower --lr]\n"
            )
            break
        token = int(torch.multinomial(probabilities, 1, generator=generator))
        ids.append(token)
        out.append(token)
    model.train()
    return corpus.decode(out) + ending


def generate(folder: Path, prompt: str, length: int = 400, seed: int = 0, device: str = "cpu") -> str:
    """`length` characters drawn after `prompt` from the model of a run folder's last checkpoint
    (its design copy, its data's alphabet); a prompt character the data never has is an error
    naming it."""
    config, copy, data_sha256 = read_run_config(folder)
    config = dataclasses.replace(config, device=device)
    corpus = read_corpus(config.data, config.context)
    if corpus.sha256 != data_sha256:
        raise TdiagError(
            Diagnostic(
                f"data file '{config.data}' differs from the text the run in '{folder}' was trained on",
                hint="its characters would map to other ids; restore that text",
            )
        )
    if not prompt:
        raise TdiagError(Diagnostic("the prompt is empty", hint="give at least one character with --prompt"))
    index = {c: i for i, c in enumerate(corpus.chars)}
    for position, char in enumerate(prompt):
        if char not in index:
            raise TdiagError(
                Diagnostic(
                    f"the prompt's character {char!r} (at {position}) never occurs in the data '{config.data}'",
                    hint="the model knows only the characters of the text it was trained on",
                )
            )
    target = resolve_device(device)
    model, _ = build_model(config, corpus.vocab, target, str(design_copy(folder, copy)))
    _load_checkpoint(folder, model, torch.optim.AdamW(model.parameters()), config)
    return sample(model, corpus, config, target, length, [index[c] for c in prompt], seed)


def warmup_steps(config: TrainConfig) -> int:
    """Linear warm-up: 50 steps, but never more than a tenth of the run (at least one step)."""
    return max(1, min(50, config.steps // 10))


def learning_rate(step: int, config: TrainConfig) -> float:
    """Step `step`'s learning rate (from 0): linear warm-up, then a cosine to a tenth of `lr`."""
    warmup = warmup_steps(config)
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def run_folder(config: TrainConfig) -> Path:
    return Path(config.out or f"runs/{Path(config.design).stem}-seed{config.seed}")


def recorded(config: TrainConfig) -> TrainConfig:
    """The settings as a run records them: the design by bundled name or absolute path and the
    data by absolute path, so that they mean the same from whatever folder the run is resumed."""
    return dataclasses.replace(config, design=recorded_design(config.design), data=str(Path(config.data).resolve()))


def _is_main_process() -> bool:
    """Under torchrun only rank 0 owns the run folder: it locks it and writes it."""
    return os.environ.get("RANK", "0") == "0"


def train(config: TrainConfig, *, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict:
    """Train, evaluate every `eval_every` steps, checkpoint, and return the final summary. The run
    folder is locked for the run's life. A folder holding another run is refused unless `resume`
    (continue it: `config` may change only the RESUMABLE settings of the run in it) or `overwrite`."""
    folder = run_folder(config)
    config = recorded(config)
    device = resolve_device(config.device)
    with ExitStack() as held:
        held.enter_context(subnormals_flushed(device))
        if _is_main_process():
            held.enter_context(claim_folder(folder, resume=resume, overwrite=overwrite))
        return _train(config, folder, device, resume=resume, progress=progress)


@contextmanager
def subnormals_flushed(device: torch.device) -> Iterator[None]:
    """On a CPU, subnormal floats (below 2^-126 in float32) flushed to zero for the run, then the
    mode restored: x86 cores multiply and add them tens of times slower, and a softmax over
    ALiBi's distances or an exponential decay over many positions makes many (alibi 1.5-2.8x,
    forgetting_attention 2.2-2.7x, lightning 1.9x faster per training step with them flushed,
    docs/results/bench-cpu/denormals). No value above 2^-126 changes."""
    if device.type != "cpu" or _flushing():
        yield
        return
    torch.set_flush_denormal(True)
    try:
        yield
    finally:
        torch.set_flush_denormal(False)


def _flushing() -> bool:
    """Whether this thread already flushes subnormals (torch has no getter for the mode)."""
    return bool(torch.tensor([2.0**-140]).mul(1.0).item() == 0.0)


def _train(config: TrainConfig, folder: Path, device: torch.device, *, resume: bool, progress: bool) -> dict:
    dist = setup_distributed(device)
    if config.batch % dist.world:
        raise TdiagError(Diagnostic(f"--batch {config.batch} does not split over {dist.world} processes"))
    corpus = read_corpus(config.data, config.context)
    source, copy = config.design, None
    if resume:  # every check before anything is written
        source, copy = _resumed_design(folder, config, corpus)
    model, design = build_model(config, corpus.vocab, device, source)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
    started = resume and _killed_before_first_checkpoint(folder)
    if resume and not started:
        done = _load_checkpoint(folder, model, optimizer, config)
        if done.step > config.steps:
            raise TdiagError(
                Diagnostic(
                    f"the run in '{folder}' has completed {done.step} steps, more than --steps {config.steps}",
                    hint=f"give --steps {done.step} or more",
                )
            )
    else:
        done = Progress(0, [], torch.Generator().manual_seed(config.seed).get_state(), *_noise_state(device))
    network = model
    if dist.world > 1:
        network = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if config.compile:
        network = torch.compile(network)
    summary = {
        "design": design.name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "attention_parameters": sum(p.numel() for b in model.blocks for p in b.attention.parameters()),
        "flops_per_step": flops_per_step(config, design, corpus.vocab),
        "unigram_val_loss": corpus.unigram_loss(),
    }
    if dist.is_main:
        if copy is None:
            copy = copy_design(source, folder)
        with writing(folder / "config.json"):
            write_atomically(folder / "config.json", config_text(config, copy, corpus.sha256, summary))
        if not resume or started:  # a run killed before its first evaluation resumes from its start
            _save_checkpoint(folder, model, optimizer, done, config)
    run = _Run(config, folder, device, dist, corpus, model, optimizer, summary)
    completed = False
    try:
        done, pace = run.steps(network, done, progress)
        completed = True
    finally:
        network = None  # DDP's reducer holds gloo work; it goes before the group
        teardown_distributed(dist, wait=completed)
    summary |= {"final_val_loss": done.log[-1]["val_loss"] if done.log else None, **pace.report()}
    if dist.is_main:
        with writing(folder / "sample.txt"):
            write_atomically(folder / "sample.txt", sample(model, corpus, config, device).encode())
        with writing(folder / "summary.json"):
            write_atomically(folder / "summary.json", json.dumps(summary, indent=2).encode())
        with writing(folder / "loss.png"):
            _plot(folder, done.log, design.name, done.steps)
    return summary | {"log": done.log, "folder": str(folder), "config": dataclasses.asdict(recorded(config))}


def _resumed_design(folder: Path, config: TrainConfig, corpus: Corpus) -> tuple[str, dict]:
    """The run's design, read from its copy in the run folder, once `config` is found to be the
    run's own (only RESUMABLE settings may differ from config.json's) and its data the same text."""
    started, copy, data_sha256 = read_run_config(folder)
    wanted = {f.name: getattr(config, f.name) for f in dataclasses.fields(config)}
    refusals = resume_refusals(started, wanted)
    if refusals:
        raise TdiagError([Diagnostic(f"cannot resume the run in '{folder}': {r}") for r in refusals])
    if corpus.sha256 != data_sha256:
        raise TdiagError(
            Diagnostic(
                f"data file '{config.data}' differs from the text the run in '{folder}' was started with",
                hint="restore that text, or start a new run on this one",
            )
        )
    return str(design_copy(folder, copy)), copy


def _killed_before_first_checkpoint(folder: Path) -> bool:
    """A run folder with a config (checked already) but neither a checkpoint nor a log: its run
    was stopped between writing config.json and its step-0 checkpoint, so it resumes from step 0.
    A folder with a log but no checkpoint lost its checkpoint: that is an error, not a restart."""
    return not any((folder / name).exists() for name in ("checkpoint.pt", "log.jsonl", "log.csv"))


@dataclass
class Progress:
    """The state of a run as of its last completed step, besides the model and the optimizer:
    what a checkpoint holds, so that a resumed run takes the very steps an uninterrupted one would."""

    step: int
    log: list[dict]
    batches: torch.Tensor  # the batch generator's state: the next step's batch is drawn from it
    noise: torch.Tensor  # torch's own generator, which the designs' `random` tensors draw from
    noise_cuda: torch.Tensor | None  # the device's generator, on CUDA
    steps: list[dict] = dataclasses.field(default_factory=list)  # every step's training loss (STEP_FIELDS)


def _noise_state(device: torch.device) -> tuple[torch.Tensor, torch.Tensor | None]:
    cuda = torch.cuda.get_rng_state(device) if device.type == "cuda" else None
    return torch.get_rng_state(), cuda


@dataclass
class _Pace:
    """Tokens per second and model FLOP/s of the training steps so far (evaluations excluded)."""

    flops_per_step: int
    tokens_per_step: int
    peak: float  # the devices' peak FLOP/s; 0 where unknown (MFU not reported)
    steps: int = 0
    seconds: float = 0.0

    def add(self, seconds: float) -> None:
        self.steps += 1
        self.seconds += seconds

    @property
    def rate(self) -> float:
        return self.steps * self.tokens_per_step / self.seconds if self.seconds else 0.0

    @property
    def achieved(self) -> float:
        return self.flops_per_step * self.steps / self.seconds if self.seconds else 0.0

    def report(self) -> dict:
        mfu = self.achieved / self.peak if self.peak else None
        return {
            "tokens_per_s": self.rate,
            "model_flops_per_s": self.achieved,
            "peak_flops_per_s": self.peak or None,
            "mfu": mfu,
        }


@dataclass
class _Run:
    """One run's fixed parts, for the loop over its steps."""

    config: TrainConfig
    folder: Path
    device: torch.device
    dist: Distributed
    corpus: Corpus
    model: LanguageModel
    optimizer: torch.optim.Optimizer
    summary: dict
    updating: bool = False  # inside a step's update: the model and optimizer are neither before nor after it

    def steps(self, network: nn.Module, done: Progress, progress: bool) -> tuple[Progress, _Pace]:
        """Train from `done` to the last step. A step changes nothing that is kept (model,
        optimizer, generators' record) until its update, and Ctrl-C or SIGTERM during the update
        wait for it to end: the checkpoint written on interrupt is the last completed step."""
        generator = self._restore_generators(done)
        peak = peak_flops(self.device, self.config.peak_tflops) * self.dist.world
        pace = _Pace(self.summary["flops_per_step"], self.config.batch * self.config.context, peak)
        saved = done.step
        # a bar only on a terminal (nohup, slurm, a redirect get none); the evaluation lines always
        bar = _progress(self.config, done.step, enabled=progress and self.dist.is_main and sys.stderr.isatty())
        try:
            with _Interrupts() as interrupts:
                while done.step < self.config.steps:
                    started = time.perf_counter()
                    loss = self._gradients(network, generator)
                    with interrupts.held():
                        done, train_loss = self._update(done, loss, generator, pace, started)
                        bar.update(1)
                        bar.set_postfix(**self._postfix(train_loss, done, pace))
                        if done.log and done.log[-1]["step"] == done.step and self.dist.is_main:
                            _save_checkpoint(self.folder, self.model, self.optimizer, done, self.config)
                            _write_log(self.folder, done.log, done.steps)
                            saved = done.step
                            _print_above(bar, _evaluation_line(done, self.config))
        except KeyboardInterrupt:
            raise self._interrupted(done, saved) from None
        finally:
            bar.close()
        return done, pace

    def _restore_generators(self, done: Progress) -> torch.Generator:
        """The batch generator, and torch's own generators, as of the last completed step."""
        generator = torch.Generator()
        generator.set_state(done.batches)
        torch.set_rng_state(done.noise)
        if done.noise_cuda is not None and self.device.type == "cuda":
            torch.cuda.set_rng_state(done.noise_cuda, self.device)
        return generator

    def _gradients(self, network: nn.Module, generator: torch.Generator) -> torch.Tensor:
        """Draw the step's batch and compute its gradients (clipped); the loss, still on the device."""
        config = self.config
        x, y = global_batch(generator, self.corpus.train, config, self.dist.rank, self.dist.world)
        loss = loss_of(network, x, y, self.device)
        self.optimizer.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.model.parameters(), 1.0)
        return loss

    def _update(
        self, done: Progress, loss: torch.Tensor, generator: torch.Generator, pace: _Pace, started: float
    ) -> tuple[Progress, float]:
        """Apply the step's update, evaluate when due, and record the step as completed: the only
        part of a step that changes what is kept (`updating` says when it was cut short)."""
        self.updating = True
        for group in self.optimizer.param_groups:
            group["lr"] = learning_rate(done.step, self.config)
        self.optimizer.step()
        train_loss = float(loss.detach())  # waits for the device: the step's time is complete
        pace.add(time.perf_counter() - started)
        step = done.step + 1
        log = done.log
        steps = [*done.steps, {"step": step, "train_loss": train_loss, "lr": self.optimizer.param_groups[0]["lr"]}]
        if step % self.config.eval_every == 0 or step == self.config.steps:
            log = [*log, self._entry(step, train_loss, pace)]
        done = Progress(step, log, generator.get_state(), *_noise_state(self.device), steps=steps)
        self.updating = False
        return done, train_loss

    def _entry(self, step: int, train_loss: float, pace: _Pace) -> dict:
        return {
            "step": step,
            "train_loss": train_loss,
            "val_loss": evaluate(self.model, self.corpus, self.config, self.device),
            "tokens_per_s": pace.rate,
            "model_flops_per_s": pace.achieved,
            "mfu": pace.achieved / pace.peak if pace.peak else None,
            "flops": pace.flops_per_step * step,
        }

    def _postfix(self, train_loss: float, done: Progress, pace: _Pace) -> dict[str, str]:
        shown = {"train": f"{train_loss:.3f}"}
        if done.log and done.log[-1]["step"] == done.step:
            shown["val"] = f"{done.log[-1]['val_loss']:.3f}"
        return shown | {"tok_s": f"{pace.rate:,.0f}"} | _mfu_postfix(pace.achieved, pace.peak)

    def _interrupted(self, done: Progress, saved: int) -> TdiagError:
        """Checkpoint the last completed step (unless an update was cut in half: then the
        checkpoint already written is the last whole state) and say where the run stands."""
        folder = self.folder
        if self.updating:
            message = (
                f"training interrupted inside the update of step {done.step + 1}; "
                f"the checkpoint in '{folder}' holds step {saved}"
            )
        else:
            if self.dist.is_main and done.step != saved:
                _save_checkpoint(folder, self.model, self.optimizer, done, self.config)
                if done.log or done.steps:
                    _write_log(folder, done.log, done.steps)
            message = (
                f"training interrupted at step {done.step}; the checkpoint in '{folder}' holds every completed step"
            )
        return TdiagError(Diagnostic(message, hint=f"resume with: tdiag train --resume {folder}"))


class _Interrupts:
    """Ctrl-C (SIGINT) and `kill` (SIGTERM) while training. Between updates they stop the run at
    once (KeyboardInterrupt); during one (`held`) just after it, so that no step is half applied.
    A second signal during an update stops the run at once."""

    def __init__(self) -> None:
        self.holding = False
        self.pending = False
        self.previous: dict[int, object] = {}

    def __enter__(self) -> _Interrupts:
        for number in (signal.SIGINT, signal.SIGTERM):
            try:
                self.previous[number] = signal.signal(number, self._signalled)
            except ValueError:  # not the main thread: signals are left as they are
                pass
        return self

    def __exit__(self, *exc: object) -> None:
        for number, handler in self.previous.items():
            if handler is not None:
                signal.signal(number, handler)  # type: ignore[arg-type]

    def _signalled(self, signum: int, frame: object) -> None:
        if self.holding and not self.pending:
            self.pending = True
            return
        raise KeyboardInterrupt

    @contextmanager
    def held(self) -> Iterator[None]:
        self.holding = True
        try:
            yield
        finally:
            self.holding = False
        if self.pending:
            self.pending = False
            raise KeyboardInterrupt


def _progress(config: TrainConfig, start: int, enabled: bool):
    from tqdm import tqdm

    return tqdm(
        total=config.steps,
        initial=start,
        disable=not enabled,
        desc=Path(config.design).stem,
        unit="step",
        dynamic_ncols=True,
    )


def _print_above(bar, line: str) -> None:
    """A line on stdout, above the progress bar where one is drawn (tqdm clears and redraws it):
    the log a batch job keeps, whatever the bar does."""
    bar.write(line, file=sys.stdout)
    sys.stdout.flush()


def _save_checkpoint(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, done: Progress, config) -> None:
    """Tensors and plain data only (dicts, lists, numbers, text), so resuming loads it with
    `weights_only=True` and a checkpoint can never run code. A failed write keeps the old one."""
    import io

    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": done.step, "log": done.log}
    state |= {"steps": done.steps}
    state |= {"generator": done.batches, "rng": done.noise, "rng_cuda": done.noise_cuda}
    state |= {"config": dataclasses.asdict(config)}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    path = folder / "checkpoint.pt"
    with writing(path):
        write_atomically(path, buffer.getvalue())


LOG_FIELDS = ("step", "train_loss", "val_loss", "tokens_per_s", "model_flops_per_s", "mfu", "flops")
STEP_FIELDS = ("step", "train_loss", "lr")  # recorded at every step


def _load_checkpoint(folder: Path, model: nn.Module, optimizer: torch.optim.Optimizer, config: TrainConfig) -> Progress:
    """The saved state, loaded as tensors and plain data only (never unpickled code) and checked
    field by field before any of it is used; a truncated, foreign, crafted or mismatched checkpoint
    is a one-line error naming the file and the field, and the file is left as it was."""
    path = folder / "checkpoint.pt"
    hint = "the run cannot be resumed from it; start again with --overwrite (the file is left as it was)"
    if not path.is_file():
        raise TdiagError(
            Diagnostic(f"no checkpoint to resume in '{folder}'", hint="train first, or check the run folder")
        )
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many kinds for a damaged or foreign file
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise TdiagError(
            Diagnostic(f"cannot read checkpoint '{path}': it is damaged or truncated ({reason[:200]})", hint=hint)
        ) from None
    problem = _checkpoint_problem(state, config)
    if problem is None:
        problem = _load_states(state, model, optimizer)
    if problem is not None:
        raise TdiagError(Diagnostic(f"checkpoint '{path}': {problem}", hint=hint))
    progress = Progress(state["step"], state["log"], state["generator"], state["rng"], state["rng_cuda"])
    return dataclasses.replace(progress, steps=state.get("steps", []))


# a checkpoint written before every step's loss was recorded has no "steps": it still resumes
CHECKPOINT_KEYS = {"model", "optimizer", "step", "log", "steps", "generator", "rng", "rng_cuda", "config"}


def _checkpoint_problem(state: object, config: TrainConfig) -> str | None:
    """What is wrong with a loaded checkpoint's fields (not yet its model and optimizer states)."""
    if not isinstance(state, dict) or set(state) not in (CHECKPOINT_KEYS, CHECKPOINT_KEYS - {"steps"}):
        found = sorted(map(str, state)) if isinstance(state, dict) else type(state).__name__
        return f"not a tdiag checkpoint (expected the fields {', '.join(sorted(CHECKPOINT_KEYS))}; found {found})"
    for name in ("model", "optimizer", "config"):
        if not isinstance(state[name], dict):
            return f"{name} is not a mapping"
    step = state["step"]
    if not isinstance(step, int) or isinstance(step, bool) or step < 0:
        return f"step is {step!r}, not a whole number >= 0"
    problem = _log_problem(state["log"], step) or _steps_problem(state.get("steps", []), step)
    for name, reference in (("generator", torch.Generator().get_state()), ("rng", torch.get_rng_state())):
        problem = problem or _state_problem(name, state[name], reference)
    if state["rng_cuda"] is not None:
        problem = problem or _state_problem("rng_cuda", state["rng_cuda"], None)
    if problem:
        return problem
    changed = [
        f"{k}: {state['config'].get(k)!r} in the checkpoint, {getattr(config, k)!r} in config.json"
        for k in (f.name for f in dataclasses.fields(TrainConfig))
        if k not in (*RESUMABLE, "out") and state["config"].get(k) != getattr(config, k)
    ]
    if changed:
        return f"the checkpoint and config.json in '{run_folder(config)}' are of different runs ({'; '.join(changed)})"
    return None


def _log_problem(log: object, step: int) -> str | None:
    return _records_problem(log, "log", LOG_FIELDS, "an evaluation record", step, optional=("mfu",))


def _steps_problem(steps: object, step: int) -> str | None:
    return _records_problem(steps, "steps", STEP_FIELDS, "a step record", step)


def _records_problem(
    records: object, name: str, fields: tuple[str, ...], what: str, step: int, optional: tuple[str, ...] = ()
) -> str | None:
    """What is wrong with a checkpoint's list of records: each a dict of exactly `fields`, numbers
    (None allowed in `optional` fields), their steps increasing and none after the checkpoint's."""
    if not isinstance(records, list):
        return f"{name} is a {type(records).__name__}, not a list"
    previous = 0
    for index, entry in enumerate(records):
        if not isinstance(entry, dict) or tuple(entry) != fields:
            return f"{name}[{index}] is not {what} ({', '.join(fields)})"
        numbers = [v for k, v in entry.items() if not (k in optional and v is None)]
        if not all(isinstance(v, int | float) and not isinstance(v, bool) for v in numbers):
            return f"{name}[{index}] holds a value that is not a number"
        if not isinstance(entry["step"], int) or not previous < entry["step"] <= step:
            return f"{name}[{index}] is of step {entry['step']!r}, out of order or after the checkpoint's step {step}"
        previous = entry["step"]
    return None


def _state_problem(name: str, value: object, reference: torch.Tensor | None) -> str | None:
    """A generator state: a byte tensor of the size torch's generator has (`reference`)."""
    if not isinstance(value, torch.Tensor) or value.dtype != torch.uint8 or value.dim() != 1:
        return f"{name} is not a generator state (a 1-d byte tensor)"
    if reference is not None and value.shape != reference.shape:
        return f"{name} is a generator state of {value.numel()} bytes, not {reference.numel()}"
    return None


def _load_states(state: dict, model: nn.Module, optimizer: torch.optim.Optimizer) -> str | None:
    """Load the model and optimizer states, or say why they do not fit this run's model."""
    expected = model.state_dict()
    wrong = [k for k, v in state["model"].items() if k in expected and (not isinstance(v, torch.Tensor)
             or v.shape != expected[k].shape or v.dtype != expected[k].dtype)]  # fmt: skip
    if wrong:
        return f"model entry '{wrong[0]}' is not a {tuple(expected[wrong[0]].shape)} {expected[wrong[0]].dtype} tensor"
    settings = [{k: v for k, v in g.items() if k not in ("params", "lr")} for g in optimizer.param_groups]
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError, TypeError, IndexError, AttributeError) as error:
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        return f"does not fit the model: {reason[:200]}"
    loaded = [{k: v for k, v in g.items() if k not in ("params", "lr")} for g in optimizer.param_groups]
    if loaded != settings:
        return f"optimizer settings {loaded} are not the run's {settings}"
    for group in optimizer.param_groups:
        for parameter in group["params"]:
            for name, value in optimizer.state.get(parameter, {}).items():
                size = torch.Size([]) if name == "step" else parameter.shape
                if not isinstance(value, torch.Tensor) or value.shape != size:
                    return f"optimizer state '{name}' of a {tuple(parameter.shape)} parameter has the wrong shape"
    return None


ROW_FIELDS = ("step", "train_loss", "lr", "val_loss", "tokens_per_s", "model_flops_per_s", "mfu", "flops")


def log_rows(log: list[dict], steps: list[dict]) -> list[dict]:
    """One row per step: its training loss and learning rate, and at an evaluation its validation
    loss and pace (empty elsewhere). A run resumed from a checkpoint that kept no per-step record
    has rows only for the evaluations before it."""
    evaluations = {e["step"]: e for e in log}
    rows = {s["step"]: dict.fromkeys(ROW_FIELDS) | s for s in steps}
    for number, evaluation in evaluations.items():
        rows.setdefault(number, dict.fromkeys(ROW_FIELDS))
        rows[number] |= evaluation
    return [rows[number] for number in sorted(rows)]


def _write_log(folder: Path, log: list[dict], steps: list[dict]) -> None:
    """log.jsonl and log.csv: a row per step so far (`log_rows`), each file replaced whole."""
    import io

    rows = log_rows(log, steps)
    with writing(folder / "log.jsonl"):
        write_atomically(folder / "log.jsonl", "".join(json.dumps(r) + "\n" for r in rows).encode())
    table = io.StringIO(newline="")
    writer = csv.DictWriter(table, fieldnames=list(ROW_FIELDS))
    writer.writeheader()
    writer.writerows(rows)
    with writing(folder / "log.csv"):
        write_atomically(folder / "log.csv", table.getvalue().encode())


def _evaluation_line(done: Progress, config: TrainConfig) -> str:
    """`mhsa step 200/2000: train 2.315, val 2.402 nats/char, 10,250 tokens/s`, printed at each
    evaluation, with or without a progress bar."""
    entry = done.log[-1]
    return (
        f"{Path(config.design).stem} step {entry['step']}/{config.steps}: train {entry['train_loss']:.3f}, "
        f"val {entry['val_loss']:.3f} nats/char, {entry['tokens_per_s']:,.0f} tokens/s"
    )


def _plot(folder: Path, log: list[dict], name: str, steps: list[dict] | None = None) -> None:
    """loss.png: the training loss at every step (each evaluation's where no step was recorded)
    and the validation loss at each evaluation, with markers, so a run of one evaluation shows."""
    if not log and not steps:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    trained = steps or log
    few = len(trained) <= 50
    ax.plot(
        [e["step"] for e in trained],
        [e["train_loss"] for e in trained],
        marker="." if few else None,
        linewidth=1,
        label="train",
    )
    ax.plot([e["step"] for e in log], [e["val_loss"] for e in log], marker="o", label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/char)")
    ax.set_title(name)
    ax.legend()
    fig.tight_layout()
    try:
        fig.savefig(folder / "loss.png", dpi=120)
    finally:
        plt.close(fig)


# ---- comparing designs --------------------------------------------------------------------------


def peak_flops(device: torch.device, override_tflops: float = 0.0) -> float:
    """The device's peak FLOP/s for model-FLOPs utilisation: `--peak-tflops` if given, else the
    data-sheet bf16 figure for known GPUs; 0 (MFU not reported) on a CPU or an unknown device."""
    if override_tflops:
        return override_tflops * 1e12
    if device.type != "cuda":
        return 0.0
    sheet = data_sheet(torch.cuda.get_device_name(device))
    return sheet.peak_flops if sheet else 0.0


def _mfu_postfix(achieved: float, peak: float) -> dict[str, str]:
    if not peak:
        return {"TFLOP_s": f"{achieved / 1e12:.3g}"}
    return {"TFLOP_s": f"{achieved / 1e12:.3g}", "mfu": f"{achieved / peak:.1%}"}


def compare(configs: list[TrainConfig], out: Path, progress: bool = True, overwrite: bool = False) -> list[dict]:
    """Train each design with the same seed and data; one plot against step and FLOPs, one table.
    Every design's run folder is claimed (locked) before the first design trains, not after it."""
    with ExitStack() as held:
        if _is_main_process():
            for config in configs:
                held.enter_context(claim_folder(run_folder(config), resume=False, overwrite=overwrite))
        dist = setup_distributed(resolve_device(configs[0].device))  # one group for every design
        completed = False
        try:
            results = [train(c, progress=progress, overwrite=overwrite) for c in configs]
            completed = True
        finally:
            teardown_distributed(dist, wait=completed)
    if _is_main_process():
        with writing(out):
            write_comparison(out, results)
    return results


# the columns of compare.csv and of compare.json's rows, one row per run
COMPARE_FIELDS = ("design", "seed", "attention_parameters", "parameters", "flops_per_step", "final_val_loss",
                  "tokens_per_s", "model_flops_per_s", "mfu")  # fmt: skip


def write_comparison(out: Path, results: list[dict]) -> None:
    """compare.md/.csv/.json and compare.png (validation loss against step and FLOPs) of runs;
    runs of one design that differ only in seed are one row of compare.md (mean and spread)."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [{k: r.get("config", {}).get("seed") if k == "seed" else r[k] for k in COMPARE_FIELDS} for r in results]
    (out / "compare.json").write_text(json.dumps({"rows": rows, "runs": results}, indent=2, default=str))
    with (out / "compare.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    configs = [r["config"] for r in results] if all("config" in r for r in results) else None
    (out / "compare.md").write_text(compare_table(rows, results[0]["unigram_val_loss"], configs))
    _plot_compare(out, results)


def seed_groups(configs: list[dict]) -> list[list[int]]:
    """The runs (by index) that differ only in their seed and run folder: one design's seeds."""
    groups: dict[str, list[int]] = {}
    for index, config in enumerate(configs):
        key = json.dumps({k: v for k, v in config.items() if k not in ("seed", "out")}, sort_keys=True, default=str)
        groups.setdefault(key, []).append(index)
    return list(groups.values())


def compare_table(rows: list[dict], unigram: float, configs: list[dict] | None = None) -> str:
    """compare.md: a row per design (its seeds' mean and spread where it ran several), the
    unigram baseline, and the settings the designs were trained with (`configs`, one per row)."""
    groups = seed_groups(configs) if configs else [[i] for i in range(len(rows))]
    seeded = any(len(group) > 1 for group in groups)
    lines = _seeded_table(rows, groups) if seeded else _run_table(rows)
    lines.append(f"\nUnigram baseline (validation cross-entropy of character frequencies): {unigram:.4f} nats/char.")
    counts = {r["design"]: r["attention_parameters"] for r in rows}
    if len(set(counts.values())) > 1:
        listed = ", ".join(f"{name} {count:,}" for name, count in counts.items())
        lines.append(
            f"\nNote: the designs' attention parameters differ ({listed}): the same `--set` sizes give "
            "each design its own attention width (a design may fix a size, as MGK its head width D), so "
            "the losses compare models of different attention sizes."
        )
    if configs:
        lines += ["", "## Configuration", "", *configuration_lines(configs, groups)]
    return "\n".join(lines) + "\n"


def _run_table(rows: list[dict]) -> list[str]:
    lines = [
        "| design | attention params | model params | train FLOPs/step | final val loss | tokens/s "
        "| model TFLOP/s | MFU |",
        "|---|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for r in rows:
        mfu = f"{r['mfu']:.1%}" if r.get("mfu") is not None else "n/a"
        tflops = r.get("model_flops_per_s", 0) / 1e12
        lines.append(
            f"| {r['design']} | {r['attention_parameters']:,} | {r['parameters']:,} | {r['flops_per_step']:.3g} | "
            f"{r['final_val_loss']:.4f} | {r['tokens_per_s']:,.0f} | {tflops:.3g} | {mfu} |"
        )
    return lines


def _seeded_table(rows: list[dict], groups: list[list[int]]) -> list[str]:
    """A row per design over its seeds: the final validation loss's mean ± sample standard
    deviation, and its difference to the lowest mean, marked where the two spreads cover it."""
    losses = [[rows[i]["final_val_loss"] for i in group] for group in groups]
    means = [statistics.fmean(values) for values in losses]
    spreads = [statistics.stdev(values) if len(values) > 1 else 0.0 for values in losses]
    best = min(range(len(groups)), key=means.__getitem__)
    lines = [
        "| design | seeds | attention params | model params | train FLOPs/step | final val loss (mean ± sd) "
        "| vs lowest | tokens/s (mean) |",
        "|---|---:|---:|---:|---:|---:|---|---:|",
    ]
    for k, group in enumerate(groups):
        first = rows[group[0]]
        gap = means[k] - means[best]
        versus = "lowest" if k == best else f"{gap:+.4f}"
        if k != best and gap <= spreads[k] + spreads[best]:
            versus += " (within the spread)"
        rate = statistics.fmean(rows[i]["tokens_per_s"] for i in group)
        lines.append(
            f"| {first['design']} | {len(group)} | {first['attention_parameters']:,} | {first['parameters']:,} | "
            f"{first['flops_per_step']:.3g} | {means[k]:.4f} ± {spreads[k]:.4f} | {versus} | {rate:,.0f} |"
        )
    lines.append(
        "\nThe spread is the sample standard deviation of the final validation loss over a design's seeds; "
        "a difference to the lowest mean no larger than the two spreads together is within the spread: "
        "these seeds do not tell the two designs apart."
    )
    return lines


SETTING_NAMES = {
    "steps": "steps",
    "layers": "layers",
    "width": "width F",
    "heads": "heads H",
    "context": "context",
    "batch": "batch",
    "lr": "learning rate",
    "seed": "seed",
    "eval_every": "evaluation every",
    "eval_batches": "validation batches",
    "objective": "objective",
    "device": "device",
    "compile": "torch.compile",
    "peak_tflops": "peak TFLOP/s",
    "data": "data",
}


def configuration_lines(configs: list[dict], groups: list[list[int]] | None = None) -> list[str]:
    """One Markdown list item per training setting: its value where every design shares it, else
    each design's; a design's seeds where it ran several; the design's own sizes (`--set`) last."""
    groups = groups or [[i] for i in range(len(configs))]
    designs = [(Path(str(configs[g[0]]["design"])).stem, [configs[i] for i in g]) for g in groups]
    lines = []
    for name, label in SETTING_NAMES.items():
        values = [(design, ", ".join(dict.fromkeys(str(c.get(name)) for c in runs))) for design, runs in designs]
        if name == "seed" and any(len(runs) > 1 for _, runs in designs):
            label = "seeds"
        if len({value for _, value in values}) == 1:
            lines.append(f"- {label}: {values[0][1]}")
        else:
            lines.append(f"- {label}: " + "; ".join(f"{design} {value}" for design, value in values))
    sizes = [(d, ", ".join(f"{k}={v}" for k, v in runs[0].get("sizes", {}).items())) for d, runs in designs]
    lines.append("- sizes: " + "; ".join(f"{d} {text or 'as declared'}" for d, text in sizes))
    return lines


def _plot_compare(out: Path, results: list[dict]) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (by_step, by_flops) = plt.subplots(1, 2, figsize=(11, 4))
    for r in results:
        log = r["log"]
        by_step.plot([e["step"] for e in log], [e["val_loss"] for e in log], marker="o", label=r["design"])
        by_flops.plot([e["flops"] for e in log], [e["val_loss"] for e in log], marker="o", label=r["design"])
    by_step.set_xlabel("step")
    by_flops.set_xlabel("training FLOPs (tdiag cost)")
    by_flops.set_xscale("log")
    for ax in (by_step, by_flops):
        ax.set_ylabel("validation loss (nats/char)")
        ax.grid(alpha=0.3)
    by_step.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(out / "compare.png", dpi=120)
    plt.close(fig)


# ---- command line ---------------------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`python -m tdiag.train` / torchrun entry: the same flags as `tdiag train`."""
    from .cli import main as cli_main

    return cli_main(["train", *(sys.argv[1:] if argv is None else argv)])


def leave_process(code: int) -> None:
    """Exit a torchrun worker without interpreter finalization: with torch 2.13 on CPU, gloo's
    threads abort a few percent of processes there ("terminate called without an active
    exception"), after every file is written, even once the group is destroyed."""
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)


if __name__ == "__main__":
    code = main()
    if "RANK" in os.environ:
        leave_process(code)
    raise SystemExit(code)
