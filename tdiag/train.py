"""Train any design as the attention of a small decoder-only character language model
(design notes §7). One process or data-parallel under torchrun (gloo on CPU, NCCL on GPU).
Each run writes a folder: config.json, log.csv and log.jsonl (every evaluation), checkpoint.pt
(resumable, written at every evaluation and on Ctrl-C), loss.png and sample.txt.

    tdiag train designs/fish.td
    tdiag train --compare designs/mhsa.td designs/thsa.td designs/fish.td
    torchrun --nproc_per_node=2 -m tdiag.train designs/mhsa.td"""

from __future__ import annotations

import csv
import dataclasses
import gzip
import json
import math
import os
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.nn.functional as functional
from torch import nn

import tdiag

from .device import data_sheet
from .errors import Diagnostic, TdiagError
from .train_config import TrainConfig

# ---- data ------------------------------------------------------------------------------------


@dataclass
class Corpus:
    """Characters as integer ids, split 90/10 into training and validation text."""

    chars: list[str]
    train: torch.Tensor
    val: torch.Tensor

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
    if not file.is_file():
        raise TdiagError(
            Diagnostic(f"no data file '{path}'", hint="pass --data PATH to a UTF-8 text file (.txt or .gz)")
        )
    try:
        raw = file.read_bytes()
        if raw[:2] == b"\x1f\x8b":
            raw = gzip.decompress(raw)
        text = raw.decode("utf-8")
    except (OSError, UnicodeDecodeError, EOFError) as error:
        raise TdiagError(Diagnostic(f"cannot read '{path}' as UTF-8 text: {error}")) from None
    if not text.strip():
        raise TdiagError(Diagnostic(f"data file '{path}' is empty"))
    chars = sorted(set(text))
    index = {c: i for i, c in enumerate(chars)}
    ids = torch.tensor([index[c] for c in text], dtype=torch.long)
    split = int(0.9 * len(ids))
    corpus = Corpus(chars, ids[:split], ids[split:])
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

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attention(self.norm1(x))
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

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.tokens(ids) + self.positions(torch.arange(ids.shape[-1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.head(self.norm(x))


def design_for(config: TrainConfig) -> tdiag.Design:
    """The causal design at the model's sizes; its input and output width must be the model's."""
    base = tdiag.load(config.design)
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
    design = tdiag.load(config.design, **sizes).with_causal_mask()
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


def build_model(config: TrainConfig, vocab: int, device: torch.device) -> tuple[LanguageModel, tdiag.Design]:
    design = design_for(config)
    attentions = [
        design.module(seed=config.seed + k, N=config.context, device=device, objective=config.objective)
        for k in range(config.layers)
    ]
    torch.manual_seed(config.seed)
    model = LanguageModel(attentions, vocab, config.width, config.context).to(device)
    return model, design


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
def sample(model: LanguageModel, corpus: Corpus, config: TrainConfig, device: torch.device, length: int = 400) -> str:
    model.eval()
    generator = torch.Generator(device="cpu").manual_seed(config.seed)
    ids = corpus.train[: config.context].tolist()
    out: list[int] = []
    for _ in range(length):
        window = torch.tensor(ids[-config.context :], device=device)[None]
        logits = model(torch.cat([window, window.new_zeros(1, config.context - window.shape[1])], 1))
        probabilities = logits[0, window.shape[1] - 1].float().softmax(-1).cpu()
        token = int(torch.multinomial(probabilities, 1, generator=generator))
        ids.append(token)
        out.append(token)
    model.train()
    return corpus.decode(out)


def learning_rate(step: int, config: TrainConfig) -> float:
    warmup = min(50, config.steps // 10 + 1)
    if step < warmup:
        return config.lr * (step + 1) / warmup
    progress = (step - warmup) / max(1, config.steps - warmup)
    return config.lr * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * progress)))


def run_folder(config: TrainConfig) -> Path:
    return Path(config.out or f"runs/{Path(config.design).stem}-seed{config.seed}")


RUN_FILES = ("config.json", "checkpoint.pt", "log.csv", "log.jsonl", "loss.png", "sample.txt", "summary.json")


def claim_folder(folder: Path, *, resume: bool, overwrite: bool) -> None:
    """A run folder that holds a run is continued (`resume`) or replaced (`overwrite`), never
    silently overwritten; replacing it first removes the old run's files, so a run killed before
    its first checkpoint cannot leave one design's config beside another's checkpoint."""
    if folder.exists() and not folder.is_dir():
        raise TdiagError(Diagnostic(f"run folder '{folder}' is a file", hint="choose another --out"))
    held = [name for name in RUN_FILES if (folder / name).exists()]
    if resume or not held:
        return
    if not overwrite:
        raise TdiagError(
            Diagnostic(
                f"run folder '{folder}' already holds a run ({', '.join(held)})",
                hint=f"continue it with: tdiag train --resume {folder}; or choose another --out, "
                "or pass --overwrite to replace it",
            )
        )
    for name in held:
        (folder / name).unlink()


def train(config: TrainConfig, *, resume: bool = False, overwrite: bool = False, progress: bool = True) -> dict:
    """Train, evaluate every `eval_every` steps, checkpoint, and return the final summary. A
    folder holding another run is refused unless `resume` (continue it) or `overwrite`."""
    device = resolve_device(config.device)
    if os.environ.get("RANK", "0") == "0":
        claim_folder(run_folder(config), resume=resume, overwrite=overwrite)
    dist = setup_distributed(device)
    if config.batch % dist.world:
        raise TdiagError(Diagnostic(f"--batch {config.batch} does not split over {dist.world} processes"))
    corpus = read_corpus(config.data, config.context)
    folder = run_folder(config)
    model, design = build_model(config, corpus.vocab, device)
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr, weight_decay=0.01)
    state = {"step": 0, "log": [], "generator": torch.Generator().manual_seed(config.seed).get_state()}
    if resume:
        state = _load_checkpoint(folder, model, optimizer, config)
    network = model
    if dist.world > 1:
        network = nn.parallel.DistributedDataParallel(
            model, device_ids=[device.index] if device.type == "cuda" else None
        )
    if config.compile:
        network = torch.compile(network)
    generator = torch.Generator()
    generator.set_state(state["generator"])
    per_step = flops_per_step(config, design, corpus.vocab)
    summary = {
        "design": design.name,
        "parameters": sum(p.numel() for p in model.parameters()),
        "attention_parameters": sum(p.numel() for b in model.blocks for p in b.attention.parameters()),
        "flops_per_step": per_step,
        "unigram_val_loss": corpus.unigram_loss(),
    }
    if dist.is_main:
        folder.mkdir(parents=True, exist_ok=True)
        config_text = json.dumps(dataclasses.asdict(config) | {"summary": summary}, indent=2)
        write_atomically(folder / "config.json", config_text.encode())
    bar = _progress(config, state["step"], enabled=progress and dist.is_main)
    peak = peak_flops(device, config.peak_tflops) * dist.world
    tokens, seconds, rate, achieved = 0, 0.0, 0.0, 0.0
    previous_handler = _stop_on_sigterm()
    step = state["step"]
    completed = False
    try:
        while step < config.steps:
            for group in optimizer.param_groups:
                group["lr"] = learning_rate(step, config)
            started = time.perf_counter()
            x, y = global_batch(generator, corpus.train, config, dist.rank, dist.world)
            loss = loss_of(network, x, y, device)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
            loss = float(loss.detach())  # waits for the device: the step's time is complete
            seconds += time.perf_counter() - started
            step += 1
            tokens += config.batch * config.context
            rate = tokens / seconds
            achieved = per_step * rate / (config.batch * config.context)  # model FLOP/s
            bar.update(1)
            bar.set_postfix(train=f"{loss:.3f}", tok_s=f"{rate:,.0f}", **_mfu_postfix(achieved, peak))
            if step % config.eval_every == 0 or step == config.steps:
                val = evaluate(model, corpus, config, device)
                entry = {
                    "step": step,
                    "train_loss": loss,
                    "val_loss": val,
                    "tokens_per_s": rate,
                    "model_flops_per_s": achieved,
                    "mfu": achieved / peak if peak else None,
                    "flops": per_step * step,
                }
                state["log"].append(entry)
                bar.set_postfix(
                    train=f"{loss:.3f}", val=f"{val:.3f}", tok_s=f"{rate:,.0f}", **_mfu_postfix(achieved, peak)
                )
                if dist.is_main:
                    _save_checkpoint(folder, model, optimizer, step, state["log"], generator, config)
                    _write_log(folder, state["log"])
    except KeyboardInterrupt:
        if dist.is_main:
            _save_checkpoint(folder, model, optimizer, step, state["log"], generator, config)
        message = f"training interrupted at step {step}; the checkpoint in '{folder}' holds every completed step"
        raise TdiagError(Diagnostic(message, hint=f"resume with: tdiag train --resume {folder}")) from None
    else:
        completed = True
    finally:
        bar.close()
        _restore_sigterm(previous_handler)
        network = None  # DDP's reducer holds gloo work; it goes before the group
        teardown_distributed(dist, wait=completed)
    summary |= {
        "final_val_loss": state["log"][-1]["val_loss"] if state["log"] else None,
        "tokens_per_s": rate,
        "model_flops_per_s": achieved,
        "peak_flops_per_s": peak or None,
        "mfu": achieved / peak if peak else None,
    }
    if dist.is_main:
        (folder / "sample.txt").write_text(sample(model, corpus, config, device))
        (folder / "summary.json").write_text(json.dumps(summary, indent=2))
        _plot(folder, state["log"], design.name)
    return summary | {"log": state["log"], "folder": str(folder)}


