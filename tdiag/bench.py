"""Benchmark: forward + backward time and activation memory of compiled designs against
hand-written references, in one run, as ratios side by side. A script, not a test: numbers
depend on the machine. Memory is the bytes autograd saves for the backward pass beyond the
parameters and the input (tdiag.measure; the same on every device); on CUDA the peak allocated
memory is reported too."""

from __future__ import annotations

import csv
import io
import json
import math
import os
import platform
import statistics
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path

import sympy
import torch
import torch.nn.functional as functional
from torch import nn

import tdiag

from .design import DEFAULT_OBJECTIVE
from .device import for_device
from .files import output_folder, write_output
from .graph import size_symbol
from .measure import saved_for_backward, time_step
from .plan.timing import plan_time

# ---- hand-written references ----------------------------------------------------------------


class Reference(nn.Module):
    """A hand-written implementation: takes `causal` at call time (compiled modules have the
    mask compiled in)."""

    takes_causal = True


class SdpaAttention(Reference):
    """Multi-head self-attention as one writes it by hand with scaled_dot_product_attention."""

    def __init__(self, mhsa: nn.Module):
        super().__init__()
        width, heads, head = mhsa.WQ.shape
        self.heads = heads
        self.qkv = nn.Linear(width, 3 * heads * head, bias=False)
        self.out = nn.Linear(heads * head, width, bias=False)
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([w.reshape(width, -1).T for w in (mhsa.WQ, mhsa.WK, mhsa.WV)]))
            self.out.weight.copy_(mhsa.WO.reshape(-1, width).T)

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        y = functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
        return self.out(y.transpose(1, 2).reshape(b, n, -1))


class TorchMultiheadAttention(Reference):
    def __init__(self, mhsa: nn.Module):
        super().__init__()
        width, heads, _ = mhsa.WQ.shape
        self.attention = nn.MultiheadAttention(width, heads, bias=False, batch_first=True)
        with torch.no_grad():
            self.attention.in_proj_weight.copy_(
                torch.cat([w.reshape(width, -1).T for w in (mhsa.WQ, mhsa.WK, mhsa.WV)])
            )
            self.attention.out_proj.weight.copy_(mhsa.WO.reshape(-1, width).T)

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        mask = nn.Transformer.generate_square_subsequent_mask(x.shape[1], device=x.device) if causal else None
        return self.attention(x, x, x, attn_mask=mask, need_weights=False)[0]


class AuthorsThsa(Reference):
    """The Tuformer authors' THSA formulation (fairseq tuckerhead_attention, bias-free): the
    score tensor einsum('bsr,blr->bslr') then Linear(R, R) on its last axis (spec §2.3)."""

    def __init__(self, thsa: nn.Module):
        super().__init__()
        width, rank = thsa.WQ.shape
        self.rank = rank
        self.q, self.k, self.v = (nn.Linear(width, rank, bias=False) for _ in range(3))
        self.c_proj = nn.Linear(rank, rank, bias=False)
        self.out = nn.Linear(rank, width, bias=False)
        with torch.no_grad():
            for linear, name in ((self.q, "WQ"), (self.k, "WK"), (self.v, "WV")):
                linear.weight.copy_(getattr(thsa, name).T)
            self.c_proj.weight.copy_(thsa.C)
            self.out.weight.copy_(thsa.WO.T)

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        q = self.q(x) * self.rank**-0.5
        k, v = self.k(x), self.v(x)
        attention = self.c_proj(torch.einsum("bsr,blr->bslr", q, k))
        if causal:
            n = x.shape[1]
            mask = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
            attention = attention.masked_fill(mask[None, :, :, None], float("-inf"))
        probabilities = attention.softmax(dim=2)
        return self.out(torch.einsum("bslr,blr->bsr", probabilities, v))


