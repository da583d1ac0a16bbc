"""Recurrent decoding states (issue 25, cache kind "state"): a causal sum over the keys that
splits into a query side and a key side keeps, instead of the keys, their running sum, so that a
decoding step costs the same at every length.

The rule is read off the design graph (`state_plan`), nothing per design. A causal product is a
product summed over a key position leg m, kept along a query position leg n, whose factors each
read n or m but not both, apart from

- the causal factor `causal(n, m)` (Σ_{m ≤ n}), and
- decays exp(U[n] + W[m]): an exponent that is a signed sum of terms reading n only (U) or m
  only (W), a segment sum segsum[n, m](a) = c[n] − c[m] (c the running sum of a) counting on
  both sides (RetNet's γ^(n−m), Lightning's λ^(n−m), Mamba-2's and GLA's gates; the split is
  plan/decay.py's `additive_terms`, as the planner's chunked decay form takes it).

Factors that are products reading both legs are multiplied out, and integer powers 1..4 of them
expanded into copies (Based's (q·k)², as plan/linear.py's linear order does). With Q(n) the
product of the query side, K(m) that of the key side, and r = P − 1 the last position held,
the state of one causal product is

    S_r = Σ_{m ≤ r} exp(U[r] + W[m]) K(m)          (over the legs both sides share: S[h d e])

and a step over new positions P .. P + T − 1 returns

    Σ_{m ≤ n} exp(U[n] + W[m]) Q(n) K(m) = exp(U[n] − U[r]) Q(n) · S_r  +  (the product within the T new positions)

then S_{r'} = exp(U[r'] − U[r]) ⊙ S_r + Σ_{P ≤ m ≤ r'} exp(U[r'] + W[m]) K(m), r' = P + T − 1
(Katharopoulos et al. 2020 §3.4, with the decay of Sun et al. 2023 eq. 6 / Dao & Gu 2024 §3).
The cache holds S and, where U has terms other than segment sums, their value at r: a size set
by the design's widths, never by the positions. A segment sum's running sum is taken from r
(the new entries' cumsum is c[n] − c[r]), so no running total of the sequence is formed. The
part within the new positions is the same split product with a T × T causal block (the decay's
exponent −inf above the diagonal before the exp, as the planner's chunked form takes it); a
step over more than CHUNK new positions runs in steps of CHUNK.

A causal normalize box read by one product that sums its key leg
(`A[h n m] = normalize[m, mask = causal(n, m)](x)`, `Y = A[h n m] V[m h e] …`) is first
rewritten into its linear order, Σ_m A V = (Σ_{m ≤ n} x V) / (Σ_{m ≤ n} x + eps), each term of
a sum content (cosFormer, Based) a causal product of its own (plan/linear.py's hoist and
hoist_sum, Tuformer §3.3). Every other statement must then read positions only along the rows
it computes: a step evaluates the whole design at the new positions only. Anything else (a
softmax over the keys, a scan or convolution along the positions, a reduction over them, a
design that reads the length N) is not a state; `state_plan` returns the sentence naming it,
and the design keeps the kind it had ("kv" or "prefix", with that sentence in its reason).

A step evaluates every statement with the reference evaluator (tdiag/reference.py) over the
new positions, the products by their states; a compiled module's graph has its layer norms
fused by the planner (plan/norms.py), which are written out again for it.

This module owns the step and the rule's place in a cache's kind (`with_state`); the analysis
of the graph is decode_products.py (what each kind means to it: the decode_rules.py tables its
construct module fills), a normalize box's linear order decode_linear.py."""

from __future__ import annotations

import dataclasses
import string
from dataclasses import dataclass, field

import sympy
import torch

from .decode_fused import written_out
from .decode_products import CausalProduct, StatePlan, state_plan
from .graph import DesignGraph
from .init import initial_value, numeric_shape
from .ir import Expr, Tensor, TensorRef
from .reference import Frame, align, evaluate, known_sizes, statement_value

