"""Roofline device models for planning by time: an op takes the longer of its arithmetic at the
device's peak and its memory traffic at the device's bandwidth, plus a fixed per-op overhead
(launch and dispatch, which dominates small ops on a CPU). GPUs come from their data sheets; the
local CPU is measured once and cached. torch is imported only to measure."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import math
import os
import platform
import re
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from .errors import Diagnostic, TdiagError
from .files import output_folder, read_regular, write_output


class DeviceSettingError(TdiagError, ValueError):
    """A device named or described wrongly (TDIAG_DEVICE, TDIAG_DEVICE_* figures, --device)."""


PEAK_FLOPS_ENV = "TDIAG_DEVICE_PEAK_FLOPS"
BANDWIDTH_ENV = "TDIAG_DEVICE_BANDWIDTH"
OVERHEAD_ENV = "TDIAG_DEVICE_OVERHEAD"


def larger(a: float, b: float) -> float:
    """max(a, b); a priced number (plan/prices.py) takes both into its formula as a Max."""
    for x, y in ((a, b), (b, a)):
        method = getattr(x, "larger", None)
        if method is not None:
            return method(y)
    return max(a, b)


@dataclass(frozen=True)
class DeviceModel:
    """A roofline: peak arithmetic (FLOP/s), memory bandwidth (bytes/s) and a per-op overhead (s)."""

    name: str
    peak_flops: float
    bandwidth: float
    overhead: float = 0.0
    kinds: tuple[tuple[str, float], ...] = ()  # measured time / roofline time, per op kind
    threads: int | None = None  # the CPU threads torch ran the measurement with
    large_kinds: tuple[tuple[str, float], ...] = ()  # the same at LARGE_KIND_SHAPE, beyond the caches

    def describe(self) -> str:
        """The name and figures, as a plan report's header shows them."""
        threads = f", {self.threads} thread{'s' * (self.threads != 1)}" if self.threads else ""
        return (
            f"{self.name}{threads}: peak {self.peak_flops:.3g} FLOP/s, bandwidth {self.bandwidth:.3g} B/s, "
            f"{self.overhead * 1e6:.3g} µs per op"
        )

    def estimate(self, flops: float, bytes: float) -> float:
        """Seconds for an op of `flops` arithmetic that moves `bytes` to and from memory."""
        return larger(flops / self.peak_flops, bytes / self.bandwidth) + self.overhead

    def factor(self, kind: str | None, moved: float | None = None) -> float:
        """How much longer than its roofline an op of `kind` takes forward and backward on this
        device (`measure_kinds`); 1 for a kind not measured. Given the bytes the op moves
        forward, the factor measured at KIND_SHAPE (in the caches) holds up to that size, the one
        measured at LARGE_KIND_SHAPE (beyond them) from that size on, and between the two it
        goes linearly in log(bytes): an elementwise op on a score tensor of 16M entries costs
        two to four times more per entry than on one of 2M (measured on the project CPU)."""
        if not kind:
            return 1.0
        small = dict(self.kinds).get(kind, 1.0)
        large = dict(self.large_kinds).get(kind)
        if large is None or moved is None or kind not in PASSES:
            return small
        low, high = (PASSES[kind] * math.prod(shape) * 4 for shape in (KIND_SHAPE, LARGE_KIND_SHAPE))
        if moved <= low:
            return small
        if moved >= high:
            return large
        return small + (large - small) * math.log(moved / low) / math.log(high / low)

    @property
    def ridge(self) -> float:
        """FLOPs per byte above which an op is compute bound."""
        return self.peak_flops / self.bandwidth


# Dense (no sparsity) bf16 tensor-core FLOP/s and memory bandwidth from the vendors' data sheets.
# A CUDA device name is matched against the names case-insensitively and the first name it
# contains wins, so variants come before their family (H100 PCIe before H100, A100 before A10,
# L40S before L4). AWS publishes no A10G data sheet: its figure is the one AWS and NVIDIA quote.
DATA_SHEETS: tuple[DeviceModel, ...] = (
    DeviceModel("H100 PCIe", 756e12, 2.0e12),
    DeviceModel("H100 NVL", 835e12, 3.9e12),
    DeviceModel("H100", 989.4e12, 3.35e12),  # SXM5: "NVIDIA H100 80GB HBM3"
    DeviceModel("H200 NVL", 835e12, 4.8e12),
    DeviceModel("H200", 989.4e12, 4.8e12),
    DeviceModel("A100 80GB PCIe", 312e12, 1.935e12),
    DeviceModel("A100-SXM4-80GB", 312e12, 2.039e12),
    DeviceModel("A100", 312e12, 1.555e12),  # 40 GB, SXM4 and PCIe
    DeviceModel("A10G", 70e12, 600e9),
    DeviceModel("A10", 125e12, 600e9),
    DeviceModel("L40S", 362.05e12, 864e9),
    DeviceModel("L40", 181.05e12, 864e9),
    DeviceModel("L4", 121e12, 300e9),
    DeviceModel("RTX 4090", 165.2e12, 1008e9),  # bf16 with fp32 accumulation
)


