"""Incremental decoding (issue 25): a cache obtained from a compiled causal module, so that new
positions are computed from their own inputs and what the cache holds, not by re-running the
whole prefix.

    cache = module.new_cache()          # or tdiag.DecodeCache(module)
    y = module(x_prompt, cache=cache)   # T positions at once: their outputs, the cache extended
    y = module(x_next, cache=cache)     # then one (or more) at a time

The rule is read off the design graph, not written per design (`decode_rule`). Each statement
is evaluated over ranges of positions: the legs the queries run over (those a result keeps)
cover the new positions P .. P + T − 1, and the position legs a statement sums, reduces or
normalizes over (the keys) cover every position 0 .. P + T − 1. Asking, from the outputs back,
which rows each tensor must give then finds the frontier: a tensor computed from the input per
position (one position axis: K[m h d], V[m h e], RoPE-rotated keys, MLA's latent, an earlier
layer's output) that a later statement reads at every position. Such a tensor is cached: a step
computes its new rows from the new inputs only and appends them (kind "kv"). Tensors made of
positions alone (`index(n)`, RoPE's angles, ALiBi's and T5's biases, a table sliced at
`n: N`) are computed at the absolute positions each use reads, and causal and window masks
compare absolute positions, so query t sits at position P + t. A step of a compiled module
runs generated code: its rows and attention programs, planned and printed like any design
(tdiag/decode_step.py); what those do not take, and every step of an `impl="reference"` module,
is evaluated as the reference evaluator does (tdiag/reference.py: einsum on materialized
tensors, here one row of scores per new query), with the same answer.

Where a score reads the input itself at every key (X[m f] inside it), the input's rows are
cached too. Where no cached rows serve, the cache keeps the layer's inputs and each step re-runs
the compiled module over the prefix and the new positions (kind "prefix", O(N) work per new
position), so decoding stays exact; `cache.reason` says why: a scan along the positions of a
statement's result, a convolution along them, noise drawn over every position at each call.
Before either, a design whose sums over the keys are causal products or causal normalize boxes
in their linear order (linear attention, RetNet, GLA, Mamba-2, mLSTM) keeps their running sums
instead (kind "state", O(1) work per new position; tdiag/decode_state.py); where it has none,
`cache.reason` says that too.

A cache serves one module and one batch shape; a step never updates buffers or draws noise, so a
design with state updates or training-mode noise decodes in eval mode (`module.eval()`). Masks
declared by the design are not taken with a cache (every position attends)."""

from __future__ import annotations

import dataclasses
import math
import weakref
from dataclasses import dataclass, field
from typing import Any

import sympy
import torch
from torch import nn

from . import decode_state
from .decode_file import NotDecodableError, check_tensors, embedded_plan
from .decode_rows import DecodeRule, RowRequests, reads_length
from .decode_step import CompiledStep, chosen_form, step_summary
from .graph import DesignGraph
from .graph.absorb import absorbed
from .graph.causal import hides_the_future
from .init import initial_value, numeric_shape
from .ir import (
    Statement,
    Tensor,
    TensorRef,
)
from .reference import Frame, bind_sizes, known_sizes, statement_value

__all__ = ["DecodeCache", "DecodeRule", "NotDecodableError", "absorbed", "check_decodes", "decode_rule"]


def decode_rule(graph: DesignGraph, *, state: bool = True) -> DecodeRule:
    """The decoding rule of a causal design with one input over a run-time length N: its
    recurrent states (kind "state", tdiag/decode_state.py), else which computed tensors the cache
    holds ("kv"), or why it must keep the input instead ("prefix"); with `state=False`, the rule
    the design has without its recurrent state (to compare them). Raises NotDecodableError for a
    graph no cache can serve."""
    rule = _rows_rule(graph)
    return decode_state.with_state(graph, rule) if state else rule