class AuthorsFish(Reference):
    """The FiSH authors' formulation (HDPAttn, spec fishformer §3.2-3.3): M global score maps,
    Gaussian noise on them in training, Linear(M -> H) mixing on the head axis, then a softmax per
    local head and the H value heads."""

    def __init__(self, fish: nn.Module):
        super().__init__()
        width, globals_, head = fish.WQ.shape
        heads = fish.WV.shape[1]
        self.scale = head**-0.5
        like = {"bias": False, "dtype": fish.WQ.dtype}
        self.q, self.k = nn.Linear(width, globals_ * head, **like), nn.Linear(width, globals_ * head, **like)
        self.v = nn.Linear(width, heads * fish.WV.shape[2], **like)
        self.mix = nn.Linear(globals_, heads, **like)
        self.out = nn.Linear(heads * fish.WV.shape[2], width, **like)
        self.sigma = nn.Parameter(fish.sigma.detach().clone()) if hasattr(fish, "sigma") else None
        with torch.no_grad():
            self.q.weight.copy_(fish.WQ.reshape(width, -1).T)
            self.k.weight.copy_(fish.WK.reshape(width, -1).T)
            self.v.weight.copy_(fish.WV.reshape(width, -1).T)
            self.mix.weight.copy_(fish.P.T)
            self.out.weight.copy_(fish.WO.reshape(-1, width).T)
        self.globals, self.heads = globals_, heads

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.globals, -1)
        k = self.k(x).view(b, n, self.globals, -1)
        scores = torch.einsum("bnmd,bsmd->bnsm", q, k)
        if self.sigma is not None and self.training:
            scores = scores + self.sigma * torch.randn_like(scores)
        attention = self.mix(scores) * self.scale  # [b n s h]
        if causal:
            mask = torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1)
            attention = attention.masked_fill(mask[None, :, :, None], float("-inf"))
        probabilities = attention.softmax(dim=2)
        v = self.v(x).view(b, n, self.heads, -1)
        return self.out(torch.einsum("bnsh,bshe->bnhe", probabilities, v).reshape(b, n, -1))


class AuthorsMgk(Reference):
    """The MGK authors' formulation (spec mgk §1.3, LRA attention): per-component squared
    distances, π-weighted Gaussian kernels summed over components, normalized over keys."""

    def __init__(self, mgk: nn.Module):
        super().__init__()
        width, heads, components, head = mgk.WK.shape
        self.heads, self.components, self.head = heads, components, head
        like = {"bias": False, "dtype": mgk.WQ.dtype}
        self.q = nn.Linear(width, heads * head, **like)
        self.k = nn.Linear(width, heads * components * head, **like)
        self.v = nn.Linear(width, heads * mgk.WV.shape[2], **like)
        self.out = nn.Linear(heads * mgk.WV.shape[2], width, **like)
        self.pi = nn.Parameter(mgk.pi.detach().clone())
        with torch.no_grad():
            for linear, name in ((self.q, "WQ"), (self.k, "WK"), (self.v, "WV")):
                linear.weight.copy_(getattr(mgk, name).reshape(width, -1).T)
            self.out.weight.copy_(mgk.WO.reshape(-1, width).T)

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        b, n, _ = x.shape
        q = self.q(x).view(b, n, self.heads, self.head).transpose(1, 2)  # [b h n d]
        k = self.k(x).view(b, n, self.heads, self.components, self.head).permute(0, 2, 3, 1, 4)  # [b h r m d]
        v = self.v(x).view(b, n, self.heads, -1).transpose(1, 2)
        variance = self.head**0.5
        kernel = 0.0
        for r in range(self.components):
            distance = (
                (q * q).sum(-1, keepdim=True)
                + (k[:, :, r] ** 2).sum(-1)[:, :, None, :]
                - 2 * q @ k[:, :, r].transpose(-1, -2)
            )
            kernel = kernel + self.pi[:, r].clamp(0, 1)[None, :, None, None] * torch.exp(-distance / (2 * variance))
        if causal:
            kernel = kernel.masked_fill(torch.ones(n, n, dtype=torch.bool, device=x.device).triu(1), 0.0)
        attention = kernel / (kernel.sum(-1, keepdim=True) + 1e-6)
        return self.out((attention @ v).transpose(1, 2).reshape(b, n, -1))