def data_sheet(device_name: str) -> DeviceModel | None:
    """The data-sheet model whose name the CUDA device name contains (`NVIDIA H100 PCIe`), if any."""
    lowered = device_name.lower()
    return next((d for d in DATA_SHEETS if d.name.lower() in lowered), None)


def for_device(
    name: str, *, peak_flops: float | None = None, bandwidth: float | None = None, overhead: float | None = None
) -> DeviceModel:
    """The model of `cpu` (measured, `local_cpu`), of `cuda`/`cuda:K` (the local GPU's data sheet)
    or of a CUDA device name. Explicit figures, then the TDIAG_DEVICE_* environment variables,
    replace the measured or data-sheet ones; an unknown GPU needs both peak and bandwidth."""
    if name == "cpu":
        return local_cpu(peak_flops=peak_flops, bandwidth=bandwidth, overhead=overhead)
    if re.fullmatch(r"cuda(:\d+)?", name):
        import torch

        name = torch.cuda.get_device_name(name)
    given = _overrides(peak_flops, bandwidth, overhead)
    sheet = data_sheet(name)
    if sheet is None:
        if "peak_flops" in given and "bandwidth" in given:
            return DeviceModel(name, **given)
        known = ", ".join(d.name for d in DATA_SHEETS)
        raise DeviceSettingError(
            Diagnostic(
                f"no data sheet for device '{name}' (known: cpu, {known}); "
                f"give its peak and bandwidth ({PEAK_FLOPS_ENV}, {BANDWIDTH_ENV})"
            )
        )
    return dataclasses.replace(sheet, **given)


def _overrides(peak_flops: float | None, bandwidth: float | None, overhead: float | None) -> dict[str, Any]:
    """The figures given as arguments, else in the environment."""
    given = {"peak_flops": peak_flops, "bandwidth": bandwidth, "overhead": overhead}
    for key, variable in (("peak_flops", PEAK_FLOPS_ENV), ("bandwidth", BANDWIDTH_ENV), ("overhead", OVERHEAD_ENV)):
        if given[key] is None and os.environ.get(variable):
            try:
                given[key] = float(os.environ[variable])
            except ValueError:
                raise DeviceSettingError(Diagnostic(f"{variable}={os.environ[variable]!r} is not a number")) from None
    return {k: v for k, v in given.items() if v is not None}


# ---- the device a plan is made for ----------------------------------------------------------

DEVICE_ENV = "TDIAG_DEVICE"

# A 2-core CPU as torch runs it, for planning before the local CPU has been measured.
NOMINAL_CPU = DeviceModel("cpu (nominal)", 100e9, 10e9, 5e-6)


def planning_device() -> DeviceModel:
    """The device the `time` objective plans for, without importing torch: a CUDA device name
    in TDIAG_DEVICE (its data sheet), else the local CPU's cached measurement for the thread
    count torch will use (`planning_threads`; the file `local_cpu` writes, made by `tdiag bench`),
    else a nominal CPU; the TDIAG_DEVICE_* figures override. Which file is read depends only on
    the machine and the thread count, never on which measurement was made last."""
    name = os.environ.get(DEVICE_ENV, "cpu")
    given = _overrides(None, None, None)
    if name != "cpu":
        sheet = data_sheet(name)
        if sheet is None:
            known = ", ".join(d.name for d in DATA_SHEETS)
            raise DeviceSettingError(Diagnostic(f"{DEVICE_ENV}={name!r}: no data sheet (known: cpu, {known})"))
        return dataclasses.replace(sheet, **given)
    measured = _read(_cache_file(planning_threads()))
    return dataclasses.replace(measured or NOMINAL_CPU, **given)


