"""Plan -> a live torch module. The in-process module runs exactly the text that
`tdiag compile` writes (codegen.generate), so the two cannot differ; its source is registered
with linecache so a failure inside it shows the generated lines."""

from __future__ import annotations

import linecache
from collections.abc import Mapping

import torch

from .codegen import class_name, generate
from .graph import DesignGraph
from .plan import Plan, build_plan

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


def compile_source(source: str, name: str) -> type[torch.nn.Module]:
    filename = f"<tdiag {name}>"
    linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
    namespace: dict[str, object] = {"__name__": f"tdiag_generated_{name}"}
    exec(compile(source, filename, "exec"), namespace)  # our own generated code, never .td text
    return namespace[class_name(name)]  # type: ignore[return-value]


def build_module(
    plan: Plan, *, seed: int = 0, dtype: torch.dtype = torch.float32, device=None, source_name: str = ""
) -> torch.nn.Module:
    source = generate(plan, source_name=source_name)
    cls = compile_source(source, plan.graph.name)
    module = cls(seed=seed, dtype=dtype, device=device)
    module.tdiag_source = source  # type: ignore[attr-defined]
    module.tdiag_plan = plan  # type: ignore[attr-defined]
    return module


def plan_for(
    graph: DesignGraph,
    sizes: Mapping[str, int] | None = None,
    *,
    checkpoint_boxes: bool = False,
    objective: str = "flops",
) -> Plan:
    return build_plan(graph, planning_sizes(graph, sizes), checkpoint_boxes=checkpoint_boxes, objective=objective)
