"""What a module costs when it trains, measured: the activations autograd keeps for the backward
pass (by storage, with the graph node that saves each and the line that ran it) and the wall time
of training steps. The cost model's predictions are checked against these numbers.

    python -m tdiag.measure designs/mhsa.td --set F=64 --set H=4 --n 128

The input convention (INPUT_CONVENTION) is the footprint model's (tdiag/plan/footprint.py)."""

from __future__ import annotations

import argparse
import dataclasses
import linecache
import sys
import time
import types
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

import torch
from torch import nn

_TORCH_DIR = str(Path(torch.__file__).resolve().parent)

INPUT_CONVENTION = (
    "Input convention: inputs need a gradient, as the input of a layer inside a network does (even the first attention "
    "layer reads a learned embedding): floating-point inputs are detached from the graph they came from "
    "and set to require grad, so that ops keep what the input's gradient needs; the inputs' own storage "
    "is not counted (the layer before holds it). The footprint model (tdiag/plan/footprint.py, "
    "`tdiag plan`) takes the same convention."
)


@dataclass(frozen=True)
class SavedStorage:
    """One storage autograd keeps alive for backward. `nbytes` is the whole storage, not the saved
    view: a slice keeps all of its base alive. `saved_by` names each graph node and attribute
    that saves it (`SoftmaxBackward0.result`); `where` the `file:line` of the code that ran the op."""

    nbytes: int
    shape: tuple[int, ...]  # of the first tensor saved on this storage
    dtype: str
    saved_by: tuple[str, ...]
    where: tuple[str, ...]


@dataclass
class SavedMemory:
    """The activations one forward pass leaves for backward, parameters, buffers and inputs
    excluded (they are held anyway). `tensors` counts saved tensors, a storage saved twice twice;
    `recomputed` those saved under torch.utils.checkpoint, which backward recomputes instead."""

    storages: list[SavedStorage] = field(default_factory=list)
    tensors: int = 0
    recomputed: int = 0

    @property
    def total_bytes(self) -> int:
        return sum(s.nbytes for s in self.storages)

    def by_node(self) -> dict[str, int]:
        """Bytes per kind of graph node (`SoftmaxBackward0`), each storage charged to its first saver."""
        totals: dict[str, int] = {}
        for s in self.storages:
            node = s.saved_by[0].split(".")[0] if s.saved_by else "?"
            totals[node] = totals.get(node, 0) + s.nbytes
        return totals

    def table(self) -> str:
        """One line per storage in the order the forward pass saved it, with the code that ran the op."""
        total = self.total_bytes
        rows = [
            (f"{s.nbytes:,}", f"{s.nbytes / total:.1%}" if total else "-", str(s.shape), s.dtype, ", ".join(s.saved_by))
            for s in self.storages
        ]
        header = ("bytes", "share", "shape", "dtype", "saved by")
        widths = [max(len(r[k]) for r in [header, *rows]) for k in range(len(header))]
        lines = [
            f"saved for backward: {total:,} bytes in {len(self.storages)} storages ({self.tensors} saved tensors"
            + (f", {self.recomputed} recomputed by checkpoint" if self.recomputed else "")
            + ")",
            _row(header, widths) + "  code",
        ]
        for row, s in zip(rows, self.storages, strict=True):
            places = [_show_line(w) for w in s.where] or ["?"]
            lines.append(_row(row, widths) + "  " + places[0])
            lines += [" " * (sum(widths) + 2 * len(widths)) + place for place in places[1:]]
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _row(cells: Sequence[str], widths: Sequence[int]) -> str:
    return "  ".join(c.rjust(w) if k < 2 else c.ljust(w) for k, (c, w) in enumerate(zip(cells, widths, strict=True)))


def _show_line(where: str, width: int = 70) -> str:
    filename, _, number = where.rpartition(":")
    text = linecache.getline(filename, int(number)).strip() if number.isdigit() else ""
    text = text if len(text) <= width else text[: width - 1] + "…"
    return f"{Path(filename).name}:{number} {text}".rstrip()


class _Packed:
    """What the pack hook hands autograd: an index into the call's record, so that the graph walk
    can read which node saved what (SavedTensor.data) without unpacking anything."""

    __slots__ = ("index",)

    def __init__(self, index: int):
        self.index = index


