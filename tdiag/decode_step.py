"""The decoding step planned and compiled (issues 24 and 25): a "kv" cache's step as generated
code, and the choice between a design's plain and absorbed forms by the planner's cost model.

A step of a "kv" cache (tdiag/decode.py) computes T new positions after P cached ones. Its work
splits in two programs, each a design graph (built by decode_graphs.py) planned by the planner
(tdiag/plan) and printed by codegen (tdiag/codegen.py), so that nothing of a `.td` file reaches
the generated text except through codegen's one door:

- the rows program: the new rows of the cached tensors (K, V; MLA's latent) from the new inputs
  X[T], every position leg over the T new positions;
- the attention program: the outputs at the new positions from the new inputs and the cached
  rows of every position so far (inputs over M = P + T), the query legs over T, the key legs
  over M.

T and M are run-time sizes of the generated code (bound from the inputs' shapes), so one program
serves every length; `index(n)` of a new position is read from an input of absolute positions
P .. P + T − 1, and a gather's address or a table's slice along a new position is offset by
P = M − T. The design's causal masks and windows compare absolute positions, so each becomes a
mask input over its query and key legs made at each step (`PositionMask`). A causal mask of one
new position against every key hides nothing, so the attention program is planned twice: for one
new position without those masks (the common step, planned with the cache), and for any count
with them (planned the first time a call brings several). The first step of an empty cache runs
the module's own compiled causal forward and the rows program; noise is zero, as in
the eval mode a cache of a noisy design needs. Where a design needs what these programs do not
take (a position-only tensor read over both the new and every position; a cached tensor also
read at the new positions alone, or read in a slice; a leg that is a query in one statement and
a key in another),
`CompiledStep.reason` says so and the cache evaluates the step with the reference evaluator, as
before: the answer is the same either way (tests/test_decode_step.py).

The form (`decode_form`): where a statement reads at every key a linear map of a smaller
per-position tensor (MLA's per-head keys and values of its latent, graph/absorb.py), the step
can cache either the mapped rows (the plain form) or the smaller tensor, with the map's weights
multiplied into the query and the output (the absorbed form, DeepSeek-V2 Sec. 2.1). Each form's
two programs are planned at the step's sizes and priced by the planner's one time model
(plan/timing.py `plan_time`: a roofline of FLOPs and bytes moved on the planning device), and the
cheaper is taken, the plain form on a tie: for one query against a long cache reading the cache
dominates (memory traffic, not FLOPs), and the absorbed form reads the fewer entries per
position; over a whole sequence (T = N new positions; with nothing cached, the training forward,
both forms planned as whole forward passes) the planner contracts the latent with the weights
first in either form, its cheaper order at N × N, so the forms cost the same or the absorbed one
a little more, and the plain form is kept."""

from __future__ import annotations

import dataclasses
import weakref
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Protocol

import sympy

from .decode_graphs import PositionMask, StepGraphs, rule_of, step_graphs
from .decode_rows import DecodeRule
from .decode_rules import NotCompiledError
from .graph import DesignGraph
from .graph.absorb import absorbed
from .plan import chooser

if TYPE_CHECKING:
    import torch

__all__ = ["CompiledStep", "DecodeForm", "NotCompiledError", "PositionMask", "decode_form", "pin_form", "step_graphs"]


class DecodeCache(Protocol):
    """What a compiled step reads and writes of the decoding cache (decode.DecodeCache): the
    design's graph before and after absorption, its rule, the rows held and how many positions."""

    original_graph: DesignGraph
    graph: DesignGraph
    rule: DecodeRule
    module: torch.nn.Module
    length: int
    position_axes: dict[str, tuple[bool, ...]]
    tensors: dict[str, torch.Tensor]
    held_batch: torch.Size | None
    step: CompiledStep | None


STEP_PLANNED_LENGTH = 1024  # the cache length a step is planned and its form chosen at, unless given


def _planned(graph: DesignGraph, at: Mapping[str, int]):
    from .planning import plan_for

    return plan_for(graph, {**at, "B": 1}, absorb=False)


def _step_sizes(graphs: StepGraphs, queries: int, past: int) -> dict[str, int]:
    return {graphs.sizes["T"]: queries, graphs.sizes["M"]: past + queries}


