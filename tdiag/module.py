"""Plan -> a live torch module. The in-process module runs exactly the text that
`tdiag compile` writes (codegen.generate, compiled by generated.py), so the two cannot differ; a
generated class pickles by its source and makes its decoding cache (decode.py)."""

from __future__ import annotations

from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .codegen import METHODS, generate
from .generated import compile_source
from .plan import Plan

if TYPE_CHECKING:
    import torch

    from .plan.call_variants import CallPlans


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
    cls = compile_source(source, name, CLASS_METHODS)
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
    cls = compile_source(source, plan.graph.name, CLASS_METHODS)
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
    module.__class__ = compile_source(source, type(module).tdiag_generated[1], CLASS_METHODS)  # type: ignore[attr-defined]
    module.tdiag_source = source  # type: ignore[attr-defined]


CLASS_METHODS: dict[str, Callable] = {"__reduce_ex__": _reduce_generated, "new_cache": new_cache}