__all__ = ["CausalProduct", "StatePlan", "state_plan", "step", "with_state", "written_out"]

CHUNK = 64  # a step over more new positions runs in steps of this many: the part within them is CHUNK² per head


# ---- the step ------------------------------------------------------------------------------------


@dataclass
class _NewRows(Frame):
    """The reference evaluator's frame over the new positions: every position leg covers
    P .. P + T − 1."""

    start: int = 0
    count: int = 0
    symbol: sympy.Expr | None = None
    numbers: dict[sympy.Expr, float] = field(default_factory=dict)
    expressions: dict[tuple, object] = field(default_factory=dict)

    def number(self, expr: sympy.Expr) -> float:
        """A size expression's value; those without the run-time length are kept in the plan
        between steps (`numbers`), so that a step does not evaluate them again."""
        if expr in self.numbers:
            return self.numbers[expr]
        value = self.graph.evaluate(expr)
        if value.is_number:
            self.numbers[expr] = float(value)
            return self.numbers[expr]
        return super().number(expr)

    def einsum(self, spec: str, *operands: torch.Tensor) -> torch.Tensor:
        return _contract(self.expressions, spec, operands)

    def leg_size(self, leg: str) -> int:
        if self.graph.legs[leg].size == self.symbol:
            return self.count
        return super().leg_size(leg)

    def leg_start(self, leg: str) -> int:
        return self.start if self.graph.legs[leg].size == self.symbol else 0

    def slice_window(self, ref: TensorRef, axis: int, extent: sympy.Expr) -> tuple[int, int]:
        leg = ref.groups[axis][0]
        if self.graph.legs[leg].size == self.symbol:
            return int(self.number(ref.offset(axis))) + self.start, self.count
        return super().slice_window(ref, axis, extent)


def _contract(expressions: dict, spec: str, operands: tuple[torch.Tensor, ...]) -> torch.Tensor:
    """torch.einsum, in the order of pairwise contractions opt_einsum picks, chosen once per spec
    and shapes and kept in the plan (as torch.einsum would choose it again at every call)."""
    if len(operands) < 3:
        return torch.einsum(spec, *operands)
    key = (spec, tuple(x.shape for x in operands))
    if key not in expressions:
        if len(expressions) > 1024:  # many shapes of prompts and batches: forget the old ones
            expressions.clear()
        import opt_einsum

        expressions[key] = opt_einsum.contract_expression(spec, *(x.shape for x in operands))
    return expressions[key](*operands, backend="torch")


def _einsum(
    frame: _NewRows, operands: list[tuple[torch.Tensor, tuple[str, ...]]], out: tuple[str, ...]
) -> torch.Tensor:
    letters = dict(
        zip(dict.fromkeys([*(leg for _, legs in operands for leg in legs), *out]), string.ascii_letters, strict=False)
    )
    spec = ",".join("..." + "".join(letters[leg] for leg in legs) for _, legs in operands)
    return frame.einsum(spec + "->..." + "".join(letters[leg] for leg in out), *(x for x, _ in operands))