def _stop_on_sigterm():
    """`kill` (SIGTERM) stops a run like Ctrl-C does: the checkpoint is written first."""
    import signal

    def interrupt(signum, frame):
        raise KeyboardInterrupt

    try:
        return signal.signal(signal.SIGTERM, interrupt)
    except ValueError:  # not the main thread: leave signals alone
        return None


def _restore_sigterm(previous) -> None:
    import signal

    if previous is not None:
        signal.signal(signal.SIGTERM, previous)


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


def write_atomically(path: Path, data: bytes) -> None:
    """Write `data` to a temporary file beside `path`, flush it to disk, then rename it over
    `path`: a killed process or a full disk leaves the old file or the new one, never half."""
    temporary = path.with_name(path.name + ".tmp")
    try:
        with open(temporary, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        temporary.unlink(missing_ok=True)
        raise


def _save_checkpoint(folder, model, optimizer, step, log, generator, config) -> None:
    """Tensors and plain data only (dicts, lists, numbers, text), so resuming loads it with
    `weights_only=True` and a checkpoint can never run code."""
    import io

    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step, "log": log}
    state |= {"generator": generator.get_state(), "config": dataclasses.asdict(config)}
    buffer = io.BytesIO()
    torch.save(state, buffer)
    write_atomically(folder / "checkpoint.pt", buffer.getvalue())