def planning_threads() -> int:
    """The intra-op thread count torch will start with, predicted without importing torch as
    torch 2.x on x86 sets it (ATen `init_num_threads` takes MKL's `mkl_get_max_threads`):
    MKL_NUM_THREADS, else OMP_NUM_THREADS, when a positive integer, at most the physical cores
    (MKL's dynamic adjustment, unless MKL_DYNAMIC=false; builds without MKL, off x86, take the
    variable as it is); else the physical cores (`physical_cores`). Checked against
    torch.get_num_threads() for each case in tests/test_device.py. A program that calls
    torch.set_num_threads plans for the default all the same."""
    cores = physical_cores()
    capped = platform.machine().lower() in ("x86_64", "amd64") and os.environ.get("MKL_DYNAMIC", "").lower() not in (
        "false",
        "0",
    )
    for variable in ("MKL_NUM_THREADS", "OMP_NUM_THREADS"):
        value = os.environ.get(variable, "").strip()
        if value.isdigit() and int(value) > 0:
            return min(int(value), cores) if capped else int(value)
    return cores


def physical_cores() -> int:
    """The CPU's physical cores (distinct core and package ids in sysfs, as cpuinfo counts
    them), else the logical CPUs."""
    cores = set()
    for topology in Path("/sys/devices/system/cpu").glob("cpu[0-9]*/topology"):
        try:
            cores.add(
                ((topology / "physical_package_id").read_text().strip(), (topology / "core_id").read_text().strip())
            )
        except OSError:
            continue
    return len(cores) or os.cpu_count() or 1


def _cache_dir() -> Path:
    return Path(os.environ.get("XDG_CACHE_HOME") or Path.home() / ".cache") / "tdiag"


def _machine() -> str:
    machine = platform.node() or platform.processor() or platform.machine() or "cpu"
    return re.sub(r"[^A-Za-z0-9_.-]+", "_", machine)


# ---- the local CPU -----------------------------------------------------------------------------


def cache_path() -> Path:
    """Where the local CPU's measurement is kept: one file per machine and thread count, as the
    peak depends on both."""
    import torch

    return _cache_file(torch.get_num_threads())


def _cache_file(threads: int) -> Path:
    return (
        _cache_dir() / f"device-{_machine()}-{threads}threads-v4.json"
    )  # v4: the "rows" kind (a v3 file lacks it, and its factor would read as 1)


def local_cpu(
    *,
    peak_flops: float | None = None,
    bandwidth: float | None = None,
    overhead: float | None = None,
    refresh: bool = False,
) -> DeviceModel:
    """This machine's CPU as torch runs it: measured on first use (about a second) and cached as
    JSON under $XDG_CACHE_HOME/tdiag (default ~/.cache); `refresh` measures again. Explicit
    figures, then the TDIAG_DEVICE_* environment variables, replace the measured ones."""
    given = _overrides(peak_flops, bandwidth, overhead)
    if len(given) == 3:
        return DeviceModel("cpu", **given)
    path = cache_path()
    measured = None if refresh else _read(path)
    if measured is None:
        measured = measure_cpu()
        with contextlib.suppress(TdiagError):  # a cache that cannot be written is measured again next time
            write_output(output_folder(path.parent) / path.name, json.dumps(dataclasses.asdict(measured), indent=2))
    return dataclasses.replace(measured, **given)


def _read(path: Path) -> DeviceModel | None:
    try:
        fields = json.loads(read_regular(str(path), "device cache"))
        for key in ("kinds", "large_kinds"):
            fields[key] = tuple((str(k), float(v)) for k, v in fields.get(key, ()))
        model = DeviceModel(**fields)
    except (OSError, TdiagError, ValueError, TypeError, AttributeError):
        return None
    figures = (model.peak_flops, model.bandwidth, model.overhead)
    if model.threads is not None and not isinstance(model.threads, int):
        return None
    return model if all(isinstance(f, int | float) and f >= 0 for f in figures) and model.peak_flops else None