@dataclass(frozen=True)
class FormCost:
    """One form's plans at the step's sizes and their estimated seconds (plan_time: the time
    model's training-step figure, the same multiple of a forward for every op)."""

    form: str
    seconds: float
    cached: tuple[str, ...]
    width: int


@dataclass(frozen=True)
class DecodeForm:
    """The planner's choice of a step's form at `queries` new positions after `past` cached ones:
    `form` is "plain" or "absorbed", `costs` each form's estimate (one entry where the design has
    no absorbed form)."""

    form: str
    queries: int
    past: int
    costs: tuple[FormCost, ...]
    pinned: bool = False  # set by `pin_form`, not chosen

    def __str__(self) -> str:
        where = f"a forward over N = {self.queries}" if self.past == 0 else f"T = {self.queries} after P = {self.past}"
        parts = [
            f"{c.form} {c.seconds * 1e3:.3g} ms (caches {', '.join(c.cached)}: {c.width} per position)"
            for c in self.costs
        ]
        chosen = f"{self.form} form pinned (the planner's choice" if self.pinned else f"{self.form} form"
        return f"{chosen} at {where}: " + "; ".join(parts) + (")" if self.pinned else "")


def _width(work: DesignGraph, cached: tuple[str, ...], symbol: sympy.Symbol) -> int:
    total = 0
    for name in cached:
        entries = 1
        for a in work.tensors[name].axes:
            if a.size != symbol:
                entries *= int(work.evaluate(a.size))
        total += entries
    return total


def decode_form(graph: DesignGraph, queries: int = 1, past: int = STEP_PLANNED_LENGTH - 1) -> DecodeForm:
    """The form a step of `queries` new positions after `past` cached ones takes, by the
    planner's time model (plan/timing.py): the plain and the absorbed graph (graph/absorb.py `absorbed`)
    each planned, as a step's rows and attention programs at those sizes, or with nothing cached
    (`past` = 0) as whole forward passes over N = `queries` (the training forward), and the
    cheaper taken (the plain one on a tie, or where the absorbed one cannot be planned)."""
    from .plan.timing import plan_time

    forms = {"plain": graph}
    other = absorbed(graph)
    if other is not graph:
        forms["absorbed"] = other
    costs = []
    for form, work in forms.items():
        rule = rule_of(work)
        if rule is None:
            continue
        symbol = work.sizes[rule.size].symbol
        if past == 0:
            plan = _planned(work, {rule.size: queries})
            seconds = plan_time(plan, plan.device or _device())
        else:
            try:
                graphs = step_graphs(work, rule)
            except NotCompiledError:
                continue
            at = _step_sizes(graphs, queries, past)
            seconds = 0.0
            for part in (graphs.rows, graphs.attend):
                if part is not None:
                    plan = _planned(part, at)
                    seconds += plan_time(plan, plan.device or _device())
        costs.append(FormCost(form, seconds, rule.cached, _width(work, rule.cached, symbol)))
    if not costs:
        raise NotCompiledError(f"design '{graph.name}' has no form a step can be planned in")
    return DecodeForm(cheapest(costs).form, queries, past, tuple(costs))


def cheapest(costs: list[FormCost]) -> FormCost:
    """The form of fewest estimated seconds, the plain one on a tie: decoding's one comparison
    of prices."""
    return chooser.cheapest([(c, c.seconds) for c in sorted(costs, key=lambda c: c.form != "plain")])


def _device():
    from .device import planning_device

    return planning_device()


@dataclass
class _Programs:
    """What every cache of one design graph shares: the form taken, the step's graphs, and the
    generated classes of its two programs (None and the `reason` where they cannot take it)."""

    form: DecodeForm | None
    graphs: StepGraphs | None = None
    classes: dict[str, type] = field(default_factory=dict)  # "one", "any", "rows": planned when first used
    mask_arguments: dict[str, dict[str, str]] = field(default_factory=dict)  # program -> mask input -> keyword
    reason: str | None = None
    modules: weakref.WeakKeyDictionary = field(default_factory=weakref.WeakKeyDictionary)

    def part(self, key: str) -> DesignGraph | None:
        assert self.graphs is not None
        return {"one": self.graphs.attend_one, "any": self.graphs.attend, "rows": self.graphs.rows}[key]

    def cls(self, key: str) -> type:
        """The generated class of program `key`: "one" (the attention program for one new
        position), "any" (for any count, its causal masks given), "rows"; planned on first use."""
        if key not in self.classes:
            from .codegen import generate
            from .generated import compile_source

            assert self.graphs is not None
            part = self.part(key)
            assert part is not None
            plan = _planned(part, _step_sizes(self.graphs, 1 if key != "any" else 2, STEP_PLANNED_LENGTH - 1))
            self.classes[key] = compile_source(generate(plan), part.name)
            self.mask_arguments[key] = {t.name: plan.names[t.name] for t in part.tensors_of_kind("mask")}
        return self.classes[key]


