"""A gather `Rel[h, r = clamp(m - n, -K, K) + K]`: a table read along one axis at an integer
position of other legs (Shaw et al. 2018, T5's relative bias). Its rules in every stage's table."""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .. import decode_rules as decode
from ..check import CHECK, no_numbers
from ..decode_rules import (
    KV_ROWS,
    NEW,
    STATE_ROWS,
    STEP_REWRITE,
    NotCompiledError,
    RowRequests,
    StatePlanner,
    StepProgram,
)
from ..evaluation import EVALUATE
from ..graph import position_rules as pos
from ..graph.calls import BUILD
from ..ir import Expr, Gather, Position
from ..plan.base import LOWER
from ..plan.positions import lower_gather
from ..printing import DESCRIBE, PRINT, nothing_to_describe
from ..render import RENDER, draw_tensor, escape

if TYPE_CHECKING:
    import torch

    from ..reference import Frame
    from ..render import Drawing


@EVALUATE.register(Gather)
def evaluate(node: Gather, frame: Frame) -> torch.Tensor:
    """The source table read along its axis `node.axis` at the position, for every index of the
    position's legs (advanced indexing); a position past a run-time axis is a ValueError."""
    from ..reference import align

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
    index = _position_value(node.position, frame)
    result = x.movedim(k, -1)[..., index]
    return align(result, [*others, *node.position.legs()], node.legs)


def _position_value(position: Position, frame: Frame) -> torch.Tensor:
    """An integer position over its legs (trailing axes in `position.legs()` order), int64."""
    import torch

    value = _position_part(position, frame)
    return value if isinstance(value, torch.Tensor) else torch.tensor(int(value), device=frame.device)


def _position_part(position: Position, frame: Frame) -> torch.Tensor | int | float:
    """A part of a position: a Python number where it has no legs (numbers and sizes, in double),
    else a tensor over its legs, int64 where whole and float32 where real (a quotient or log not
    yet floored: T5 computes its buckets' log in float32)."""
    import torch

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
    import torch

    from ..reference import align

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


@PRINT.register(Gather)
def text(e: Gather) -> str:
    """`Rel[h, r = clamp(m - n, -K, K) + K]`: the source's legs, the gathered one at its position."""
    assert e.source is not None
    legs = [f"{leg} = {e.position}" if leg == e.axis else leg for leg in e.source.legs]
    return f"{e.source.name}[{', '.join(legs)}]"


DESCRIBE.register(Gather)(nothing_to_describe)


@RENDER.register(Gather)
def draw(d: Drawing, e: Gather, env: dict[str, str], cluster: str | None) -> None:
    """The table, its gathered axis ending at a node saying the position it is read at."""
    assert e.source is not None and e.position is not None
    inner = env | {e.axis: d.leg(e.axis, cluster)}
    draw_tensor(d, e.source, {leg: inner[leg] for leg in e.source.legs}, cluster)
    label = escape(f"{e.axis} = {e.position}")
    node = d.node("at", f'shape=box style="rounded,dashed" label="{label}" tooltip="gather"', cluster)
    d.attach(node, inner[e.axis])
    for leg in e.position.legs():
        d.attach(node, env[leg])


CHECK.register(Gather)(no_numbers)


BUILD.unsupported(Gather, "not a call: a gather is written Rel[h, r = position] (graph/positions.py)")


# Positions (graph/position_rules.py): it takes no mask, hides nothing and mixes no positions.
pos.plain(Gather)


# ---- decoding (decode_rules.py): what the kind means to a cache


@KV_ROWS.register(Gather)
def gathered_rows(requests: RowRequests, node: Gather, target: str, legs: Mapping[str, str]) -> str | None:
    """A gather along a source's positions reads rows no cache row gives."""
    if node.source is not None:
        axis = node.source.legs.index(node.axis)
        if requests.is_position(requests.graph.tensors[node.source.name].axes[axis].size):
            return f"{target} gathers {node.source.name} along its positions"
    return None


@STATE_ROWS.register(Gather)
def gathered_state_rows(planner: StatePlanner, node: Gather, target: str) -> str | None:
    """A gather along a source's positions reads rows other than the new ones."""
    if node.source is not None:
        tensor = planner.tensors[node.source.name]
        axis = node.source.legs.index(node.axis)
        if tensor.axes[axis].size == planner.symbol:
            return f"{target} gathers {node.source.name} along its positions"
    return None


decode.plain(Gather, but=(KV_ROWS, STATE_ROWS, STEP_REWRITE))


@STEP_REWRITE.register(Gather)
def step_gather(program: StepProgram, node: Gather) -> Expr:
    """A table read at an address of new positions, offset by P to their absolute positions."""
    if node.source is not None and any(program.roles.get(leg) for leg in node.source.legs):
        raise NotCompiledError("a gather from a tensor over positions")
    if node.position is not None and any(program.roles.get(leg) == NEW for leg in node.position.legs()):
        if program.rows_only:
            raise NotCompiledError("a cached tensor's rows gather at their positions")
        node = dataclasses.replace(node, position=program.offset_address(node.position))
    return program.finish(node)


# lower (plan/base.LOWER): the table indexed at the positions computed (plan/positions.py)
LOWER.register(Gather)(lower_gather)