def measure_cpu(
    *,
    matmul: int = 2048,
    copy_bytes: int = 64 * 2**20,
    repeats: int = 3,
    kind_shapes: tuple[tuple[int, ...], tuple[int, ...]] | None = None,
) -> DeviceModel:
    """Measure the CPU: float32 `matmul`-square products for peak FLOP/s, copying and adding
    `copy_bytes` arrays (well beyond the caches) for bandwidth, a one-element add for the per-op
    overhead, and each elementwise kind's factor in the caches and beyond them (`measure_kinds` at
    `kind_shapes`, default KIND_SHAPE and LARGE_KIND_SHAPE, the sizes `DeviceModel.factor`
    interpolates between). Each figure is the best of `repeats`, the machine's capability rather
    than its noise."""
    import torch

    a, b = torch.randn(matmul, matmul), torch.randn(matmul, matmul)
    product = torch.empty(matmul, matmul)
    flops = 2 * matmul**3 / _best(lambda: torch.mm(a, b, out=product), repeats)
    n = copy_bytes // 4
    x, y, z = torch.ones(n), torch.ones(n), torch.empty(n)
    copy = 2 * copy_bytes / _best(lambda: z.copy_(x), repeats)
    add = 3 * copy_bytes / _best(lambda: torch.add(x, y, out=z), repeats)
    one = torch.ones(1)
    overhead = _best(lambda: torch.add(one, one, out=one), 200)
    model = DeviceModel("cpu", flops, max(copy, add), overhead, threads=torch.get_num_threads())
    small, large = kind_shapes or (KIND_SHAPE, LARGE_KIND_SHAPE)
    return dataclasses.replace(
        model,
        kinds=measure_kinds(model, shape=small, repeats=max(repeats, 5)),
        large_kinds=measure_kinds(model, shape=large, repeats=max(repeats, 3)),
    )


# A forward and backward pass costs three forward passes on the roofline (plan/timing.py); the
# ops below are measured against that at the size of a score tensor (batch 8, 4 heads, 256 × 256),
# each as the generated module writes it, the result fresh and a gradient flowing back.
KIND_SHAPE = (8, 4, 256, 256)
LARGE_KIND_SHAPE = (1, 4, 2048, 2048)  # 64 MiB a tensor: beyond the last-level cache
PASSES = {
    "normalize": 2,
    "softmax": 2,
    "mask": 2,
    "map": 2,
    "scale": 2,
    "sum": 3,
    "thin": 1.5,
    "rows": 1.5,
}  # forward reads + writes


def measure_kinds(model: DeviceModel, *, shape: tuple[int, ...] = KIND_SHAPE, repeats: int = 5) -> tuple:
    """Per elementwise op kind, its measured forward + backward time over the roofline's estimate
    (three forward passes of its bytes at `model.bandwidth`): the normalize box's division, whose
    backward reads and writes the tensor about four times more than its forward, and a boolean
    mask fill are several times their roofline on a CPU. A matmul is measured only where it is
    thin ("thin": an inner size and one outer size of 2 and 4, FiSH's mixing of global heads,
    which moves far more bytes than it computes and runs well below the bandwidth). "rows" is a
    sum over an innermost axis of 2 entries (MGK's M = 2 keys of a softmax over m r): torch's CPU
    reduction pays per row, so a short innermost reduction runs several times below the
    bandwidth (timing.py `short_rows_factor` scales it to other short extents)."""
    import torch

    x = torch.rand(shape).add_(0.5).requires_grad_()
    y = torch.rand(shape).requires_grad_()
    mask = torch.ones(shape[-2:], dtype=torch.bool).triu(1)
    grad = torch.ones(shape)
    mixing = torch.rand(4, 2).requires_grad_()  # FiSH's M = 2 global heads mixed into H = 4
    rows = torch.rand(2, math.prod(shape) // 4).requires_grad_()
    pairs = torch.rand(*shape[:-1], shape[-1] // 2, 2).requires_grad_()  # the same bytes, rows of 2
    pair_grad = torch.ones(pairs.shape[:-1])
    ops = {
        "normalize": lambda: x / (x.sum(-1, keepdim=True) + 1e-6),
        "softmax": lambda: x.softmax(-1),
        "mask": lambda: x.masked_fill(mask, torch.finfo(x.dtype).min),
        "map": lambda: x.exp(),
        "scale": lambda: x * 0.5,
        "sum": lambda: x + y,
        "thin": lambda: (mixing @ rows).view(shape),
        "rows": lambda: pairs.sum(-1),
    }
    size = x.numel() * x.element_size()
    kinds = []
    for kind, op in ops.items():
        gradient = pair_grad if kind == "rows" else grad
        seconds = _median(lambda op=op, gradient=gradient: op().backward(gradient), repeats)
        roofline = 3 * PASSES[kind] * size / model.bandwidth + 2 * model.overhead
        kinds.append((kind, round(seconds / roofline, 3)))
    return tuple(kinds)


def _median(run, repeats: int) -> float:
    times = sorted(_times(run, repeats))
    return times[len(times) // 2]


def _best(run, repeats: int) -> float:
    return max(min(_times(run, repeats)), 1e-9)


def _times(run, repeats: int) -> list[float]:
    """Seconds of each of `repeats` calls of `run`, after one call to warm up."""
    run()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        run()
        times.append(time.perf_counter() - start)
    return times