def _caller() -> str:
    """`file:line` of the innermost frame outside torch: the code that ran the op being saved."""
    frame: types.FrameType | None = sys._getframe(2)
    while frame is not None and (
        frame.f_code.co_filename.startswith(_TORCH_DIR) or frame.f_code.co_filename == __file__
    ):
        frame = frame.f_back
    return f"{frame.f_code.co_filename}:{frame.f_lineno}" if frame is not None else "?"


def _tensors(values: Iterable[object]) -> list[torch.Tensor]:
    found: list[torch.Tensor] = []
    for value in values:
        if isinstance(value, torch.Tensor):
            found.append(value)
        elif isinstance(value, list | tuple):
            found += _tensors(value)
        elif isinstance(value, Mapping):
            found += _tensors(value.values())
    return found


def _storage_key(t: torch.Tensor) -> tuple[int, int] | None:
    """(address, bytes) of the tensor's storage; None where it has no storage or no bytes."""
    try:
        storage = t.untyped_storage()
    except (RuntimeError, NotImplementedError):  # sparse and other storage-less layouts
        return None
    return (storage.data_ptr(), storage.nbytes()) if storage.nbytes() else None


def _as_inputs(values: Iterable[object]) -> list[object]:
    """Tensors detached from any graph they came from; floating-point ones then need a gradient,
    as the input of a layer inside a network does (INPUT_CONVENTION)."""
    return [v.detach().requires_grad_(v.is_floating_point()) if isinstance(v, torch.Tensor) else v for v in values]


def saved_for_backward(module: nn.Module, *inputs: object, **kw: object) -> SavedMemory:
    """Run one forward pass of `module` with grad enabled and return what autograd saved for
    backward, deduplicated by storage, without the storages of its parameters, buffers and
    inputs. Floating-point inputs need a gradient whatever the tensors given (INPUT_CONVENTION:
    a layer inside a network); parameters keep their own requires_grad. Only tensors the output's
    graph still references count: a branch whose result is dropped frees what it saved.

    Bytes are `untyped_storage().nbytes()`: what a saved view keeps alive, as the program asked
    for it; allocators round each block up (64 bytes on CPU, 512 on CUDA), which is not counted.
    Saved tensors are found with saved_tensors_hooks, so those saved inside torch.utils.checkpoint
    (its own hooks take precedence) are reported as `recomputed`, and the inputs that checkpoint
    keeps for the recomputation are counted only where another op saves them too."""
    args, kwargs = _as_inputs(inputs), dict(zip(kw, _as_inputs(kw.values()), strict=True))
    held = {
        key
        for t in [*module.parameters(), *module.buffers(), *_tensors(args), *_tensors(kwargs.values())]
        if (key := _storage_key(t)) is not None
    }
    saved: list[torch.Tensor] = []
    places: list[str] = []

    def pack(t: torch.Tensor) -> _Packed:
        saved.append(t)
        places.append(_caller())
        return _Packed(len(saved) - 1)

    def unpack(packed: _Packed) -> torch.Tensor:
        return saved[packed.index]

    try:
        with torch.enable_grad(), torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            outputs = module(*args, **kwargs)
        return _summary(saved, places, _tensors([outputs]), held)
    finally:  # the graph's hooks hold `unpack`, hence `saved`, whose tensors hold the graph: a cycle
        saved.clear()  # through autograd's C++ objects that Python's collector cannot break


def _summary(
    saved: Sequence[torch.Tensor], places: Sequence[str], outputs: Sequence[torch.Tensor], held: set[tuple[int, int]]
) -> SavedMemory:
    """The storages of the tensors the graph behind `outputs` still saves, those `held` left out."""
    savers, recomputed = _savers(outputs)
    result = SavedMemory(recomputed=recomputed)
    storages: dict[tuple[int, int], SavedStorage] = {}
    for index in sorted(savers):
        t = saved[index]
        key = _storage_key(t)
        if key is None or key in held:
            continue
        result.tensors += 1
        first = storages.get(key) or SavedStorage(key[1], tuple(t.shape), str(t.dtype).removeprefix("torch."), (), ())
        storages[key] = dataclasses.replace(
            first,
            saved_by=tuple(dict.fromkeys([*first.saved_by, *savers[index]])),
            where=tuple(dict.fromkeys([*first.where, places[index]])),
        )
    result.storages = list(storages.values())
    return result