REFERENCES: dict[str, list[tuple[str, Callable[[nn.Module], nn.Module]]]] = {
    "mhsa": [("torch MultiheadAttention", TorchMultiheadAttention), ("hand-written SDPA", SdpaAttention)],
    "thsa": [("authors' THSA (einsum + Linear(R,R))", AuthorsThsa)],
    "fish": [("authors' FiSH (global scores, Linear(M,H) mix)", AuthorsFish)],
    "hard_fish": [("authors' Hard FiSH (global scores, Linear(M,H) mix)", AuthorsFish)],
    "mgk": [("authors' MGK (per-component Gaussian kernels)", AuthorsMgk)],
}


# ---- measuring ------------------------------------------------------------------------------


@dataclass
class Row:
    design: str
    implementation: str
    seconds: float  # median forward + backward
    saved_bytes: int  # activations autograd keeps for backward
    cuda_peak_bytes: int | None
    time_ratio: float = 1.0  # the compiled design's time / this row's (median)
    time_ratio_min: float = 1.0  # the same ratio taken round by round: its spread is the noise
    time_ratio_max: float = 1.0
    memory_ratio: float = 1.0
    predicted_seconds: float | None = None  # the time objective's estimate (compiled rows)


def _kwargs(module: nn.Module, causal: bool, others: dict[str, torch.Tensor]) -> dict[str, object]:
    """Hand-written references take `causal`; compiled modules (in-process or a standalone
    file) were compiled with or without the causal mask and take the design's other inputs."""
    return {"causal": causal} if getattr(module, "takes_causal", False) else dict(others)


def other_inputs(design: tdiag.Design, batch: int, n: int, device: str) -> dict[str, torch.Tensor]:
    """Every input after the queries' sequence (a cross-attention's memory), random, with each
    run-time size (N, M) at n: the bench times a layer on sequences of one length."""
    values = {size_symbol(k): v for k, v in design.size_values.items()}
    values |= {size_symbol(k): n for k, size in design.graph.sizes.items() if size.is_free}
    return {
        t.name: torch.randn(batch, *(int(sympy.sympify(d).subs(values)) for d in t.shape), device=device)
        for t in design.graph.inputs[1:]
    }


@dataclass
class Timing:
    seconds: list[float]  # one forward + backward per round
    saved_bytes: int
    cuda_peak_bytes: int | None


