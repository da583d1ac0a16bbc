"""Sizes to plan at and the plan of a design graph there: the one entry from a graph to the
planner that the runtime (module, decode) and the facade share. No torch."""

from __future__ import annotations

from collections.abc import Mapping
from typing import TYPE_CHECKING

import sympy

from .errors import Diagnostic, TdiagError
from .graph import DesignGraph
from .objectives import DEFAULT_OBJECTIVE
from .plan import Plan, build_plan

if TYPE_CHECKING:
    from .device import DeviceModel

PLANNING_DEFAULTS = {"N": 1024, "B": 8}  # run-time sizes assumed when planning, unless given


def planning_sizes(graph: DesignGraph, sizes: Mapping[str, int] | None = None) -> dict[str, int]:
    """Numbers for every size: the design's, then `sizes`, then defaults for run-time sizes."""
    values = {k: int(v) for k, v in graph.size_values().items()}
    values.update(sizes or {})
    for name in graph.sizes:
        if name not in values:
            values[name] = PLANNING_DEFAULTS.get(name, 1024)
    values = {k: int(v) for k, v in values.items()}
    for name, size in graph.sizes.items():
        if size.definition is not None and name not in (sizes or {}):
            value = graph.evaluate(
                size.symbol, **{k: v for k, v in values.items() if graph.sizes.get(k) and graph.sizes[k].is_free}
            )
            if value.is_Integer:
                values[name] = int(value)
    values.setdefault("B", PLANNING_DEFAULTS["B"])
    return values


def plan_for(
    graph: DesignGraph,
    sizes: Mapping[str, int] | None = None,
    *,
    checkpoint_boxes: bool = False,
    objective: str = DEFAULT_OBJECTIVE,
    attention: str = "sdpa",
    absorb: bool = True,
    device: DeviceModel | None = None,
) -> Plan:
    """The plan of `graph` at `sizes` (planning_sizes fills the rest); with `absorb=False`, of
    the design as written even where its absorbed form is cheaper (decode_step compares both);
    `device` prices the candidates instead of the planning device (build_plan)."""
    _check_whole_legs(graph, sizes or {})
    sizes = planning_sizes(graph, sizes)
    return build_plan(
        graph,
        sizes,
        checkpoint_boxes=checkpoint_boxes,
        objective=objective,
        attention=attention,
        absorb=absorb,
        device=device,
    )


def _check_whole_legs(graph: DesignGraph, given: Mapping[str, int]) -> None:
    """A leg that divides a run-time size given to plan for (the N/C blocks of `X[(b i) f]`) must
    come out whole there: `--at N=10` with blocks of 4 is refused at the leg, as a call of that
    length is (codegen's entry check), rather than planned with 2.5 blocks."""
    at = {k: int(v) for k, v in given.items() if k in graph.sizes and graph.sizes[k].is_free}
    known = {graph.sizes[k].symbol: v for k, v in graph.size_values().items()}
    for leg in graph.legs.values():
        if not any(str(symbol) in at for symbol in graph.expand(leg.size).free_symbols):
            continue
        value = graph.evaluate(leg.size, **at)
        if value.is_Integer:
            continue
        _, block = sympy.fraction(sympy.together(graph.expand(leg.size).xreplace(known)))
        shown = ", ".join(f"{k}={v}" for k, v in sorted(at.items()))
        raise TdiagError(
            Diagnostic(
                f"leg {leg.name} has size {leg.size} = {value} at {shown}: not a whole number",
                (leg.span,),
                f"plan at a length that is a multiple of {block}",
            )
        )