CHECKPOINT_KEYS = {
    "model": dict,
    "optimizer": dict,
    "step": int,
    "log": list,
    "generator": torch.Tensor,
    "config": dict,
}


def _load_checkpoint(folder: Path, model, optimizer, config: TrainConfig) -> dict:
    """The saved state, loaded as tensors and plain data only (never unpickled code); a truncated,
    foreign or mismatched checkpoint is a clear error and the file is left as it was."""
    path = folder / "checkpoint.pt"
    if not path.is_file():
        raise TdiagError(
            Diagnostic(f"no checkpoint to resume in '{folder}'", hint="train first, or check the run folder")
        )
    hint = "the run cannot be resumed from it; start again with --overwrite (the file is left as it was)"
    try:
        state = torch.load(path, map_location="cpu", weights_only=True)
    except Exception as error:  # torch raises many kinds for a damaged or foreign file
        reason = str(error).strip().splitlines()[0] if str(error).strip() else type(error).__name__
        raise TdiagError(Diagnostic(f"cannot read checkpoint '{path}': {reason[:200]}", hint=hint)) from None
    wrong = [
        k for k, kind in CHECKPOINT_KEYS.items() if not isinstance(state, dict) or not isinstance(state.get(k), kind)
    ]
    if wrong:
        raise TdiagError(Diagnostic(f"'{path}' is not a tdiag checkpoint (no {', '.join(wrong)})", hint=hint))
    saved = {k: state["config"].get(k) for k in ("design", "sizes", "layers", "width", "heads", "context")}
    current = {k: getattr(config, k) for k in saved}
    if saved != current:
        changed = ", ".join(f"{k}: {saved[k]!r} in the checkpoint, {current[k]!r} in config.json" for k in saved
                            if saved[k] != current[k])  # fmt: skip
        raise TdiagError(
            Diagnostic(f"checkpoint and config.json in '{folder}' are of different runs ({changed})", hint=hint)
        )
    try:
        model.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
    except (RuntimeError, ValueError, KeyError) as error:
        reason = str(error).strip().splitlines()[0]
        raise TdiagError(Diagnostic(f"checkpoint '{path}' does not fit the model: {reason[:200]}", hint=hint)) from None
    return state


