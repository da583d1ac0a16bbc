"""Plan -> a live torch module. The in-process module runs exactly the text that
`tdiag compile` writes (codegen.generate), so the two cannot differ; its source is registered
with linecache so a failure inside it shows the generated lines."""

from __future__ import annotations

import hashlib
import linecache
import sys
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

import sympy

from .codegen import METHODS, class_name, generate
from .errors import Diagnostic, TdiagError
from .graph import DesignGraph
from .objectives import DEFAULT_OBJECTIVE
from .plan import Plan, build_plan

if TYPE_CHECKING:
    import torch

    from .device import DeviceModel
    from .plan.call_variants import CallPlans

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
        cls.new_cache = new_cache
        sys.modules[module_name] = module
    return getattr(sys.modules[module_name], class_name(name))


def new_cache(self: torch.nn.Module):
    """A decoding cache for this module (tdiag.DecodeCache): `self(x, cache=cache)` computes the
    positions of x after those the cache holds, and adds them to it (docs/decoding.md)."""
    from .decode import DecodeCache

    return DecodeCache(self)


def _reduce_generated(self: torch.nn.Module, protocol: int) -> tuple:
    """Pickle a module of a class compiled in this process by its generated source, so that
    `torch.save(model)` of a model holding one loads in another process, where the class's module
    does not exist yet (`restore_generated` compiles it again)."""
    complete(self)
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
    planner: Callable[[], CallPlans] | None = None,
    design: Mapping[str, object] | None = None,
) -> torch.nn.Module:
    """The plan as a live module (float32 unless `dtype` is given), taking the call-time masks of
    `calls` (call_plans.py) where given. Where `calls` is not planned yet, `planner` plans it the
    first time a call asks for a variant (or the module is pickled): the module then becomes an
    instance of the class of the whole source, the one `tdiag compile` writes. torch is imported
    here, not with this file, so that planning (`Design.plan`, `tdiag cost`) never loads it.
    `design` is the design record the source carries (Design.record), as `tdiag compile` writes it."""
    import torch

    dtype = dtype or torch.float32
    source = generate(plan, source_name=source_name, calls=calls, design=design)
    cls = compile_source(source, plan.graph.name)
    module = cls(seed=seed, dtype=dtype, device=device)
    module.tdiag_source = source  # type: ignore[attr-defined]
    module.tdiag_plan = plan  # type: ignore[attr-defined]
    if calls is not None and not calls.planned and planner is not None:
        for method in METHODS[1:]:
            if not hasattr(cls, method):
                setattr(cls, method, _planned_on_first_use(method))
        module.__dict__["_tdiag_planner"] = lambda: generate(
            plan, source_name=source_name, calls=planner(), design=design
        )
    return module


def _planned_on_first_use(method: str) -> Callable:
    """A variant's body that plans every variant first (module.py `_complete`), then runs it."""

    def run(self: torch.nn.Module, *args: object, **kwargs: object) -> object:
        import torch

        if torch.compiler.is_compiling():
            raise RuntimeError(
                "is_causal, attn_mask and key_padding_mask are planned the first time a call uses one;"
                " under torch.compile, build the module with Design.module(plan_calls=True), or call it"
                " once with them before compiling"
            )
        complete(self)
        return getattr(self, method)(*args, **kwargs)

    run.__name__ = method
    return run


def complete(module: torch.nn.Module) -> None:
    """Plan the call-time variants of a module built without them, and make it an instance of the
    class of the whole source (parameters and buffers are the instance's, and stay)."""
    planner = module.__dict__.pop("_tdiag_planner", None)
    if planner is None:
        return
    source = planner()
    module.__class__ = compile_source(source, type(module).tdiag_generated[1])  # type: ignore[attr-defined]
    module.tdiag_source = source  # type: ignore[attr-defined]


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
