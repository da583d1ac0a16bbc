"""The reference evaluator: a design graph run statement by statement with `torch.einsum` on fully
materialized tensors. It is the test oracle for the compiler, so it does no planning and no
optimization: every node of every statement is evaluated as written, in the semantics of
docs/language.md. Every value carries arbitrary leading batch dims; its trailing axes are the
legs of the node that computed it, in that node's order."""

from __future__ import annotations

import math
import string
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

import sympy
import torch
from torch import nn

from .graph import DesignGraph
from .init import initial_value, numeric_shape
from .ir import (
    POSITION_MASKS,
    CausalFactor,
    CausalMask,
    Contraction,
    Convolution,
    ElementwiseMap,
    Expr,
    Gather,
    Mask,
    PaddingMask,
    Position,
    PositionIndex,
    Quotient,
    Reduction,
    Scalar,
    Scan,
    SegmentSum,
    SoftmaxBox,
    SquaredDistance,
    Statement,
    SumNode,
    Tensor,
    TensorRef,
    WindowFactor,
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


def statement_value(statement: Statement, frame: Frame) -> torch.Tensor:
    """`target[groups] = expr`: the expression with its legs in the target's order, each group of
    several legs merged into one axis (head-major)."""
    x = align(evaluate(statement.expr, frame), statement.expr.legs, statement.legs)
    batch = x.shape[: x.dim() - len(statement.legs)]
    return x.reshape((*batch, *(math.prod(frame.leg_size(leg) for leg in group) for group in statement.groups)))


def evaluate(node: Expr, frame: Frame) -> torch.Tensor:
    """A node's value: leading batch dims (possibly none), then one axis per leg of `node.legs`."""
    if isinstance(node, TensorRef):
        return tensor_ref(node, frame)
    if isinstance(node, Scalar):
        return torch.tensor(frame.number(node.value), dtype=frame.dtype, device=frame.device)
    if isinstance(node, Contraction):
        return contraction(node, frame)
    if isinstance(node, SumNode):
        return sum_node(node, frame)
    if isinstance(node, Quotient):
        return quotient(node, frame)
    if isinstance(node, SoftmaxBox):
        return softmax_box(node, frame)
    if isinstance(node, ElementwiseMap):
        return elementwise_map(node, frame)
    if isinstance(node, Reduction):
        return reduction(node, frame)
    if isinstance(node, SquaredDistance):
        return squared_distance(node, frame)
    if isinstance(node, Scan):
        return scan(node, frame)
    if isinstance(node, SegmentSum):
        return segment_sum(node, frame)
    if isinstance(node, Convolution):
        return convolution(node, frame)
    if isinstance(node, CausalFactor):
        return causal_mask(CausalMask(node.query, node.key, node.span), node.legs, frame).to(frame.dtype)
    if isinstance(node, WindowFactor):
        return window_mask(node.mask, node.legs, frame).to(frame.dtype)
    if isinstance(node, PositionIndex):
        return frame.leg_indices(node.leg).to(frame.dtype)
    if isinstance(node, Gather):
        return gather(node, frame)
    raise TypeError(f"the reference cannot evaluate a {type(node).__name__}")


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


def tensor_ref(ref: TensorRef, frame: Frame) -> torch.Tensor:
    """A stored, input or computed tensor; an axis named by a group of legs is split into them.
    A mask used as a factor is its 1s (attend) and 0s (hidden); a mask not given is all 1s."""
    if frame.graph.tensors[ref.name].kind == "mask":
        return mask_numbers(ref, frame)
    x = frame.value(ref)
    if ref.is_sliced:
        x = sliced(ref, x, frame)
    if not ref.is_reshaped:
        return x
    batch = x.shape[: x.dim() - len(ref.groups)]
    return x.reshape((*batch, *(frame.leg_size(leg) for leg in ref.legs)))


def sliced(ref: TensorRef, x: torch.Tensor, frame: Frame) -> torch.Tensor:
    """`P[n: N, f]`: the first N entries of each sliced axis, `W[j: a..b]` entries a .. b − 1;
    past the end of the axis is an error."""
    tensor = frame.graph.tensors[ref.name]
    for k, (axis, extent) in enumerate(zip(tensor.axes, ref.slices, strict=True)):
        if extent is None:
            continue
        dim = k - len(tensor.axes)  # from the end: a computed tensor has the batch dims first
        start, want = frame.slice_window(ref, k, extent)
        if ref.offset(k) == 0 and want > x.shape[dim]:
            raise ValueError(
                f"{ref.name}[{axis.leg}: {extent}] reads {want} entries, but axis {axis.leg} has {x.shape[dim]}"
            )
        if start < 0 or want < 1 or start + want > x.shape[dim]:
            raise ValueError(
                f"{ref.name}[{axis.leg}: {_range_text(ref.offset(k), extent)}] is {start}..{start + want} here: "
                f"a range must hold at least one entry and lie within axis {axis.leg}'s {x.shape[dim]} entries"
            )
        x = x.narrow(dim, start, want)
    return x


def _range_text(start: sympy.Expr, extent: sympy.Expr) -> str:
    """`a..b` as the .td writes it."""
    return f"{start}..{sympy.simplify(start + extent)}"


def position_value(position: Position, frame: Frame) -> torch.Tensor:
    """An integer position over its legs (trailing axes in `position.legs()` order), int64."""
    value = _position_part(position, frame)
    return value if isinstance(value, torch.Tensor) else torch.tensor(int(value), device=frame.device)


def _position_part(position: Position, frame: Frame) -> torch.Tensor | int | float:
    """A part of a position: a Python number where it has no legs (numbers and sizes, in double),
    else a tensor over its legs, int64 where whole and float32 where real (a quotient or log not
    yet floored: T5 computes its buckets' log in float32)."""
    if not position.legs():
        return _position_number(position, frame)
    legs = position.legs()
    if position.op == "leg":
        return frame.leg_indices(position.name)
    if position.op == "floor" and position.operands[0].op == "/" and not position.operands[0].is_real():
        a, b = (_aligned(o, legs, frame) for o in position.operands[0].operands)
        return a // b
    parts = [_aligned(o, legs, frame) for o in position.operands]
    if position.is_real():
        parts = [p.float() if isinstance(p, torch.Tensor) and not p.is_floating_point() else p for p in parts]
    op = position.op
    if op == "neg":
        return -parts[0]
    if op == "abs":
        return parts[0].abs()
    if op == "floor":
        return parts[0].floor().long() if parts[0].is_floating_point() else parts[0]
    if op == "log":
        return parts[0].log()
    if op == "clamp":
        return torch.clamp(*parts)
    if op in ("min", "max"):
        a, b = (p if isinstance(p, torch.Tensor) else torch.tensor(p, device=frame.device) for p in parts)
        return torch.minimum(a, b) if op == "min" else torch.maximum(a, b)
    a, b = parts
    return {"+": lambda: a + b, "-": lambda: a - b, "*": lambda: a * b, "/": lambda: a / b}[op]()


def _aligned(position: Position, legs: tuple[str, ...], frame: Frame) -> torch.Tensor | int | float:
    value = _position_part(position, frame)
    return align(value, position.legs(), legs) if isinstance(value, torch.Tensor) else value


def _position_number(position: Position, frame: Frame) -> int | float:
    """A position part without legs, in Python numbers (whole ones stay int)."""
    if position.op == "number":
        value = frame.number(position.value)
        return int(value) if value == int(value) and not position.is_real() else value
    parts = [_position_number(o, frame) for o in position.operands]
    functions = {
        "neg": lambda a: -a,
        "abs": abs,
        "log": math.log,
        "min": min,
        "max": max,
        "clamp": lambda x, lo, hi: min(max(x, lo), hi),
        "+": lambda a, b: a + b,
        "-": lambda a, b: a - b,
        "*": lambda a, b: a * b,
        "/": lambda a, b: a / b,
    }
    if position.op == "floor":
        inner = position.operands[0]
        if inner.op == "/" and not inner.is_real():
            a, b = (_position_number(o, frame) for o in inner.operands)
            return a // b
        return math.floor(parts[0])
    return functions[position.op](*parts)


def gather(node: Gather, frame: Frame) -> torch.Tensor:
    """The source table read along its axis `node.axis` at the position, for every index of the
    position's legs (advanced indexing); a position past a run-time axis is a ValueError."""
    source = node.source
    assert source is not None and node.position is not None
    x = frame.value(source)
    k = source.legs.index(node.axis) - len(source.legs)
    if node.checked is not None and x.shape[k] <= node.checked:
        raise ValueError(
            f"{source.name}[{node.axis} = {node.position}] reads position {node.checked}, "
            f"but axis {node.axis} has {x.shape[k]} entries"
        )
    others = [leg for leg in source.legs if leg != node.axis]
    index = position_value(node.position, frame)
    result = x.movedim(k, -1)[..., index]
    return align(result, [*others, *node.position.legs()], node.legs)


def mask_numbers(ref: TensorRef, frame: Frame) -> torch.Tensor:
    mask = frame.values.get(ref.name)
    if mask is None:
        return torch.ones([frame.leg_size(leg) for leg in ref.legs], dtype=frame.dtype, device=frame.device)
    return mask.to(frame.dtype)


def contraction(node: Contraction, frame: Frame) -> torch.Tensor:
    """coefficient * einsum of the factors: `summed` legs are summed, the others kept."""
    inner = {leg for factor in node.factors for leg in factor.legs}
    assert inner == set(node.legs) | set(node.summed), f"contraction legs {inner} vs {node.legs} + {node.summed}"
    letters = dict(zip(sorted(inner | set(node.legs)), string.ascii_letters, strict=False))
    inputs = ",".join("..." + "".join(letters[leg] for leg in factor.legs) for factor in node.factors)
    spec = f"{inputs}->..." + "".join(letters[leg] for leg in node.legs)
    return frame.number(node.coefficient) * frame.einsum(spec, *(evaluate(f, frame) for f in node.factors))


def sum_node(node: SumNode, frame: Frame) -> torch.Tensor:
    """Σ sign * term, each term broadcast along the legs it lacks."""
    terms = [
        sign * align(evaluate(t, frame), t.legs, node.legs) for t, sign in zip(node.terms, node.signs, strict=True)
    ]
    total = terms[0]
    for term in terms[1:]:
        total = total + term
    return total


def quotient(node: Quotient, frame: Frame) -> torch.Tensor:
    """numerator / denominator, broadcast along the legs each lacks."""
    numerator, denominator = node.numerator, node.denominator
    assert numerator is not None and denominator is not None
    return align(evaluate(numerator, frame), numerator.legs, node.legs) / align(
        evaluate(denominator, frame), denominator.legs, node.legs
    )


def softmax_box(node: SoftmaxBox, frame: Frame) -> torch.Tensor:
    """softmax (is_exp): softmax of scale * content jointly over the normalized legs, logits a
    padding mask hides set to the dtype's lowest finite value (a row of them averages the values)
    and those a causal mask hides to -inf (the future never takes weight). normalize: content
    with masked entries 0, divided by its sum over the normalized legs plus eps."""
    assert node.content is not None
    x = align(evaluate(node.content, frame), node.content.legs, node.legs)
    dims = leg_dims(node.normalized, node.legs)
    if node.is_exp:
        x = frame.number(node.scale) * x
        padded = masks_allowed([m for m in node.masks if isinstance(m, PaddingMask)], node.legs, frame)
        causal = masks_allowed([m for m in node.masks if isinstance(m, POSITION_MASKS)], node.legs, frame)
        if padded is not None:
            x = torch.where(padded, x, torch.finfo(x.dtype).min)
        if causal is not None:  # the future takes no weight, even in a row whose past is all padding
            x = torch.where(causal, x, float("-inf"))
        if node.sink is not None:
            sink = align(evaluate(node.sink, frame), node.sink.legs, node.legs)
            return sink_softmax(x, sink, dims)
        return joint_softmax(x, dims)
    allowed = masks_allowed(node.masks, node.legs, frame)
    if allowed is not None:
        x = torch.where(allowed, x, 0.0)
    return x / (x.sum(dim=dims, keepdim=True) + frame.number(node.eps))


def sink_softmax(x: torch.Tensor, sink: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """The softmax of x over `dims` with the logit `sink` (constant along `dims`) one more entry
    of each row's denominator, as gpt-oss's eager attention computes it: the row's logits and its
    sink concatenated, softmaxed, the sink's weight dropped. No mask hides the sink, so a row
    whose keys are all hidden gives weights ≈ 0 (a padded row) or exactly 0 (a causal one)."""
    dims = [d % x.dim() for d in dims]
    end = list(range(x.dim() - len(dims), x.dim()))
    moved = x.movedim(dims, end)
    flat = moved.flatten(x.dim() - len(dims))
    row = sink.expand(x.shape).movedim(dims, end).flatten(x.dim() - len(dims))[..., :1]
    weights = torch.cat([flat, row], dim=-1).softmax(dim=-1)[..., :-1]
    return weights.reshape(moved.shape).movedim(end, dims)


def joint_softmax(x: torch.Tensor, dims: list[int]) -> torch.Tensor:
    """Softmax over several dims at once: moved to the end, flattened, softmaxed, put back."""
    dims = [d % x.dim() for d in dims]
    end = list(range(x.dim() - len(dims), x.dim()))
    moved = x.movedim(dims, end)
    flat = moved.flatten(x.dim() - len(dims)).softmax(dim=-1)  # flatten: also for an empty batch
    return flat.reshape(moved.shape).movedim(end, dims)


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


TORCH_MAPS = {
    "sigmoid": torch.sigmoid,
    "tanh": torch.tanh,
    "softplus": nn.functional.softplus,
    "silu": nn.functional.silu,
    "gelu": nn.functional.gelu,
    "sin": torch.sin,
    "cos": torch.cos,
    "sqrt": torch.sqrt,
    "abs": torch.abs,
}


def elementwise_map(node: ElementwiseMap, frame: Frame) -> torch.Tensor:
    """exp, log, relu, elu1 = elu + 1, the common maps (sigmoid ... abs), clamp(lo, hi), pow(p)."""
    assert node.operand is not None
    x = align(evaluate(node.operand, frame), node.operand.legs, node.legs)
    params = [frame.number(p) for p in node.params]
    if node.name == "exp":
        return torch.exp(x)
    if node.name == "log":
        return torch.log(x)
    if node.name == "relu":
        return torch.relu(x)
    if node.name == "elu1":
        return nn.functional.elu(x) + 1
    if node.name in TORCH_MAPS:
        return TORCH_MAPS[node.name](x)
    if node.name == "clamp":
        return torch.clamp(x, params[0], params[1])
    if node.name in ("maximum", "minimum"):
        return torch.clamp(x, **{"min" if node.name == "maximum" else "max": params[0]})
    if node.name == "pow":
        return x ** (int(params[0]) if params[0].is_integer() else params[0])
    raise ValueError(f"unknown elementwise map {node.name}")


def reduction(node: Reduction, frame: Frame) -> torch.Tensor:
    """max, logsumexp or mean over the `over` legs."""
    operand = node.operand
    assert operand is not None
    x = evaluate(operand, frame)
    dims = leg_dims(node.over, operand.legs)
    allowed = masks_allowed(node.masks, operand.legs, frame)
    if allowed is not None:
        x, allowed = torch.broadcast_tensors(x, allowed)
        x = torch.where(allowed, x, torch.finfo(x.dtype).min if node.name != "mean" else 0.0)
    if node.name == "max":
        x = x.amax(dim=dims)
    elif node.name == "logsumexp":
        x = x.logsumexp(dim=dims)
    elif node.name == "mean" and allowed is not None:
        x = x.sum(dim=dims) / allowed.sum(dim=dims).clamp(min=1).to(x.dtype)
    elif node.name == "mean":
        x = x.mean(dim=dims)
    else:
        raise ValueError(f"unknown reduction {node.name}")
    return align(x, [leg for leg in operand.legs if leg not in node.over], node.legs)


def scan(node: Scan, frame: Frame) -> torch.Tensor:
    """A prefix scan along `along`, entry by entry: entry i combines the operand's entries k ≤ i
    (k < i when exclusive; k ≥ i, k > i when reversed) by a running total (a sum, or log Σ exp
    for logcumsumexp); a hidden entry adds 0 to a sum, and to a log Σ exp the dtype's lowest
    number where padding hides it, −inf where a causal mask does."""
    operand = node.operand
    assert operand is not None
    x = evaluate(operand, frame)
    empty = 0.0 if node.name == "cumsum" else -math.inf
    if node.name == "logcumsumexp":  # a padded entry is the dtype's lowest number, a future one −inf
        padding = masks_allowed([m for m in node.masks if isinstance(m, PaddingMask)], operand.legs, frame)
        if padding is not None:
            x, padding = torch.broadcast_tensors(x, padding)
            x = torch.where(padding, x, torch.finfo(x.dtype).min)
    allowed = masks_allowed(
        node.masks if node.name == "cumsum" else [m for m in node.masks if isinstance(m, POSITION_MASKS)],
        operand.legs,
        frame,
    )
    if allowed is not None:
        x, allowed = torch.broadcast_tensors(x, allowed)
    dim = leg_dims([node.along], operand.legs)[0]
    entries = list(x.unbind(dim))
    visible = list(allowed.unbind(dim)) if allowed is not None else [None] * len(entries)
    order = range(len(entries) - 1, -1, -1) if node.reverse else range(len(entries))
    total = torch.full_like(entries[0], empty)
    results: list[torch.Tensor] = [total] * len(entries)
    for i in order:
        entry = entries[i] if visible[i] is None else torch.where(visible[i], entries[i], empty)
        after = total + entry if node.name == "cumsum" else torch.logaddexp(total, entry)
        results[i] = total if node.exclusive else after
        total = after
    return torch.stack(results, dim)


def segment_sum(node: SegmentSum, frame: Frame) -> torch.Tensor:
    """S[.., n, m] = Σ_{k=m+1..n} a_k for m ≤ n and −inf for m > n, by its definition: a sum
    of the entries between, for every pair (n, m)."""
    operand = node.operand
    assert operand is not None
    a = evaluate(operand, frame)
    rest = [leg for leg in operand.legs if leg != node.along]
    a = align(a, operand.legs, (*rest, node.along))
    size = a.shape[-1]
    rows = []
    for n in range(size):
        row = []
        for m in range(size):
            if m > n:
                row.append(torch.full_like(a[..., 0], -math.inf))
            else:
                row.append(a[..., m + 1 : n + 1].sum(dim=-1))
        rows.append(torch.stack(row, -1))
    return align(torch.stack(rows, -2), (*rest, node.along, node.key), node.legs)


def convolution(node: Convolution, frame: Frame) -> torch.Tensor:
    """Σ over the offset legs of kernel · operand at the shifted positions, by the definition: the
    operand's hidden entries zeroed, then for each shift the operand read at leg + sign·k + start
    for every offset k (0 where that is outside the leg), stacked along the offset leg, and the
    product with the kernel summed over the offsets."""
    operand, kernel = node.operand, node.kernel
    assert operand is not None and kernel is not None
    x = evaluate(operand, frame)
    allowed = masks_allowed(node.masks, operand.legs, frame)
    if allowed is not None:
        x, allowed = torch.broadcast_tensors(x, allowed)
        x = torch.where(allowed, x, torch.zeros((), dtype=x.dtype, device=x.device))
    legs = list(operand.legs)
    for shift in node.shifts:
        dim = x.dim() - len(legs) + legs.index(shift.leg)
        size = x.shape[dim]
        copies = []
        for k in range(frame.leg_size(shift.offset)):
            source = torch.arange(size, device=x.device) + shift.sign * k + int(frame.number(shift.start))
            inside = ((source >= 0) & (source < size)).to(x.dtype)
            read = x.index_select(dim, source.clamp(0, size - 1))
            copies.append(read * inside.reshape((size, *([1] * (x.dim() - dim - 1)))))
        x = torch.stack(copies, -1)
        legs.append(shift.offset)
    product = x * align(evaluate(kernel, frame), kernel.legs, legs)
    return align(product.sum(dim=leg_dims(node.taps, legs)), operand.legs, node.legs)


def squared_distance(node: SquaredDistance, frame: Frame) -> torch.Tensor:
    """Σ_over (left - right)², naively: both sides broadcast to the union of their legs."""
    left, right = node.left, node.right
    assert left is not None and right is not None
    union = tuple(dict.fromkeys((*left.legs, *right.legs)))
    difference = align(evaluate(left, frame), left.legs, union) - align(evaluate(right, frame), right.legs, union)
    x = (difference**2).sum(dim=leg_dims(node.over, union))
    return align(x, [leg for leg in union if leg not in node.over], node.legs)