def _write_log(folder: Path, log: list[dict]) -> None:
    (folder / "log.jsonl").write_text("".join(json.dumps(e) + "\n" for e in log))
    with (folder / "log.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(log[0]))
        writer.writeheader()
        writer.writerows(log)


def _plot(folder: Path, log: list[dict], name: str) -> None:
    if not log:
        return
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(6, 4))
    steps = [e["step"] for e in log]
    ax.plot(steps, [e["train_loss"] for e in log], label="train")
    ax.plot(steps, [e["val_loss"] for e in log], label="validation")
    ax.set_xlabel("step")
    ax.set_ylabel("cross-entropy (nats/char)")
    ax.set_title(name)
    ax.legend()
    fig.tight_layout()
    fig.savefig(folder / "loss.png", dpi=120)
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
    """Train each design with the same seed and data; one plot against step and FLOPs, one table."""
    main_process = os.environ.get("RANK", "0") == "0"
    if main_process:
        for config in configs:  # refuse before the first design trains, not after it
            claim_folder(run_folder(config), resume=overwrite, overwrite=False)
    dist = setup_distributed(resolve_device(configs[0].device))  # one group for every design
    completed = False
    try:
        results = [train(c, progress=progress, overwrite=overwrite) for c in configs]
        completed = True
    finally:
        teardown_distributed(dist, wait=completed)
    if main_process:
        write_comparison(out, results)
    return results


def write_comparison(out: Path, results: list[dict]) -> None:
    """compare.md/.csv/.json and compare.png (validation loss against step and FLOPs) of runs."""
    out.mkdir(parents=True, exist_ok=True)
    rows = [
        {
            k: r[k]
            for k in (
                "design",
                "attention_parameters",
                "parameters",
                "flops_per_step",
                "final_val_loss",
                "tokens_per_s",
                "model_flops_per_s",
                "mfu",
            )
        }
        for r in results
    ]
    (out / "compare.json").write_text(json.dumps({"rows": rows, "runs": results}, indent=2, default=str))
    with (out / "compare.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    (out / "compare.md").write_text(compare_table(rows, results[0]["unigram_val_loss"]))
    _plot_compare(out, results)


def compare_table(rows: list[dict], unigram: float) -> str:
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
    lines.append(f"\nUnigram baseline (validation cross-entropy of character frequencies): {unigram:.4f} nats/char.")
    return "\n".join(lines) + "\n"


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