_FORMS: dict[int, DecodeForm | None] = {}
_PROGRAMS: dict[int, _Programs] = {}


def _remembered(table: dict, graph: DesignGraph, make):
    if id(graph) not in table:
        table[id(graph)] = make()
        weakref.finalize(graph, table.pop, id(graph), None)
    return table[id(graph)]


def chosen_form(graph: DesignGraph) -> DesignGraph:
    """The graph a decoding step of `graph` evaluates: its absorbed form (graph/absorb.py `absorbed`) where
    the planner finds a step of one position after STEP_PLANNED_LENGTH − 1 cheaper in it
    (`decode_form`), else the design as written; where neither form's step can be planned (the
    reference evaluator steps it), the absorbed one, whose cache is the smaller. Chosen once per
    design graph."""
    other = absorbed(graph)
    if other is graph:
        return graph

    def choose() -> DecodeForm | None:
        try:
            return decode_form(graph)
        except NotCompiledError:
            return None

    form = _remembered(_FORMS, graph, choose)
    return other if form is None or form.form == "absorbed" else graph


def pin_form(graph: DesignGraph, form: str) -> None:
    """Make the caches of `graph` take `form` ("plain" or "absorbed") instead of the planner's
    choice, to measure one against the other (scripts/bench_decode.py `--forms`); before the
    first cache of `graph` is made, since the rule is read once per design graph."""
    if form not in ("plain", "absorbed"):
        raise ValueError(f"form must be 'plain' or 'absorbed', got {form!r}")
    chosen = form_of(graph)
    if chosen is None:
        raise ValueError(f"design '{graph.name}' has no absorbed form")
    _FORMS[id(graph)] = dataclasses.replace(chosen, form=form, pinned=True)


def form_of(graph: DesignGraph) -> DecodeForm | None:
    """The form `chosen_form` took for `graph` (None where it has no absorbed form)."""
    chosen_form(graph)
    return _FORMS.get(id(graph))


def _programs(graph: DesignGraph, work: DesignGraph, rule: DecodeRule) -> _Programs:
    def make() -> _Programs:
        programs = _Programs(_FORMS.get(id(graph)))
        try:
            programs.graphs = step_graphs(work, rule)
        except NotCompiledError as error:
            programs.reason = str(error)
            return programs
        programs.cls("one")
        if programs.graphs.rows is not None:
            programs.cls("rows")
        return programs

    return _remembered(_PROGRAMS, graph, make)