def step(cache, design: DesignGraph, x: torch.Tensor, batch: torch.Size) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """The outputs at the new positions of `x` from the states the cache holds; the states
    carried past them."""
    plan = state_plan(design)
    assert isinstance(plan, StatePlan)
    graph, module = plan.graph, cache.module
    if module.training and (cache.rule.noise or graph.updates):
        raise ValueError(
            f"design '{graph.name}' draws noise or updates buffers in training mode, which a decoding step"
            " does not: decode in eval mode (module.eval())"
        )
    dim = cache.rule.axis - len(graph.inputs[0].axes)
    count = x.shape[dim]
    if count > CHUNK:
        pieces = [step(cache, design, part, batch) for part in x.split(CHUNK, dim)]
        return _joined(graph, symbol_of(graph, cache.rule.size), pieces)
    symbol = graph.sizes[cache.rule.size].symbol
    if plan.sizes is None:
        plan.sizes = known_sizes(graph, {})
    sizes = {**plan.sizes, cache.rule.size: cache.length + count}
    if len(sizes) < len(graph.sizes):  # sizes defined from the run-time length
        sizes = known_sizes(graph, sizes)
    dtype = x.dtype
    frame = _NewRows(
        graph, sizes, {cache.rule.input: x}, dtype, x.device, start=cache.length, count=count, symbol=symbol,
        numbers=plan.numbers, expressions=plan.expressions,
    )  # fmt: skip
    for tensor in graph.tensors.values():
        if tensor.kind in ("param", "const", "buffer"):
            frame.values[tensor.name] = _stored(plan, module, tensor, sizes, dtype, x.device)
        elif tensor.kind == "random":
            shape = [count if a.size == symbol else int(graph.evaluate(a.size, **sizes)) for a in tensor.axes]
            frame.values[tensor.name] = torch.zeros(shape, dtype=dtype, device=x.device)
    by_statement: dict[str, list[CausalProduct]] = {}
    for product in plan.products:
        by_statement.setdefault(product.statement, []).append(product)
    held: dict[str, torch.Tensor] = {}
    for statement in plan.statements:
        for product in by_statement.get(statement.target, ()):
            frame.values[product.slot] = _product(product, frame, cache.tensors, held)
        frame.values[statement.target] = statement_value(statement, frame)
    cache.tensors = held
    cache.length += count
    cache.held_batch = batch
    outputs = tuple(frame.values[name] for name in graph.outputs)
    return outputs[0] if len(outputs) == 1 else outputs


def symbol_of(graph: DesignGraph, size: str) -> sympy.Expr:
    return graph.sizes[size].symbol


def _joined(graph: DesignGraph, symbol: sympy.Expr, pieces: list) -> torch.Tensor | tuple[torch.Tensor, ...]:
    """The outputs of consecutive steps joined along each output's position axis."""
    single = not isinstance(pieces[0], tuple)
    rows = [(piece,) if single else piece for piece in pieces]
    joined = []
    for k, name in enumerate(graph.outputs):
        axes = graph.tensors[name].axes
        dim = next(j for j, a in enumerate(axes) if a.size == symbol) - len(axes)
        joined.append(torch.cat([row[k] for row in rows], dim))
    return joined[0] if single else tuple(joined)


def _stored(plan: StatePlan, module, tensor: Tensor, sizes: dict, dtype: torch.dtype, device) -> torch.Tensor:
    """A parameter, buffer or constant as the module holds it, else from its initializer."""
    held = getattr(module, tensor.name, None)
    if isinstance(held, torch.Tensor):
        return held
    key = (tensor.name, dtype, device)
    if key not in plan.constants:
        shape = numeric_shape(tensor, sizes, plan.graph)
        plan.constants[key] = initial_value(tensor, shape, plan.graph, sizes, 0, dtype).to(device)
    return plan.constants[key]


def _value(e: Expr, frame: Frame) -> tuple[torch.Tensor, tuple[str, ...]]:
    return evaluate(e, frame), tuple(e.legs)


def _signed_sum(parts: list[tuple[int, torch.Tensor, tuple[str, ...]]], legs: tuple[str, ...]) -> torch.Tensor:
    total = None
    for sign, value, its in parts:
        term = sign * align(value, its, legs)
        total = term if total is None else total + term
    assert total is not None
    return total