def _rows_rule(graph: DesignGraph) -> DecodeRule:
    """The decoding rule of a causal design with one input over a run-time length N: which
    computed tensors the cache holds (kind "kv"), or why it must keep the input instead ("prefix").
    Raises NotDecodableError for a graph no cache can serve."""
    if len(graph.inputs) != 1:
        raise NotDecodableError(
            f"design '{graph.name}' has {len(graph.inputs)} inputs; decoding extends one sequence (one input)"
        )
    x = graph.inputs[0]
    free = [k for k, a in enumerate(x.axes) if isinstance(a.size, sympy.Symbol) and graph.sizes[a.size.name].is_free]
    if len(free) != 1:
        raise NotDecodableError(
            f"input {x.name} of design '{graph.name}' needs exactly one axis of a run-time length to decode along,"
            f" has {len(free)}"
        )
    if not hides_the_future(graph):
        raise NotDecodableError(
            f"design '{graph.name}' is not causal: each position sees the later ones, so adding positions changes"
            " the earlier outputs; decode its causal form (Design.with_causal_mask())"
        )
    symbol = x.axes[free[0]].size
    graph = chosen_form(graph)
    positional = frozenset(name for name, leg in graph.legs.items() if leg.size == symbol)
    walker = RowRequests(graph, positional, symbol)
    for name in graph.outputs:
        walker.request(name, walker.output_labels(name))
    length = reads_length(graph, symbol)
    if walker.problem is not None:
        return DecodeRule(
            "prefix", x.name, free[0], symbol.name, positional, reason=walker.problem, reads_length=length
        )
    reason = None
    if walker.recomputed:
        names = ", ".join(walker.recomputed)
        verb = "reads" if len(walker.recomputed) == 1 else "read"
        reason = f"{names} {verb} the length N as a number: recomputed at every position at each step, not cached"
    return DecodeRule(
        "kv", x.name, free[0], symbol.name, positional, tuple(walker.cached), walker.inner, reason, walker.noise, length
    )


