"""A tensor used in a statement (`K[m h d]`, a reshape `W[f (h d)]`, a slice `P[n: N, f]`): its
rules in every stage's table."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from .. import decode_rules as decode
from ..check import CHECK, no_numbers
from ..decode_rules import (
    INNER_LEGS,
    STATE_ROWS,
    STEP_REWRITE,
    StatePlanner,
    StepProgram,
)
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.calls import BUILD
from ..graph.position_rules import Hidden, Pairs
from ..ir import Expr, TensorRef
from ..plan.base import LOWER, REGION_FACTOR
from ..printing import DESCRIBE, PRINT, groups_text, nothing_to_describe
from ..render import RENDER, draw_tensor

if TYPE_CHECKING:
    import torch

    from ..reference import Frame


@EVALUATE.register(TensorRef)
def evaluate(ref: TensorRef, frame: Frame) -> torch.Tensor:
    """A stored, input or computed tensor; an axis named by a group of legs is split into them.
    A mask used as a factor is its 1s (attend) and 0s (hidden); a mask not given is all 1s."""
    if frame.graph.tensors[ref.name].kind == "mask":
        return _mask_numbers(ref, frame)
    x = frame.value(ref)
    if ref.is_sliced:
        x = _sliced(ref, x, frame)
    if not ref.is_reshaped:
        return x
    batch = x.shape[: x.dim() - len(ref.groups)]
    return x.reshape((*batch, *(frame.leg_size(leg) for leg in ref.legs)))


def _sliced(ref: TensorRef, x: torch.Tensor, frame: Frame) -> torch.Tensor:
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


def _mask_numbers(ref: TensorRef, frame: Frame) -> torch.Tensor:
    import torch

    mask = frame.values.get(ref.name)
    if mask is None:
        return torch.ones([frame.leg_size(leg) for leg in ref.legs], dtype=frame.dtype, device=frame.device)
    return mask.to(frame.dtype)


@PRINT.register(TensorRef)
def text(e: TensorRef) -> str:
    """`K[m h d]`, `W[f (h d)]`, or a table read in slices `P[n: N, f]`."""
    return f"{e.name}[{_sliced_groups(e) if e.is_sliced else groups_text(e.groups)}]"


def _sliced_groups(ref: TensorRef) -> str:
    """`h, r: 0..R, f` or `h, n: N, m: N`: the axes of a table read in slices, as written."""
    parts = []
    for k, (group, extent) in enumerate(zip(ref.groups, ref.slices, strict=True)):
        start = ref.offset(k)
        cut = "" if extent is None else f": {extent}" if start == 0 else f": {start}..{start + extent}"
        parts.append(groups_text((group,)) + cut)
    return ", ".join(parts)


DESCRIBE.register(TensorRef)(nothing_to_describe)


RENDER.register(TensorRef)(draw_tensor)


CHECK.register(TensorRef)(no_numbers)


BUILD.unsupported(TensorRef, "not a call: a tensor is written X[legs] (graph/products.py)")


# Positions (graph/position_rules.py): a read of an earlier statement's result is masked where it
# was; the call mask itself hides its (query, key); an identity over the two is the diagonal.
@pos.ZEROS.register(TensorRef)
def zeros(node: TensorRef, hidden: Hidden) -> Pairs:
    return pos.read_hidden(node, hidden)


@pos.HIDES.register(TensorRef)
def hides(node: TensorRef, query: str, key: str, diagonal: Hidden) -> bool:
    return node.name in diagonal and set(node.legs) == {query, key}


@pos.CALL_HIDDEN.register(TensorRef)
def call_hidden(node: TensorRef, name: str, hidden: Hidden) -> Pairs:
    if node.name == name:
        return {(node.legs[-2], node.legs[-1])}
    return pos.read_hidden(node, hidden)


pos.plain(TensorRef, but=(pos.ZEROS, pos.HIDES, pos.CALL_HIDDEN))


# ---- decoding (decode_rules.py): what the kind means to a cache

decode.plain(TensorRef, but=(STATE_ROWS, INNER_LEGS, STEP_REWRITE))


@STATE_ROWS.register(TensorRef)
def noise_rows(planner: StatePlanner, node: TensorRef, target: str) -> str | None:
    """Noise drawn anew at each call over every position cannot be taken at the new rows alone."""
    tensor = planner.tensors[node.name]
    if tensor.kind == "random" and tensor.init is not None and str(tensor.init.param("mode", "train")) == "always":
        return f"noise {node.name} is drawn over every position at each call (mode = always)"
    return None


@INNER_LEGS.register(TensorRef)
def grouped_legs(node: TensorRef) -> set[str]:
    """The legs of its groups (a reshaped read names several per axis)."""
    return {leg for g in node.groups for leg in g}


@STEP_REWRITE.register(TensorRef)
def step_ref(program: StepProgram, node: TensorRef) -> Expr:
    """A cached tensor read at every position from its input, a slice over the step's positions."""
    return program.ref(node)


# lower (plan/base.LOWER): collected as a leaf of its multilinear region (plan/regions.py)
LOWER.unsupported(TensorRef, REGION_FACTOR)