def _product(p: CausalProduct, frame: _NewRows, before: dict[str, torch.Tensor], held: dict) -> torch.Tensor:
    """The causal product at the new positions: the part within them as written, plus the
    query side read against the state; the state carried to the last new position (`held`).
    The part within is Σ_{P ≤ m ≤ n} of the same split factors and the decay's block, its
    entries above the diagonal −inf before the exp (as the planner's chunked form takes it).
    A segment sum's running sum is taken from the last position held (c[n] − c[r], the new
    entries' cumsum), so that no running total of the whole sequence is ever formed."""
    ones = {leg: torch.ones(frame.count, dtype=frame.dtype, device=frame.device) for leg in (p.query, p.key)}
    queries = [_value(f, frame) for f in p.queries]
    keys = [_value(f, frame) for f in p.keys]
    if not any(p.key in legs for _, legs in keys):
        keys.append((ones[p.key], (p.key,)))
    future = torch.ones(frame.count, frame.count, dtype=torch.bool, device=frame.device).triu(1)
    block = (torch.where(future, 0.0, 1.0).to(frame.dtype), (p.query, p.key))  # causal(n, m) within the new positions
    state = before.get(p.slot)
    if p.decays:
        kept = tuple(leg for leg in p.u_legs if leg != p.query)
        dim = p.u_legs.index(p.query) - len(p.u_legs)
        sums = []
        for sign, seg in p.running:
            operand = seg.operand
            assert operand is not None
            at_keys = tuple(seg.key if leg == seg.along else leg for leg in operand.legs)
            sums.append(
                (
                    sign,
                    evaluate(operand, frame).cumsum(operand.legs.index(seg.along) - len(operand.legs)),
                    operand.legs,
                    at_keys,
                )
            )
        terms = [(s, *_value(t, frame)) for s, t in p.u]
        u = _signed_sum(terms + [(s, c, legs) for s, c, legs, _ in sums], p.u_legs)  # U[n] − Σ ± c[r]
        w = _signed_sum([(s, *_value(t, frame)) for s, t in p.w] + [(-s, c, legs) for s, c, _, legs in sums], p.w_legs)
        last = before.get(f"{p.base}.decay")  # the terms of U other than segment sums, at r
        if terms:
            held[f"{p.base}.decay"] = _signed_sum(terms, p.u_legs).select(dim, -1)
        since = u if last is None else u - align(last, kept, p.u_legs)  # U[n] − U[r]
        pair = tuple(dict.fromkeys((*p.u_legs, *p.w_legs)))
        exponent = align(u, p.u_legs, pair) + align(w, p.w_legs, pair)  # U[n] + W[m]
        mask = align(future, (p.query, p.key), pair)
        block = (torch.exp(exponent.masked_fill(mask, float("-inf"))), pair)  # the future's growth never taken
        legs = tuple(dict.fromkeys((*kept, *p.w_legs)))
        keys.append((torch.exp(align(u.select(dim, -1), kept, legs) + align(w, p.w_legs, legs)), legs))
    within = frame.number(p.coefficient) * _einsum(frame, [*queries, *keys[: len(p.keys)], block], tuple(p.node.legs))
    increment = _einsum(frame, keys, p.state_legs)
    if state is None:
        held[p.slot] = increment
        return within
    read = state
    if p.decays:
        queries.append((torch.exp(since), p.u_legs))
        state = align(torch.exp(since.select(dim, -1)), kept, p.state_legs) * state
    if not any(p.query in legs for _, legs in queries):
        queries.append((ones[p.query], (p.query,)))
    across = _einsum(frame, [*queries, (read, p.state_legs)], tuple(p.node.legs))
    held[p.slot] = state + increment
    return within + frame.number(p.coefficient) * across


def with_state(graph: DesignGraph, rule):
    """`rule` (decode.py's "kv" or "prefix" rule of `graph`) as kind "state" where the design has
    a recurrent form, else with the reason it has none added to its `reason`."""
    why = None
    if rule.reads_length:
        why = "it reads the length N as a number, so its keys' terms change as positions are added"
    else:
        plan = state_plan(graph)
        if isinstance(plan, str):
            why = plan
    if why is not None:
        reason = f"no recurrent state: {why}"
        return dataclasses.replace(rule, reason=reason if rule.reason is None else f"{rule.reason}; {reason}")
    noise = any(
        t.kind == "random" and (t.init is None or str(t.init.param("mode", "train")) == "train")
        for t in graph.tensors.values()
    )
    assert not isinstance(plan, str)
    return dataclasses.replace(rule, kind="state", cached=(), inner={}, reason=None, noise=noise, states=plan.names())