def _savers(outputs: Sequence[torch.Tensor]) -> tuple[dict[int, list[str]], int]:
    """Walk the graph behind `outputs`: for each record index packed by our hook, the node
    attributes that save it (`MmBackward0.self`); and how many saved values checkpoint holds."""
    savers: dict[int, list[str]] = {}
    recomputed = 0
    stack = [t.grad_fn for t in outputs if t.grad_fn is not None]
    seen: set[int] = set()
    while stack:
        node = stack.pop()
        if node is None or id(node) in seen:
            continue
        seen.add(id(node))
        for attribute in dir(node):
            if not attribute.startswith("_raw_saved_"):
                continue
            raw = getattr(node, attribute)
            items = list(raw) if isinstance(raw, list | tuple) else [raw]
            for k, item in enumerate(items):
                packed = getattr(item, "data", None)
                name = f"{node.name()}.{attribute.removeprefix('_raw_saved_')}" + (
                    f"[{k}]" if isinstance(raw, list | tuple) else ""
                )
                if isinstance(packed, _Packed):
                    savers.setdefault(packed.index, []).append(name)
                elif packed is not None and not isinstance(packed, torch.Tensor):
                    recomputed += 1  # another hook's handle: torch.utils.checkpoint's _Holder
        stack += [f for f, _ in node.next_functions if f is not None]
    return savers, recomputed


# ---- timing ----------------------------------------------------------------------------------


def _device_of(module: nn.Module, inputs: Sequence[torch.Tensor]) -> torch.device:
    for t in [*inputs, *module.parameters()]:
        return t.device
    return torch.device("cpu")


def synchronize_device(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    elif device.type != "cpu":
        torch.accelerator.synchronize(device)


def _loss(outputs: object) -> torch.Tensor:
    return sum(t.float().square().mean() for t in _tensors([outputs]))  # type: ignore[return-value]


def time_step(
    module: nn.Module,
    inputs: torch.Tensor | Sequence[torch.Tensor],
    *,
    kwargs: Mapping[str, object] | None = None,
    backward: bool = True,
    repeats: int = 10,
    warmup: int = 2,
) -> list[float]:
    """Wall seconds of `repeats` steps after `warmup` untimed ones. A step is a forward pass, a
    mean-square loss and its backward pass, as in training (gradients are set to None before
    each, outside the timing); with `backward=False` a forward pass under no_grad. The device is
    synchronized at both ends of each step."""
    args = [inputs] if isinstance(inputs, torch.Tensor) else list(inputs)
    kwargs = dict(kwargs or {})
    device = _device_of(module, _tensors(args))
    times = []
    for k in range(warmup + repeats):
        module.zero_grad(set_to_none=True)
        synchronize_device(device)
        start = time.perf_counter()
        if backward:
            _loss(module(*args, **kwargs)).backward()
        else:
            with torch.no_grad():
                module(*args, **kwargs)
        synchronize_device(device)
        if k >= warmup:
            times.append(time.perf_counter() - start)
    return times


# ---- command line: one design's breakdown ------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    """`python -m tdiag.measure FILE.td`: the saved-for-backward table of one compiled design."""
    import tdiag

    from .design import DEFAULT_OBJECTIVE, OBJECTIVES

    parser = argparse.ArgumentParser(prog="python -m tdiag.measure", description=main.__doc__, epilog=INPUT_CONVENTION)
    parser.add_argument("design", metavar="FILE.td")
    parser.add_argument("--set", action="append", default=[], metavar="SIZE=VALUE", help="a size of the design")
    parser.add_argument("--n", type=int, default=128, help="sequence length")
    parser.add_argument("--batch", type=int, default=2)
    parser.add_argument("--causal", action="store_true")
    parser.add_argument("--objective", choices=OBJECTIVES, default=DEFAULT_OBJECTIVE)
    args = parser.parse_args(argv)
    sizes = {k: int(v) for k, _, v in (s.partition("=") for s in args.set)}
    design = tdiag.load(args.design, **sizes)
    if args.causal:
        design = design.with_causal_mask()
    n = design.size_values.get("N", args.n)
    module = design.module(seed=0, N=n, objective=args.objective)
    inputs = [
        torch.randn(args.batch, *(int(design.graph.evaluate(a.size, N=n)) for a in x.axes)) for x in design.graph.inputs
    ]
    print(saved_for_backward(module, *inputs))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
