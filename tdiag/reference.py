"""The reference evaluator: a design graph run statement by statement with `torch.einsum` on fully
materialized tensors. It is the test oracle for the compiler, so it does no planning and no
optimization: every node of every statement is evaluated as written, in the semantics of
docs/language.md. Every value carries arbitrary leading batch dims; its trailing axes are the
legs of the node that computed it, in that node's order."""

from __future__ import annotations

import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import sympy
import torch
from torch import nn

from .evaluation import EVALUATE
from .graph import DesignGraph
from .init import initial_value, numeric_shape
from .ir import (
    CausalMask,
    Expr,
    Mask,
    PaddingMask,
    Statement,
    Tensor,
    TensorRef,
    WindowMask,
)

__all__ = ["ReferenceModule"]


class ReferenceModule(nn.Module):
    """Evaluates `graph` directly and naively. Parameters are registered under their tensor's
    name with axes in declaration order; constants are non-persistent buffers, `buffer` tensors
    persistent ones. Values for one seed equal those of any module built with tdiag.init.

    forward(*inputs, return_intermediates=False, **masks): the `input` tensors positionally in
    declaration order, `mask` inputs by name (bool, True = attend; missing = attend everywhere).
    Returns the output (a tuple when there are several) and, with return_intermediates=True,
    also a dict of every statement's value by target name."""

    def __init__(
        self,
        graph: DesignGraph,
        sizes: Mapping[str, int] | None = None,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.tdiag_graph = graph
        self.tdiag_dtype = dtype
        self.tdiag_sizes = known_sizes(graph, dict(sizes or {}))
        for tensor in graph.tensors.values():
            if tensor.kind not in ("param", "const", "buffer") or _follows_the_input(tensor, graph, self.tdiag_sizes):
                continue
            shape = numeric_shape(tensor, self.tdiag_sizes, graph)
            value = initial_value(tensor, shape, graph, self.tdiag_sizes, seed, dtype)
            if tensor.kind == "param":
                self.register_parameter(tensor.name, nn.Parameter(value))
            else:
                self.register_buffer(tensor.name, value, persistent=tensor.kind == "buffer")

    def new_cache(self):
        """A decoding cache for this module (tdiag.DecodeCache), stepping by this evaluator:
        `self(x, cache=cache)` computes the positions of x after those it holds (docs/decoding.md)."""
        from .decode import DecodeCache

        return DecodeCache(self)

    def forward(
        self, *inputs: torch.Tensor, return_intermediates: bool = False, cache: object = None, **masks: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...] | tuple[object, dict[str, torch.Tensor]]:
        if cache is not None:
            return self._tdiag_extend(cache, inputs, masks)
        given = self._tdiag_given(inputs, masks)
        sizes = bind_sizes(self.tdiag_graph, self.tdiag_sizes, given)
        batch_shape = torch.broadcast_shapes(*(batch_dims(x, self.tdiag_graph.tensors[n]) for n, x in given.items()))
        device = next(iter(given.values())).device if given else torch.device("cpu")
        frame = Frame(self.tdiag_graph, sizes, dict(given), self._tdiag_compute_dtype(inputs), device)
        for tensor in self.tdiag_graph.tensors.values():
            if tensor.kind == "const" and _follows_the_input(tensor, self.tdiag_graph, self.tdiag_sizes):
                shape = numeric_shape(tensor, sizes, self.tdiag_graph)
                value = initial_value(tensor, shape, self.tdiag_graph, sizes, 0, frame.dtype)
                frame.values[tensor.name] = value.to(device)
            elif tensor.kind == "param" or tensor.kind == "const":
                frame.values[tensor.name] = getattr(self, tensor.name)
            elif tensor.kind == "buffer":  # a copy: the update below must not touch saved tensors
                frame.values[tensor.name] = getattr(self, tensor.name).clone()
            elif tensor.kind == "random":
                frame.values[tensor.name] = self._tdiag_noise(tensor, batch_shape, frame)
        intermediates = {}
        for statement in self.tdiag_graph.statements:
            frame.values[statement.target] = intermediates[statement.target] = statement_value(statement, frame)
        outputs = tuple(frame.values[name] for name in self.tdiag_graph.outputs)
        if self.training:
            self._tdiag_update_buffers(frame)
        output = outputs[0] if len(outputs) == 1 else outputs
        return (output, intermediates) if return_intermediates else output

    def _tdiag_compute_dtype(self, inputs: Sequence[torch.Tensor]) -> torch.dtype:
        """Constants, positions and noise are made in the first input's dtype, as in the compiled
        module, so that `.double()` on the module and float64 inputs evaluate in float64."""
        return next((x.dtype for x in inputs if x.is_floating_point()), self.tdiag_dtype)

    def _tdiag_extend(
        self, cache: object, inputs: Sequence[torch.Tensor], masks: Mapping[str, torch.Tensor]
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The outputs at the positions of the one input, after those the decoding cache holds."""
        if not callable(getattr(cache, "extend", None)):
            raise TypeError(f"cache must be the decoding cache module.new_cache() makes, got {type(cache).__name__}")
        if len(inputs) != 1:
            raise ValueError(f"a decoding cache extends one input, got {len(inputs)}")
        return cache.extend(inputs[0], module=self, **masks)

    def _tdiag_given(
        self, inputs: Sequence[torch.Tensor], masks: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The inputs and masks by name, checked for count, names and mask dtype."""
        declared = [t.name for t in self.tdiag_graph.inputs]
        if len(inputs) != len(declared):
            raise ValueError(
                f"{self.tdiag_graph.name} takes {len(declared)} input(s) ({', '.join(declared)}), got {len(inputs)}"
            )
        for name, x in zip(declared, inputs, strict=True):
            if not x.is_floating_point():
                raise TypeError(f"input {name} must be a floating-point tensor, got {x.dtype}")
        mask_names = [t.name for t in self.tdiag_graph.tensors_of_kind("mask")]
        for name, mask in masks.items():
            if name not in mask_names:
                known = ", ".join(mask_names) or "none"
                raise ValueError(f"{self.tdiag_graph.name} has no mask input '{name}' (its masks: {known})")
            if mask is not None and mask.dtype != torch.bool:
                raise ValueError(f"mask {name} must be a bool tensor (True = attend), got {mask.dtype}")
        return dict(zip(declared, inputs, strict=True)) | {k: v for k, v in masks.items() if v is not None}

    def _tdiag_noise(self, tensor: Tensor, batch_shape: torch.Size, frame: Frame) -> torch.Tensor:
        """Fresh N(0, 1) noise (global RNG) when the mode says so, zeros otherwise."""
        shape = (*batch_shape, *numeric_shape(tensor, frame.sizes, self.tdiag_graph))
        mode = tensor.init.param("mode", "train") if tensor.init else "train"
        if mode == "always" or (mode == "train" and self.training):
            return torch.randn(shape, dtype=frame.dtype, device=frame.device)
        return torch.zeros(shape, dtype=frame.dtype, device=frame.device)

    def _tdiag_update_buffers(self, frame: Frame) -> None:
        """Evaluate every update rule (no gradient, averaged over the batch dims) from this forward
        pass's values, then copy the results into the buffers."""
        new = {}
        with torch.no_grad():
            for update in self.tdiag_graph.updates:
                x = align(evaluate(update.expr, frame), update.expr.legs, update.legs)
                batch = x.dim() - len(update.legs)
                new[update.target] = x.mean(dim=tuple(range(batch))) if batch else x
            for name, x in new.items():
                buffer = getattr(self, name)
                buffer.copy_(x.reshape(buffer.shape))


# ---- sizes and inputs ----------------------------------------------------------------------


def _follows_the_input(tensor, graph: DesignGraph, sizes: Mapping[str, int]) -> bool:
    """A const over a run-time size (N) that the module was not built for: made at each call at
    the size read from the input, never stored (check refuses a param or buffer over one)."""
    return tensor.kind == "const" and any(not graph.evaluate(a.size, **sizes).is_Integer for a in tensor.axes)


def known_sizes(graph: DesignGraph, given: Mapping[str, int]) -> dict[str, int]:
    """Every size that is a number once `given` is substituted (derived sizes recomputed)."""
    for name in given:
        if name not in graph.sizes:
            raise ValueError(f"design {graph.name} has no size {name} (its sizes: {', '.join(graph.sizes)})")
    values = {}
    for name, size in graph.sizes.items():
        value = graph.evaluate(size.symbol, **given)
        if not value.is_number:
            continue
        if not (value.is_Integer and value > 0):
            raise ValueError(f"size {name} = {size.definition} is {value}; a size is a whole positive number")
        if name in given and int(value) != given[name]:
            raise ValueError(f"size {name} = {size.definition} = {value} cannot be set to {given[name]}")
        values[name] = int(value)
    return values


def batch_dims(x: torch.Tensor, tensor: Tensor) -> torch.Size:
    return x.shape[: x.dim() - len(tensor.axes)]


def bind_sizes(graph: DesignGraph, sizes: Mapping[str, int], given: Mapping[str, torch.Tensor]) -> dict[str, int]:
    """Bind free sizes (N) from the inputs' shapes, then check every input axis against its size."""
    bound = dict(sizes)
    for name, x in given.items():
        tensor = graph.tensors[name]
        if x.dim() < len(tensor.axes):
            legs = " ".join(tensor.legs)
            raise ValueError(
                f"{tensor.kind} {name}: expected at least {len(tensor.axes)} dims [..., {legs}], "
                f"got shape {tuple(x.shape)}"
            )
        for axis, actual in zip(tensor.axes, x.shape[x.dim() - len(tensor.axes) :], strict=True):
            if isinstance(axis.size, sympy.Symbol) and axis.size.name not in bound:
                if actual == 0:
                    raise ValueError(f"{tensor.kind} {name}: leg {axis.leg} (size {axis.size}) has no entries")
                bound[axis.size.name] = actual
    bound = known_sizes(graph, bound)
    for name, x in given.items():
        tensor = graph.tensors[name]
        for axis, actual in zip(tensor.axes, x.shape[x.dim() - len(tensor.axes) :], strict=True):
            expected = graph.evaluate(axis.size, **bound)
            if not expected.is_number:
                raise ValueError(f"{tensor.kind} {name}: cannot bind leg {axis.leg} of size {axis.size} from its shape")
            if int(expected) != actual:
                size = str(expected) if axis.size == expected else f"{axis.size} = {expected}"
                raise ValueError(f"{tensor.kind} {name}: leg {axis.leg} has size {size}, got {actual}")
    return bound


# ---- evaluating expressions ----------------------------------------------------------------


@dataclass
class Frame:
    """What one forward pass evaluates against: sizes (with run-time ones bound) and the values
    of every tensor so far, by name."""

    graph: DesignGraph
    sizes: dict[str, int]
    values: dict[str, torch.Tensor]
    dtype: torch.dtype
    device: torch.device
    _leg_sizes: dict[str, int] = field(default_factory=dict)

    def number(self, expr: sympy.Expr) -> float:
        return float(self.graph.evaluate(expr, **self.sizes))

    def leg_size(self, leg: str) -> int:
        if leg not in self._leg_sizes:
            self._leg_sizes[leg] = int(self.graph.evaluate(self.graph.legs[leg].size, **self.sizes))
        return self._leg_sizes[leg]

    def leg_start(self, leg: str) -> int:
        """The position of a leg's first entry: 0 in a whole forward pass; a decoding step
        (tdiag.decode) runs the new queries from the cached length on."""
        return 0

    def leg_indices(self, leg: str) -> torch.Tensor:
        """The positions a leg runs over, int64: leg_start .. leg_start + leg_size − 1."""
        start = self.leg_start(leg)
        return torch.arange(start, start + self.leg_size(leg), device=self.device)

    def value(self, ref: TensorRef) -> torch.Tensor:
        """The value `ref` reads, before slicing and reshaping (a decoding step joins cached rows)."""
        return self.values[ref.name]

    def einsum(self, spec: str, *operands: torch.Tensor) -> torch.Tensor:
        return torch.einsum(spec, *operands)

    def slice_window(self, ref: TensorRef, axis: int, extent: sympy.Expr) -> tuple[int, int]:
        """The first entry and the count that axis `axis` of `ref` reads."""
        return int(self.number(ref.offset(axis))), int(self.number(extent))

    def evaluate(self, node: Expr) -> torch.Tensor:
        """A sub-expression's value in this frame (what a construct's evaluate rule recurses by)."""
        return evaluate(node, self)


def statement_value(statement: Statement, frame: Frame) -> torch.Tensor:
    """`target[groups] = expr`: the expression with its legs in the target's order, each group of
    several legs merged into one axis (head-major)."""
    x = align(evaluate(statement.expr, frame), statement.expr.legs, statement.legs)
    batch = x.shape[: x.dim() - len(statement.legs)]
    return x.reshape((*batch, *(math.prod(frame.leg_size(leg) for leg in group) for group in statement.groups)))


def evaluate(node: Expr, frame: Frame) -> torch.Tensor:
    """A node's value: leading batch dims (possibly none), then one axis per leg of `node.legs`,
    by the evaluate rule of its kind (tdiag/constructs)."""
    return EVALUATE.lookup(node)(node, frame)


def align(x: torch.Tensor, legs: Sequence[str], to: Sequence[str]) -> torch.Tensor:
    """`x` (trailing axes `legs`) with trailing axes `to`: permuted, and a size-1 axis for each
    leg of `to` that `x` lacks, so that it broadcasts along it."""
    legs, to = tuple(legs), tuple(to)
    assert set(legs) <= set(to), f"legs {legs} do not fit in {to}"
    batch = x.dim() - len(legs)
    kept = [leg for leg in to if leg in legs]
    x = x.permute(tuple(range(batch)) + tuple(batch + legs.index(leg) for leg in kept))
    sizes = dict(zip(kept, x.shape[batch:], strict=True))
    return x.reshape((*x.shape[:batch], *(sizes.get(leg, 1) for leg in to)))


def leg_dims(legs: Sequence[str], of: Sequence[str]) -> list[int]:
    """The (negative) dims of `legs` in a tensor whose trailing axes are `of`, whatever its batch dims."""
    return [tuple(of).index(leg) - len(of) for leg in legs]


def masks_allowed(masks: Sequence[Mask], legs: Sequence[str], frame: Frame) -> torch.Tensor | None:
    """True where every mask lets an entry through, over `legs` (broadcast along the legs no
    mask has); None when there is no mask."""
    allowed = None
    for mask in masks:
        if isinstance(mask, CausalMask):
            part = causal_mask(mask, legs, frame)
        elif isinstance(mask, WindowMask):
            part = window_mask(mask, legs, frame)
        elif isinstance(mask, PaddingMask):
            if mask.tensor.name not in frame.values:  # not given: attend everywhere
                continue
            part = align(frame.values[mask.tensor.name], mask.tensor.legs, legs)
        else:
            raise TypeError(f"unknown mask {mask!r}")
        allowed = part if allowed is None else allowed & part
    return allowed


def causal_mask(mask: CausalMask, legs: Sequence[str], frame: Frame) -> torch.Tensor:
    """Key index <= query index, over `legs` (size 1 along the other legs)."""

    def index(leg: str) -> torch.Tensor:
        shape = [-1 if other == leg else 1 for other in legs]
        return frame.leg_indices(leg).reshape(shape)

    return index(mask.key) <= index(mask.query)


def window_mask(mask: WindowMask, legs: Sequence[str], frame: Frame) -> torch.Tensor:
    """query − before < key < query + after, over `legs` (size 1 along the other legs)."""

    def index(leg: str) -> torch.Tensor:
        shape = [-1 if other == leg else 1 for other in legs]
        return frame.leg_indices(leg).reshape(shape)

    offset = index(mask.key) - index(mask.query)
    return (offset > -int(frame.number(mask.before))) & (offset < int(frame.number(mask.after)))