def columns(name: str, timing: Timing, base: Timing, against: str) -> dict[str, float]:
    """One implementation's columns of a benchmark row: its median and min–max milliseconds, its
    time over `base`'s taken round by round (median, min–max; the ratio is named `name / against`)
    and the megabytes it keeps for backward."""
    seconds = sorted(timing.seconds)
    ratios = sorted(a / b for a, b in zip(timing.seconds, base.seconds, strict=True))
    return {
        f"{name} ms": 1e3 * seconds[len(seconds) // 2],
        f"{name} ms min": 1e3 * seconds[0],
        f"{name} ms max": 1e3 * seconds[-1],
        f"{name} / {against}": ratios[len(ratios) // 2],
        f"{name} / {against} min": ratios[0],
        f"{name} / {against} max": ratios[-1],
        f"{name} kept MB": timing.saved_bytes / 1e6,
    }


def write_rows(rows: list[dict], out: str | Path, stem: str, settings: dict) -> None:
    """A side-by-side benchmark's rows as OUT/STEM.json (with the torch and Python versions, one
    thread, and `settings`) and OUT/STEM.csv, one row a line."""
    folder = Path(out)
    folder.mkdir(parents=True, exist_ok=True)
    meta = {"torch": torch.__version__, "python": platform.python_version(), "threads": 1, "args": settings}
    (folder / f"{stem}.json").write_text(json.dumps({"meta": meta, "rows": rows}, indent=1) + "\n")
    with open(folder / f"{stem}.csv", "w", newline="") as f:
        writer = csv.DictWriter(f, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


def _rotated(count: int, start: int) -> list[int]:
    """0 .. count - 1 starting at `start` (mod count), wrapping around."""
    return [(start + k) % count for k in range(count)]


def measure_all(
    modules: list[nn.Module], x: torch.Tensor, causal: bool, repeat: int, others: dict[str, torch.Tensor] | None = None
) -> list[Timing]:
    """Round-robin over the implementations, so warm-up and machine noise fall on all alike;
    round r of one implementation is compared with round r of another. Round r starts at
    implementation r (mod their number): no implementation always runs first, right after
    another's backward has filled the caches and the allocator."""
    for module in modules:
        time_step(module, x, kwargs=_kwargs(module, causal, others or {}), repeats=0, warmup=2)
    times: list[list[float]] = [[] for _ in modules]
    for r in range(repeat):
        for k in _rotated(len(modules), r):
            module = modules[k]
            times[k] += time_step(module, x, kwargs=_kwargs(module, causal, others or {}), repeats=1, warmup=0)
    results = []
    for k, module in enumerate(modules):
        peak = None
        if x.is_cuda:
            torch.cuda.reset_peak_memory_stats()
            time_step(module, x, kwargs=_kwargs(module, causal, others or {}), repeats=1, warmup=0)
            peak = torch.cuda.max_memory_allocated()
        saved = saved_for_backward(module, x, **_kwargs(module, causal, others or {})).total_bytes
        results.append(Timing(times[k], saved, peak))
    return results


def load_baseline(folder: Path, stem: str, causal: bool) -> nn.Module | None:
    """A standalone compiled file `FOLDER/STEM.py` (`STEM.causal.py` under --causal), e.g. made
    by `tdiag compile` at an older commit, so an old plan and the new one are timed side by
    side in one run. The file is the user's own Python; it is imported like any module."""
    path = folder / f"{stem}{'.causal' if causal else ''}.py"
    if not os.path.isfile(path):
        return None
    return module_from_file(path, f"tdiag_baseline_{stem}")


def module_from_file(path: Path, name: str) -> nn.Module:
    """The one nn.Module class a standalone compiled file defines, instantiated; the file is the
    user's own Python, imported as module `name`."""
    import importlib.util

    spec = importlib.util.spec_from_file_location(name, path)
    assert spec is not None and spec.loader is not None
    namespace = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(namespace)
    classes = [
        c
        for c in vars(namespace).values()
        if isinstance(c, type) and issubclass(c, nn.Module) and c.__module__ == namespace.__name__
    ]
    if len(classes) != 1:
        raise ValueError(f"{path}: expected one nn.Module class, found {len(classes)}")
    return classes[0]()


def run(
    files: list[str],
    *,
    n: int,
    batch: int,
    width: int,
    heads: int,
    repeat: int,
    causal: bool,
    device: str,
    objective: str = DEFAULT_OBJECTIVE,
    baseline: str | None = None,
    log=print,
) -> list[Row]:
    """Each design compiled under each objective (comma-separated: `flops,time`), its
    hand-written references and, with `baseline`, a standalone file compiled earlier, timed
    round-robin; ratios are to the first objective's module, with their min–max over rounds."""
    objectives = [o.strip() for o in objective.split(",") if o.strip()]
    rows: list[Row] = []
    torch.manual_seed(0)
    model = for_device(device)
    for file in files:
        design = tdiag.load(file, **sizes_for(file, width, heads))
        if causal:
            design = design.with_causal_mask()
        lengths = {k: n for k, size in design.graph.sizes.items() if size.is_free}  # planned as timed: N, M at n
        lengths["B"] = batch  # and the batch: the time objective's choices depend on it
        compiled = [design.module(lengths, device=device, objective=o) for o in objectives]
        x = torch.randn(batch, n, width, device=device)
        labels = ["tdiag compiled"] + [f"tdiag compiled ({o})" for o in objectives[1:]]
        modules: list[nn.Module] = list(compiled)
        old = load_baseline(Path(baseline), Path(file).stem, causal) if baseline else None
        if old is not None:
            old.load_state_dict(compiled[0].state_dict())
            labels.append(f"baseline ({Path(baseline).name})")
            modules.append(old.to(device))
        for label, make in REFERENCES.get(Path(file).stem, []):
            labels.append(label)
            modules.append(make(compiled[0]).to(device))
        timings = measure_all(modules, x, causal, repeat, other_inputs(design, batch, n, device))
        for k, (label, timing) in enumerate(zip(labels, timings, strict=True)):
            row = Row(design.name, label, statistics.median(timing.seconds), timing.saved_bytes, timing.cuda_peak_bytes)
            row.time_ratio = statistics.median(timings[0].seconds) / row.seconds
            per_round = [a / b for a, b in zip(timings[0].seconds, timing.seconds, strict=True)]
            row.time_ratio_min, row.time_ratio_max = min(per_round), max(per_round)
            row.memory_ratio = timings[0].saved_bytes / row.saved_bytes if row.saved_bytes else math.nan
            if k < len(compiled):
                row.predicted_seconds = plan_time(compiled[k].tdiag_plan, model, B=batch)
            rows.append(row)
            log(f"  {design.name:<22} {label:<38} {row.seconds * 1e3:9.2f} ms")
    return rows


def sizes_for(file: str, width: int, heads: int) -> dict[str, int]:
    design = tdiag.load(file)
    sizes = {"F": width, "H": heads}
    return {k: v for k, v in sizes.items() if k in design.graph.sizes and not design.graph.sizes[k].is_free}


def table(rows: list[Row]) -> str:
    header = f"{'design':<22} {'implementation':<38} {'fwd+bwd ms':>11} {'predicted ms':>13} {'saved MiB':>10}"
    lines = [header + f" {'compiled/this time':>19} {'(min–max)':>13} {'compiled/this mem':>18}"]
    for r in rows:
        predicted = f"{r.predicted_seconds * 1e3:13.2f}" if r.predicted_seconds is not None else f"{'':>13}"
        spread = f"{r.time_ratio_min:.2f}–{r.time_ratio_max:.2f}"
        lines.append(
            f"{r.design:<22} {r.implementation:<38} {r.seconds * 1e3:11.2f} {predicted} {r.saved_bytes / 2**20:10.1f} "
            f"{r.time_ratio:19.3f} {spread:>13} {r.memory_ratio:18.3f}"
        )
    return "\n".join(lines)


def write(rows: list[Row], out: Path, settings: dict) -> list[Path]:
    """bench.json, bench.csv and (with matplotlib) bench.png in `out`, each written whole
    (files.write_output) or not at all."""
    output_folder(out, flag="--out")
    meta = settings | {"machine": platform.platform(), "processor": platform.processor(), "torch": torch.__version__}
    table = io.StringIO()
    writer = csv.DictWriter(table, fieldnames=list(asdict(rows[0])))
    writer.writeheader()
    writer.writerows(asdict(r) for r in rows)
    paths = [
        write_output(out / "bench.json", json.dumps({"settings": meta, "rows": [asdict(r) for r in rows]}, indent=2)),
        write_output(out / "bench.csv", table.getvalue()),
    ]
    try:
        import matplotlib

        matplotlib.use("Agg")
        import matplotlib.pyplot as plt

        fig, ax = plt.subplots(figsize=(8, 0.45 * len(rows) + 1.5))
        labels = [f"{r.design}: {r.implementation}" for r in rows]
        ax.barh(labels[::-1], [r.seconds * 1e3 for r in rows][::-1])
        ax.set_xlabel("forward + backward (ms)")
        ax.set_title(f"tdiag bench (N={settings['n']}, batch={settings['batch']}, {settings['device']})")
        fig.tight_layout()
        image = io.BytesIO()
        fig.savefig(image, format="png", dpi=120)
        plt.close(fig)
        paths.append(write_output(out / "bench.png", image.getvalue()))
    except ImportError:
        pass
    return paths