class DecodeCache:
    """What a causal module has seen so far, to compute new positions without re-running them.

    `kind` is "kv" (the cache holds the computed tensors that later positions read at every
    earlier position, `tensors`, e.g. K and V) or "prefix" (it holds the inputs so far and each
    step re-runs the module over them; `reason` says why the design allows no other). `length` is
    the number of positions seen. Obtained from `module.new_cache()` or `DecodeCache(module)` (a
    module of a file `tdiag compile` wrote too: its design is read from the file's `tdiag_design`);
    `module(x, cache=cache)` or `cache.extend(x)` computes the positions of `x` (its axis of the
    run-time length, any count) after those cached and returns their outputs."""

    def __init__(self, module: nn.Module, *, compiled: bool | None = None):
        graph = _graph_of(module)
        embedded = getattr(module, "tdiag_plan", None) is None and embedded_plan(type(module)) is not None
        if embedded:
            check_tensors(module, graph)
        prepared = _prepared(graph)
        self.module = module
        self.graph = prepared.work or graph
        self.rule: DecodeRule = prepared.rule
        self.length = 0
        self.tensors: dict[str, torch.Tensor] = {}
        self.numbers, self.expressions, self.constants = prepared.numbers, prepared.expressions, prepared.constants
        self.position_axes, self.sizes = prepared.position_axes, prepared.sizes
        self.held_batch: torch.Size | None = None
        self.original_graph = graph
        if compiled is None:  # a module of the reference evaluator steps as it does
            compiled = getattr(module, "tdiag_plan", None) is not None or embedded
        self.step = CompiledStep(self) if compiled and self.rule.kind == "kv" else None

    @property
    def kind(self) -> str:
        return self.rule.kind

    @property
    def reason(self) -> str | None:
        return self.rule.reason

    def __repr__(self) -> str:
        held = ", ".join(f"{name}{tuple(t.shape)}" for name, t in self.tensors.items()) or "nothing yet"
        why = f"; {self.reason}" if self.reason else ""
        return (
            f"<tdiag.DecodeCache {self.graph.name}: kind {self.kind}, {self.length} positions, holds {held}{why}"
            f"{step_summary(self)}>"
        )

    def extend(
        self, x: torch.Tensor, *, module: nn.Module | None = None, **masks: torch.Tensor | None
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The outputs at the positions of `x` (placed after the `length` cached ones), the
        cache extended by them."""
        if module is not None and module is not self.module:
            raise ValueError("this cache was made by another module: make one with module.new_cache()")
        given = [name for name, mask in masks.items() if mask is not None]
        if given:
            raise ValueError(f"mask {given[0]} cannot be given with a cache: decoding attends every cached position")
        rank = len(self.graph.inputs[0].axes)
        _check_input(x, f"input {self.rule.input}", self.module)
        if x.dim() < rank:
            raise ValueError(f"input {self.rule.input} needs {rank} trailing axes, got shape {tuple(x.shape)}")
        if x.shape[self.rule.axis - rank] == 0:
            raise ValueError(f"input {self.rule.input}: no new positions (its axis of size {self.rule.size} is empty)")
        bind_sizes(self.graph, self.sizes, {self.rule.input: x})  # the other axes' sizes, as a forward checks them
        batch = x.shape[: x.dim() - rank]
        if self.held_batch is not None and batch != self.held_batch:
            raise ValueError(f"the cache holds a batch of shape {tuple(self.held_batch)}; got {tuple(batch)}")
        if self.rule.kind == "prefix":
            return self._prefix_step(x, rank)
        if self.rule.kind == "state":
            return decode_state.step(self, _graph_of(self.module), x, batch)
        return self._kv_step(x, rank, batch)

    __call__ = extend

    def width(self) -> int:
        """The entries one position adds to a "kv" cache: Σ over the cached tensors of the
        product of their axes other than the position axis."""
        return sum(math.prod(self._row_shape(name)) for name in self.rule.cached)

    def _row_shape(self, name: str) -> list[int]:
        """The sizes of a cached tensor's axes other than its position axis."""
        axes = zip(self.graph.tensors[name].axes, self.position_axes[name], strict=True)
        return [int(self.graph.evaluate(a.size)) for a, position in axes if not position]

    def packed(self, start: int = 0) -> torch.Tensor:
        """The cached rows from position `start` on as one tensor [..., positions, width()]
        (each cached tensor's position axis moved after the batch dims, the rest flattened, the
        tensors side by side), for a store that keeps positions along one axis (Hugging Face's
        DynamicCache, tdiag.hf)."""
        parts = []
        for name in self.rule.cached:
            rows, axis = self.tensors[name], self.position_axes[name].index(True)
            rank = len(self.position_axes[name])
            batch = rows.dim() - rank
            rows = rows.narrow(batch + axis, start, rows.shape[batch + axis] - start).movedim(batch + axis, batch)
            parts.append(rows.reshape(*rows.shape[: batch + 1], -1))
        return torch.cat(parts, -1)

    def restore(self, packed: torch.Tensor) -> None:
        """Hold the rows of `packed` (as `packed()` gives them, from position 0) and nothing else."""
        if self.rule.kind != "kv":
            raise ValueError(f"a cache of kind {self.rule.kind} holds no packed rows")
        if packed.shape[-1] != self.width():
            raise ValueError(f"packed rows of width {packed.shape[-1]}, expected {self.width()}")
        self.tensors, offset = {}, 0
        batch, count = packed.shape[:-2], packed.shape[-2]
        for name in self.rule.cached:
            axis = self.position_axes[name].index(True)
            rest = self._row_shape(name)
            width = math.prod(rest)
            rows = packed[..., offset : offset + width].reshape(*batch, count, *rest)
            self.tensors[name] = rows.movedim(len(batch), len(batch) + axis)
            offset += width
        self.length = count
        self.held_batch = batch

    def _prefix_step(self, x: torch.Tensor, rank: int) -> torch.Tensor | tuple[torch.Tensor, ...]:
        dim = self.rule.axis - rank
        rows = self.tensors.get(self.rule.input)
        whole = x if rows is None else torch.cat([rows, x], dim)
        outputs = self.module(whole)
        count = x.shape[dim]
        single = not isinstance(outputs, tuple)
        picked = []
        for name, y in zip(self.graph.outputs, (outputs,) if single else outputs, strict=True):
            tensor = self.graph.tensors[name]
            for k, axis in enumerate(tensor.axes):
                if axis.size == self.graph.sizes[self.rule.size].symbol:
                    y = y.narrow(k - len(tensor.axes), y.shape[k - len(tensor.axes)] - count, count)
            picked.append(y)
        self.tensors[self.rule.input] = whole
        self.length = whole.shape[dim]
        self.held_batch = x.shape[: x.dim() - rank]
        return picked[0] if single else tuple(picked)

    def _kv_step(self, x: torch.Tensor, rank: int, batch: torch.Size) -> torch.Tensor | tuple[torch.Tensor, ...]:
        if self.module.training and (self.rule.noise or self.graph.updates):
            raise ValueError(
                f"design '{self.graph.name}' draws noise or updates buffers in training mode, which a decoding step"
                " does not: decode in eval mode (module.eval())"
            )
        if self.step is not None and self.step.reason is None:
            done = self.step.extend(self, x, rank)
            return done[0] if len(done) == 1 else done
        count = x.shape[self.rule.axis - rank]
        step = _Step(self, x, count)
        outputs = tuple(step.output(name) for name in self.graph.outputs)
        self.tensors.update(step.joined)
        self.length += count
        self.held_batch = batch
        return outputs[0] if len(outputs) == 1 else outputs


def _check_input(x: object, name: str, module: nn.Module) -> None:
    """A floating-point tensor on the device and of the dtype of the module's parameters (as the
    compiled forward checks its input; autocast may mix the dtypes)."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    like = next(iter(module.parameters()), None)
    if like is None:
        return
    if x.device != like.device:
        raise ValueError(f"{name} is on {x.device} but the module's parameters are on {like.device}")
    if x.dtype != like.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(f"{name} is {x.dtype} but the module's parameters are {like.dtype}; convert one to the other")


@dataclass
class _Prepared:
    """What every cache of one design graph shares: its rule, the graph a step evaluates (None:
    the design's own; else its absorbed form), which axes of each tensor run over positions, the
    fixed sizes, and what steps keep between them (size numbers without the run-time length,
    einsum orders, unrolled constants). Held while the design graph lives, no longer."""

    work: DesignGraph | None
    rule: DecodeRule
    position_axes: dict[str, tuple[bool, ...]]
    sizes: dict[str, int]
    numbers: dict[sympy.Expr, float] = field(default_factory=dict)
    expressions: dict[tuple, Any] = field(default_factory=dict)
    constants: dict[tuple, torch.Tensor] = field(default_factory=dict)


_PREPARED: dict[int, _Prepared] = {}


def _prepared(graph: DesignGraph) -> _Prepared:
    entry = _PREPARED.get(id(graph))
    if entry is None:
        rule = decode_rule(graph)
        symbol = graph.sizes[rule.size].symbol
        axes = {name: tuple(a.size == symbol for a in tensor.axes) for name, tensor in graph.tensors.items()}
        work = chosen_form(graph)
        entry = _Prepared(None if work is graph else work, rule, axes, known_sizes(graph, {}))
        _PREPARED[id(graph)] = entry
        weakref.finalize(graph, _PREPARED.pop, id(graph), None)
    return entry


def _graph_of(module: nn.Module) -> DesignGraph:
    plan = getattr(module, "tdiag_plan", None) or embedded_plan(type(module))
    graph = getattr(plan, "graph", None) or getattr(module, "tdiag_graph", None)
    if graph is None:
        raise NotDecodableError(
            "this module carries no design graph: build it with Design.module() (or write it with"
            " `tdiag compile`, whose file carries its design) to decode with a cache"
        )
    return graph


@dataclass
class _StepFrame(Frame):
    """The reference evaluator's frame over ranges of positions: each position leg of the
    statement being evaluated covers `ranges[leg]` = (first position, count)."""

    step: Any = None
    ranges: dict[str, tuple[int, int]] = field(default_factory=dict)

    def leg_size(self, leg: str) -> int:
        if leg in self.step.rule.positional:
            return self.ranges[leg][1]
        return int(self.number(self.graph.legs[leg].size))

    def number(self, expr: sympy.Expr) -> float:
        """The value of a size expression; those without the run-time length are kept between
        steps (the cache's `numbers`), so that a step does not evaluate them again."""
        numbers = self.step.cache.numbers
        if expr in numbers:
            return numbers[expr]
        value = self.graph.evaluate(expr)
        if value.is_number:
            numbers[expr] = float(value)
            return numbers[expr]
        return super().number(expr)

    def leg_start(self, leg: str) -> int:
        return self.ranges[leg][0] if leg in self.step.rule.positional else 0

    def value(self, ref: TensorRef) -> torch.Tensor:
        return self.step.value(ref)

    def einsum(self, spec: str, *operands: torch.Tensor) -> torch.Tensor:
        """torch.einsum, in an order of pairwise contractions chosen once per spec, rank and
        whether one position is new (opt_einsum's, as torch.einsum would choose at each call)."""
        if len(operands) < 3:
            return torch.einsum(spec, *operands)
        key = (spec, tuple(x.dim() for x in operands), self.step.new[1] == 1)
        expressions = self.step.cache.expressions
        if key not in expressions:
            import opt_einsum

            expressions[key] = opt_einsum.contract_expression(spec, *(x.shape for x in operands))
        return expressions[key](*operands, backend="torch")

    def slice_window(self, ref: TensorRef, axis: int, extent: sympy.Expr) -> tuple[int, int]:
        leg = ref.groups[axis][0]
        if leg in self.step.rule.positional:
            start, count = self.ranges[leg]
            return int(self.number(ref.offset(axis))) + start, count
        return super().slice_window(ref, axis, extent)


class _Step:
    """One decoding step: positions P .. P + T − 1 from the input x and the cached rows."""

    def __init__(self, cache: DecodeCache, x: torch.Tensor, count: int):
        self.cache, self.rule, self.graph = cache, cache.rule, cache.graph
        past = cache.length
        self.new, self.all = (past, count), (0, past + count)
        sizes = {**cache.sizes, self.rule.size: past + count}
        if len(sizes) < len(self.graph.sizes):  # sizes defined from the run-time length
            sizes = known_sizes(self.graph, sizes)
        dtype = x.dtype if x.is_floating_point() else next(iter(cache.module.parameters()), x).dtype
        self.frame = _StepFrame(self.graph, sizes, {self.rule.input: x}, dtype, x.device, step=self)
        self.memo: dict[tuple, torch.Tensor] = {}
        self.joined: dict[str, torch.Tensor] = {}
        self.positions = cache.position_axes
        for tensor in self.graph.tensors.values():
            if tensor.kind in ("param", "const", "buffer"):
                self.frame.values[tensor.name] = self._stored(tensor, sizes, dtype, x.device)

    def _stored(self, tensor: Tensor, sizes: dict[str, int], dtype: torch.dtype, device) -> torch.Tensor:
        """A parameter, buffer or constant as the module holds it; a constant the compiled plan
        does not store (a literal it unrolls) from its initializer, made once per dtype and device."""
        held = getattr(self.cache.module, tensor.name, None)
        if isinstance(held, torch.Tensor):
            return held
        key = (tensor.name, dtype, device)
        if key not in self.cache.constants:
            shape = numeric_shape(tensor, sizes, self.graph)
            self.cache.constants[key] = initial_value(tensor, shape, self.graph, sizes, 0, dtype).to(device)
        return self.cache.constants[key]

    def output(self, name: str) -> torch.Tensor:
        tensor = self.graph.tensors[name]
        ranges = tuple(self.new if position else None for position in self.positions[name])
        return self.frame.values[name] if tensor.kind == "input" else self.computed(tensor, ranges)

    def value(self, ref: TensorRef) -> torch.Tensor:
        tensor = self.graph.tensors[ref.name]
        if tensor.kind == "random":
            shape = [
                self.frame.leg_size(g[0]) if position else int(self.frame.number(a.size))
                for g, a, position in zip(ref.groups, tensor.axes, self.positions[ref.name], strict=True)
            ]
            return torch.zeros(shape, dtype=self.frame.dtype, device=self.frame.device)
        ranges = tuple(
            (self.frame.ranges[g[0]] if g[0] in self.rule.positional else self.new) if position else None
            for g, position in zip(ref.groups, self.positions[ref.name], strict=True)
        )
        if tensor.kind == "input" and self.all in ranges and self.new != self.all:
            return self._joined(tensor.name, self.frame.values[ref.name], ranges.index(self.all) - len(ranges))
        if tensor.kind == "input" and tensor.name in self.rule.cached and self.new == self.all:
            self.joined[tensor.name] = self.frame.values[ref.name]
        if tensor.kind != "derived":
            return self.frame.values[ref.name]
        return self.computed(tensor, ranges)

    def _joined(self, name: str, new: torch.Tensor, dim: int) -> torch.Tensor:
        """The cached rows of `name` and its new ones, along its position axis `dim` (from the end)."""
        if name not in self.joined:
            self.joined[name] = torch.cat([self.cache.tensors[name], new], dim)
        return self.joined[name]

    def computed(self, tensor: Tensor, ranges: tuple) -> torch.Tensor:
        key = (tensor.name, ranges)
        if key in self.memo:
            return self.memo[key]
        axes = [k for k, r in enumerate(ranges) if r is not None]
        rows = self.cache.tensors.get(tensor.name)
        if tensor.name in self.rule.cached and len(axes) == 1 and ranges[axes[0]] == self.all and rows is not None:
            new = self.computed(tensor, tuple(self.new if r is not None else None for r in ranges))
            value = self.joined[tensor.name] = torch.cat([rows, new], axes[0] - len(ranges))
        else:
            value = self._evaluated(tensor.statement, ranges)  # type: ignore[arg-type]
            if tensor.name in self.rule.cached and ranges[axes[0]] == self.all:
                self.joined[tensor.name] = value
        self.memo[key] = value
        return value

    def _evaluated(self, statement: Statement, ranges: tuple) -> torch.Tensor:
        statement = _evaluable(statement, self.cache.expressions)
        saved = self.frame.ranges
        legs = {group[0]: r for group, r in zip(statement.groups, ranges, strict=True) if r is not None}
        legs.update(dict.fromkeys(self.rule.inner.get(statement.target, ()), self.all))
        self.frame.ranges = legs
        try:
            return statement_value(statement, self.frame)
        finally:
            self.frame.ranges = saved


def check_decodes(
    module: nn.Module, x: torch.Tensor, chunks: list[int] | tuple[int, ...], *, compiled: bool | None = None
) -> float:
    """The largest relative error of decoding `x` in `chunks` (counts of positions, summing to its
    length) through a new cache of `module`, against the module's causal forward over the same
    prefix: for each chunk, max |step − forward rows| / max |forward rows|, the largest over chunks
    and outputs. The property a fuzzer checks of any causal design; raises NotDecodableError
    (with why) where no cache can serve the module. `compiled` as for DecodeCache."""
    cache = DecodeCache(module, compiled=compiled)
    _check_input(x, f"input {cache.rule.input}", module)
    rank = len(cache.graph.inputs[0].axes)
    dim = cache.rule.axis - rank
    if x.dim() < rank:
        raise ValueError(f"input {cache.rule.input} needs {rank} trailing axes, got shape {tuple(x.shape)}")
    counts = list(chunks)
    if not counts or any(not isinstance(c, int) or isinstance(c, bool) or c < 1 for c in counts):
        raise ValueError(f"chunks must be positive counts of positions, got {chunks!r}")
    if sum(counts) != x.shape[dim]:
        raise ValueError(f"chunks sum to {sum(counts)} positions but x has {x.shape[dim]} along {cache.rule.size}")
    worst, start = 0.0, 0
    with torch.no_grad():
        for count in counts:
            steps = _as_tuple(cache.extend(x.narrow(dim, start, count)))
            forward = _as_tuple(module(x.narrow(dim, 0, start + count)))
            for name, step, whole in zip(cache.graph.outputs, steps, forward, strict=True):
                expected = _last_rows(cache, name, whole, count)
                worst = max(worst, _relative_error(step, expected))
            start += count
    return worst


def _as_tuple(outputs: torch.Tensor | tuple[torch.Tensor, ...]) -> tuple[torch.Tensor, ...]:
    return outputs if isinstance(outputs, tuple) else (outputs,)


def _last_rows(cache: DecodeCache, name: str, y: torch.Tensor, count: int) -> torch.Tensor:
    """The last `count` rows of output `name` along each of its position axes."""
    symbol = cache.graph.sizes[cache.rule.size].symbol
    axes = cache.graph.tensors[name].axes
    for k, axis in enumerate(axes):
        if axis.size == symbol:
            dim = k - len(axes)
            y = y.narrow(dim, y.shape[dim] - count, count)
    return y


NOISE_SCALE = 1e-4  # rows smaller than this are compared absolutely, as rounding noise is


def _relative_error(step: torch.Tensor, expected: torch.Tensor) -> float:
    """max |step − expected| over max |expected|, or over NOISE_SCALE where that is smaller: rows
    that cancel to rounding noise (a centred vector summed over its own channels is ~1e-16 in
    float64, so two exact evaluations differ by the order of the rows themselves) are compared
    absolutely, not read as an error of order 1; inf for a shape or a non-finite value that differs."""
    if step.shape != expected.shape:
        return math.inf
    same = (step == expected) | (step.isnan() & expected.isnan())
    if bool(same.all()):
        return 0.0
    difference = (step - expected).abs().masked_fill(same, 0).max().item()
    if not math.isfinite(difference):
        return math.inf
    scale = expected.abs().masked_fill(~expected.isfinite(), 0).max().item()
    return difference / max(scale, NOISE_SCALE)


def _evaluable(statement: Statement, memo: dict[tuple, Any]) -> Statement:
    """`statement` in nodes the reference evaluator takes: the layer norms a compiled plan fused
    (bert's, cohere's q/k norms) written out again, once per statement."""
    key = ("evaluable", statement.target, id(statement))
    if key not in memo:
        expr = decode_state.written_out(statement.expr)
        memo[key] = statement if expr is statement.expr else dataclasses.replace(statement, expr=expr)
    return memo[key]
