"""Plan -> a live torch module. The in-process module runs exactly the text that
`tdiag compile` writes (codegen.generate), so the two cannot differ; its source is registered
with linecache so a failure inside it shows the generated lines."""

from __future__ import annotations

import hashlib
import linecache
import sys
import types
from collections.abc import Mapping
from typing import TYPE_CHECKING

from .codegen import class_name, generate
from .design import DEFAULT_OBJECTIVE
from .graph import DesignGraph
from .plan import Plan, build_plan

if TYPE_CHECKING:
    import torch

    from .call_plans import CallPlans

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
    """Run generated source as a module of its own, registered in sys.modules (torch.compile and
    pickle look classes up by module name); one module per distinct source."""
    module_name = f"tdiag_generated_{name}_{hashlib.sha256(source.encode()).hexdigest()[:12]}"
    if module_name not in sys.modules:
        filename = f"<tdiag {name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        module = types.ModuleType(module_name)
        module.__file__ = filename
        exec(compile(source, filename, "exec"), module.__dict__)  # our own generated code, never .td text
        cls = getattr(module, class_name(name))
        cls.tdiag_generated = (source, name)
        cls.__reduce_ex__ = _reduce_generated
        sys.modules[module_name] = module
    return getattr(sys.modules[module_name], class_name(name))


def _reduce_generated(self: torch.nn.Module, protocol: int) -> tuple:
    """Pickle a module of a class compiled in this process by its generated source, so that
    `torch.save(model)` of a model holding one loads in another process, where the class's module
    does not exist yet (`restore_generated` compiles it again)."""
    return (restore_generated, type(self).tdiag_generated, self.__getstate__())


def restore_generated(source: str, name: str) -> torch.nn.Module:
    """An empty instance of the class `source` defines (its state follows from the pickle). Only
    `torch.load(..., weights_only=False)` calls this, which trusts the file as any full pickle."""
    cls = compile_source(source, name)
    return cls.__new__(cls)


def build_module(
    plan: Plan,
    *,
    seed: int = 0,
    dtype: torch.dtype | None = None,
    device=None,
    source_name: str = "",
    calls: CallPlans | None = None,
) -> torch.nn.Module:
    """The plan as a live module (float32 unless `dtype` is given), taking the call-time masks of
    `calls` (call_plans.py) where given; torch is imported here, not with this file, so that
    planning (`Design.plan`, `tdiag cost`) never loads it."""
    import torch

    dtype = dtype or torch.float32
    source = generate(plan, source_name=source_name, calls=calls)
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
    objective: str = DEFAULT_OBJECTIVE,
    attention: str = "sdpa",
) -> Plan:
    sizes = planning_sizes(graph, sizes)
    return build_plan(graph, sizes, checkpoint_boxes=checkpoint_boxes, objective=objective, attention=attention)