class CompiledStep:
    """The generated programs of a "kv" cache's step (module docstring), bound to one module:
    `reason` is None where they serve it, else why the cache evaluates its steps with the
    reference evaluator. `source` gives the generated text of both programs."""

    def __init__(self, cache: DecodeCache):
        graph = cache.original_graph
        self.programs = _programs(graph, cache.graph, cache.rule)
        self.module = cache.module
        self.form = self.programs.form
        self.reason = self.programs.reason
        self.attend: torch.nn.Module | None = None
        self.rows: torch.nn.Module | None = None
        if self.reason is None:
            self.attend = self.program("one")
            self.rows = self.program("rows") if self.programs.graphs.rows is not None else None

    @property
    def source(self) -> str:
        """The generated text of the attention program for one new position, then of the rows
        program."""
        return "\n\n".join(m.tdiag_source for m in (self.attend, self.rows) if m is not None)

    def program(self, key: str) -> torch.nn.Module:
        """An instance of program `key` (`_Programs.cls`) holding the module's parameters,
        buffers and constants (the same tensors, not copies), made once per module."""
        like = next(iter(self.module.parameters()), None)
        kwargs = {} if like is None else {"dtype": like.dtype, "device": like.device}
        known = self.programs.modules.get(self.module)
        if known is None or known[0] != kwargs:  # made anew after module.to(dtype or device)
            known = self.programs.modules[self.module] = (kwargs, {})
        if key not in known[1]:
            cls = self.programs.cls(key)
            instance = cls(**kwargs).eval()
            instance.tdiag_source = cls.tdiag_generated[0]
            known[1][key] = instance
        _share(self.module, known[1][key])
        return known[1][key]

    def extend(self, cache: DecodeCache, x: torch.Tensor, rank: int) -> tuple[torch.Tensor, ...]:
        """The outputs at the positions of `x` after the cached ones, the cache extended."""

        dim = cache.rule.axis - rank
        count = x.shape[dim]
        if cache.length == 0:
            outputs = self.module(x)
            outputs = outputs if isinstance(outputs, tuple) else (outputs,)
            self._append(cache, x, dim, count)
            return outputs
        rows = self._append(cache, x, dim, count)
        graphs = self.programs.graphs
        assert graphs is not None and self.attend is not None
        named = {graphs.inputs[0]: x, **{graphs.cached_inputs[name]: rows[name] for name in graphs.cached}}
        if graphs.positions in graphs.inputs:
            named[graphs.positions] = self._positions(cache.length - count, count, x)
        past = cache.length - count
        key = "one" if count == 1 else "any"  # one new position: its causal masks hide nothing
        program = self.attend if count == 1 else self.program("any")
        arguments = self.programs.mask_arguments[key]
        masks = {
            arguments[name]: mask.value(past, count, x.device)
            for name, mask in (graphs.masks_one if count == 1 else graphs.masks).items()
        }
        outputs = program(*(named[name] for name in graphs.inputs), **masks)
        return outputs if isinstance(outputs, tuple) else (outputs,)

    def _output_axis(self, cache: DecodeCache, name: str) -> int:
        axes = cache.position_axes[name]
        return axes.index(True) - len(axes)

    def _positions(self, start: int, count: int, x: torch.Tensor) -> torch.Tensor:
        import torch

        return torch.arange(start, start + count, dtype=self._dtype(x), device=x.device)

    def _dtype(self, x: torch.Tensor):
        like = next(iter(self.module.parameters()), None)
        return like.dtype if like is not None else x.dtype

    def _append(self, cache: DecodeCache, x: torch.Tensor, dim: int, count: int) -> dict[str, torch.Tensor]:
        """The cached rows with those of `x`'s positions appended (computed by the rows program)."""
        import torch

        graphs = self.programs.graphs
        assert graphs is not None
        new: dict[str, torch.Tensor] = {}
        derived = [name for name in graphs.cached if cache.graph.tensors[name].kind == "derived"]
        if derived:
            assert self.rows is not None
            given = [x]
            if len(graphs.rows_inputs) > 1:
                given.append(self._positions(cache.length, count, x))
            made = self.rows(*given)
            made = made if isinstance(made, tuple) else (made,)
            new.update(zip(derived, made, strict=True))
        for name in graphs.cached:
            new.setdefault(name, x)
        rows = {}
        for name in graphs.cached:
            held = cache.tensors.get(name)
            axis = self._output_axis(cache, name)
            rows[name] = new[name] if held is None else torch.cat([held, new[name]], axis)
        cache.tensors.update(rows)
        cache.length += count
        cache.held_batch = x.shape[: x.dim() - len(cache.graph.inputs[0].axes)]
        return rows


def step_summary(cache: DecodeCache) -> str:
    """How a cache's steps run and, for a design with an absorbed form, the form taken with its
    estimates: the end of the cache's repr."""
    step, form = cache.step, form_of(cache.original_graph)
    text = ""
    if step is not None:
        text = (
            "; steps by generated code" if step.reason is None else f"; steps by the reference evaluator: {step.reason}"
        )
    return text + (f"; {form}" if form is not None else "")


def _share(module: torch.nn.Module, instance: torch.nn.Module) -> None:
    """Point `instance`'s parameters and buffers at `module`'s of the same names."""
    for table in ("_parameters", "_buffers"):
        own = getattr(instance, table)
        for name in list(own):
            held = getattr(module, name, None)
            if held is not None:
                own[name] = held
