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
fused by the planner (plan/norms.py), which are written out again for it."""

from __future__ import annotations

import dataclasses
import string
import weakref
from dataclasses import dataclass, field

import sympy
import torch

from .graph import DesignGraph
from .init import initial_value, numeric_shape
from .ir import (
    Axis,
    CausalFactor,
    CausalMask,
    Contraction,
    Convolution,
    ElementwiseMap,
    Expr,
    Gather,
    PaddingMask,
    Quotient,
    Reduction,
    Scalar,
    Scan,
    SegmentSum,
    SoftmaxBox,
    Statement,
    SumNode,
    Tensor,
    TensorRef,
    WindowFactor,
    map_children,
    renamed,
    walk,
)
from .plan.decay import additive_terms
from .plan.norms import LayerNormNode
from .reference import Frame, align, evaluate, known_sizes, statement_value

__all__ = ["CausalProduct", "StatePlan", "state_plan"]

Signed = tuple[tuple[int, Expr], ...]
CHUNK = 64  # a step over more new positions runs in steps of this many: the part within them is CHUNK² per head


@dataclass(frozen=True)
class CausalProduct:
    """One causal product of a statement (see the module's docstring): `node` as the work graph
    writes it, its `query` and `key` legs, the factors of its query side (reading n, or neither
    leg) and key side (reading m), with `coefficient` the product of those of the products
    multiplied out; the decay's exponent terms `u` (reading n, over `u_legs`) and `w` (reading
    m, over `w_legs`), and the segment sums `running` whose running sums count in u (with the
    sign given) at n and in w (negated) at m; `state_legs`, the legs the state keeps. `slot`
    names the tensor that stands for the product in its statement, and the state in the cache."""

    slot: str
    statement: str
    node: Contraction
    query: str
    key: str
    queries: tuple[Expr, ...]
    keys: tuple[Expr, ...]
    coefficient: sympy.Expr
    u: Signed = ()
    w: Signed = ()
    running: tuple[tuple[int, SegmentSum], ...] = ()
    state_legs: tuple[str, ...] = ()
    u_legs: tuple[str, ...] = ()
    w_legs: tuple[str, ...] = ()

    @property
    def decays(self) -> bool:
        return bool(self.u or self.w or self.running)


@dataclass
class StatePlan:
    """A design's recurrent form: the work graph (boxes in their linear order, each causal
    product replaced by a tensor `slot`), the products, and the statements in order."""

    graph: DesignGraph
    products: tuple[CausalProduct, ...]
    statements: list[Statement]
    constants: dict[tuple, torch.Tensor] = field(default_factory=dict)
    numbers: dict[sympy.Expr, float] = field(default_factory=dict)
    expressions: dict[tuple, object] = field(default_factory=dict)
    sizes: dict[str, int] | None = None

    def names(self) -> tuple[str, ...]:
        """The cache's tensors, by product: its state, and where its decay has query-side terms
        other than segment sums, their value at the last position (`.decay`)."""
        held = []
        for p in self.products:
            held.append(p.slot)
            if p.u:
                held.append(f"{_base(p)}.decay")
        return tuple(held)


def _base(p: CausalProduct) -> str:
    return p.slot.removesuffix(".state")


class _NoStateError(Exception):
    """The design has no recurrent state; the message says why."""


_PLANS: dict[int, StatePlan | str] = {}


def state_plan(graph: DesignGraph) -> StatePlan | str:
    """The recurrent form of a causal design graph of one input, or why it has none (a
    sentence naming the statement). Kept while the graph lives."""
    key = id(graph)
    if key not in _PLANS:
        try:
            _PLANS[key] = _Planner(graph).plan()
        except _NoStateError as refused:
            _PLANS[key] = str(refused)
        weakref.finalize(graph, _PLANS.pop, key, None)
    return _PLANS[key]


# ---- the rule ------------------------------------------------------------------------------------


def _reads(e: Expr, name: str) -> bool:
    return any(isinstance(n, TensorRef) and n.name == name for n in walk(e))


def _only_as_factor(e: Expr, name: str) -> bool:
    """Whether every read of tensor `name` in `e` is a plain reference among a product's factors."""
    direct = sum(
        1
        for n in walk(e)
        if isinstance(n, Contraction)
        for f in n.factors
        if isinstance(f, TensorRef) and f.name == name and not f.is_reshaped and not f.is_sliced
    )
    return direct == sum(1 for n in walk(e) if isinstance(n, TensorRef) and n.name == name)


def _legs_in(e: Expr) -> set[str]:
    """Every leg a sub-expression reads (its nodes' legs and the legs its products sum)."""
    legs: set[str] = set()
    for node in walk(e):
        legs |= set(node.legs)
        if isinstance(node, Contraction):
            legs |= set(node.summed)
        if isinstance(node, TensorRef):
            legs |= {leg for g in node.groups for leg in g}
        if isinstance(node, Reduction):
            legs |= set(node.over)
    return legs


class _Planner:
    def __init__(self, graph: DesignGraph):
        self.graph = graph
        x = graph.inputs[0]
        symbol = next(a.size for a in x.axes if isinstance(a.size, sympy.Symbol) and graph.sizes[a.size.name].is_free)
        self.symbol = symbol
        self.legs = dict(graph.legs)
        self.tensors = dict(graph.tensors)
        self.products: list[CausalProduct] = []
        self.labels: dict[int, str] = {}  # the products a box's linear order makes, by id: their names

    def positional(self, leg: str) -> bool:
        return self.legs[leg].size == self.symbol

    def fresh(self, leg: str, tag: str) -> str:
        name = f"{leg}_{tag}"
        while name in self.legs:
            name += "_"
        self.legs[name] = dataclasses.replace(self.legs[leg], name=name)
        return name

    def plan(self) -> StatePlan:
        statements = [dataclasses.replace(s, expr=written_out(s.expr)) for s in self.graph.statements]
        statements = self.inlined(statements)
        statements = self.unboxed(statements)
        work = []
        for statement in statements:
            if sum(self.positional(leg) for leg in statement.legs) > 1:
                raise _NoStateError(f"{statement.target} keeps two position legs (scores of queries against keys)")
            expr = self.replaced(statement.expr, statement.target)
            self.check_rows(expr, statement.target, set(statement.legs))
            work.append(statement if expr is statement.expr else dataclasses.replace(statement, expr=expr))
        if not self.products:
            raise _NoStateError("no causal product or causal normalize box sums over the positions")
        tensors = {name: dataclasses.replace(t) for name, t in self.tensors.items()}
        for statement in work:
            if statement.target in tensors:
                tensors[statement.target].statement = statement
        graph = dataclasses.replace(self.graph, legs=self.legs, tensors=tensors, statements=work)
        return StatePlan(graph, tuple(self.products), work)

    # -- matrices over two positions, part of the products that read them

    def inlined(self, statements: list[Statement]) -> list[Statement]:
        """Each statement over two position legs that is no box and no output, read only as a
        factor of products (RetNet's decay matrix D[h n m] = causal(n, m) γ^(n−m), Mamba-2's
        1-semiseparable L, written as statements of their own), put into those products: the
        state analysis reads the causal product the paper means, Y = (Q Kᵀ ⊙ D) V."""
        out = list(statements)
        for statement in statements:
            name = statement.target
            if sum(self.positional(leg) for leg in statement.legs) < 2 or name in self.graph.outputs:
                continue
            if isinstance(statement.expr, SoftmaxBox) or any(len(g) != 1 for g in statement.groups):
                continue
            statement = next(s for s in out if s.target == name)  # as earlier inlining left it
            readers = [k for k, s in enumerate(out) if s.target != name and _reads(s.expr, name)]
            if not readers or not all(_only_as_factor(out[k].expr, name) for k in readers):
                continue
            for k in readers:
                out[k] = dataclasses.replace(out[k], expr=self.substituted(out[k].expr, statement))
            out.remove(statement)
        return out

    def substituted(self, e: Expr, statement: Statement) -> Expr:
        """`e` with each factor reading `statement`'s tensor replaced by its expression, its legs
        renamed to the reference's and the legs it sums inside made fresh."""
        e = map_children(e, lambda child: self.substituted(child, statement))
        if not isinstance(e, Contraction):
            return e
        factors: list[Expr] = []
        summed = list(e.summed)
        for factor in e.factors:
            if not (isinstance(factor, TensorRef) and factor.name == statement.target):
                factors.append(factor)
                continue
            names = {leg: group[0] for leg, group in zip(statement.legs, factor.groups, strict=True)}
            inner = statement.expr
            hidden = sorted(_legs_in(inner) - set(statement.legs))
            names.update({leg: self.fresh(leg, "in") for leg in hidden})
            summed += [names[leg] for leg in hidden]
            factors.append(renamed(inner, names))
        return dataclasses.replace(e, factors=tuple(factors), summed=tuple(dict.fromkeys(summed)))

    # -- normalize boxes into their linear order

    def unboxed(self, statements: list[Statement]) -> list[Statement]:
        """Each causal normalize box over the positions with its one reader rewritten as the
        quotient of two sums of causal products (the box's statement dropped)."""
        out = list(statements)
        for statement in statements:
            box = statement.expr
            if not isinstance(box, SoftmaxBox) or not any(self.positional(leg) for leg in box.normalized):
                continue
            name = statement.target
            if box.is_exp:
                raise _NoStateError(
                    f"{name} is a softmax over positions {', '.join(box.normalized)}: its weights need every"
                    " key's score (no running sum of a fixed size holds them)"
                )
            readers = [s for s in out if any(isinstance(n, TensorRef) and n.name == name for n in walk(s.expr))]
            reader = self.box_reader(statement, box, readers)
            out[out.index(reader)] = self.linear_order(statement, box, reader)
            out.remove(statement)
        return out

    def box_reader(self, statement: Statement, box: SoftmaxBox, readers: list[Statement]) -> Statement:
        name = statement.target
        if len(box.normalized) != 1 or any(len(g) != 1 for g in statement.groups):
            raise _NoStateError(f"{name} normalizes over several legs or merges legs")
        key = box.normalized[0]
        positions = [m for m in box.masks if not isinstance(m, PaddingMask)]  # a cache takes no design mask
        causal = [m for m in positions if isinstance(m, CausalMask) and m.key == key and self.positional(m.query)]
        if len(causal) != len(positions) or len(positions) > 1:
            raise _NoStateError(f"{name}'s masks are not one causal mask over {key}: no running sum serves them")
        if len([leg for leg in statement.legs if self.positional(leg)]) != 2:
            raise _NoStateError(f"{name} normalizes over {key} without one query position beside it")
        if box.sink is not None:
            raise _NoStateError(f"{name} has a sink")
        if name in self.graph.outputs or len(readers) != 1:
            raise _NoStateError(
                f"{name} is an output or read by {len(readers)} statements (its linear order needs one)"
            )
        reader = readers[0]
        refs = [n for n in walk(reader.expr) if isinstance(n, TensorRef) and n.name == name]
        expr = reader.expr
        if (
            len(refs) != 1
            or not isinstance(expr, Contraction)
            or refs[0] not in expr.factors
            or refs[0].is_reshaped
            or refs[0].is_sliced
        ):
            raise _NoStateError(f"{reader.target} reads {name} other than once as a factor of its product")
        ren = dict(zip(statement.legs, refs[0].legs, strict=True))
        if ren[key] not in expr.summed:
            raise _NoStateError(f"{reader.target} does not sum {name}'s key leg")
        return reader

    def linear_order(self, statement: Statement, box: SoftmaxBox, reader: Statement) -> Statement:
        """`reader` with A·(its factors reading the key) replaced by (Σ_{m ≤ n} x ·those) /
        (Σ_{m ≤ n} x + eps), in the reader's leg names (Tuformer §3.3; a sum content term by term)."""
        expr = reader.expr
        assert isinstance(expr, Contraction) and box.content is not None
        ref = next(f for f in expr.factors if isinstance(f, TensorRef) and f.name == statement.target)
        names = dict(zip(statement.legs, ref.legs, strict=True))
        for leg in _legs_in(box.content) - set(names):
            names[leg] = self.fresh(leg, statement.target)
        key = box.normalized[0]
        query = next(leg for leg in statement.legs if self.positional(leg) and leg != key)
        query, key = names[query], names[key]
        beside = [f for f in expr.factors if f is not ref and key in f.legs]
        rest = [f for f in expr.factors if f is not ref and key not in f.legs]
        if any(query in f.legs for f in beside):
            raise _NoStateError(f"{reader.target} reads {query} and {key} together beside {statement.target}")
        outside = set(reader.legs) | {leg for f in rest for leg in f.legs}
        kept = [leg for leg in ref.legs if leg != key]
        kept += [leg for f in beside for leg in f.legs if leg in outside and leg not in kept and leg != key]
        causal = [
            CausalFactor((query, key), box.span, query=query, key=key) for m in box.masks if isinstance(m, CausalMask)
        ]

        def product(factors: list[Expr], legs: list[str]) -> Contraction:
            inner = list(dict.fromkeys(leg for f in factors for leg in f.legs))
            legs = [leg for leg in legs if leg in inner]
            return Contraction(
                tuple(legs), box.span, factors=tuple(factors), summed=tuple(x for x in inner if x not in legs)
            )

        numerators, denominators, signs = [], [], []
        terms = _content_terms(box.content)
        for k, (term, sign) in enumerate(terms):
            term = renamed(term, names)
            numerators.append(product([*causal, term, *beside], kept))
            denominators.append(product([*causal, term], [leg for leg in ref.legs if leg != key]))
            signs.append(sign)
            number = str(k + 1) if len(terms) > 1 else ""
            self.labels[id(numerators[-1])] = f"{statement.target}.numerator{number}"
            self.labels[id(denominators[-1])] = f"{statement.target}.denominator{number}"
        legs = tuple(kept)
        den_legs = tuple(leg for leg in ref.legs if leg != key)
        numerator = SumNode(legs, box.span, terms=tuple(numerators), signs=tuple(signs))
        denominator = SumNode(
            den_legs,
            box.span,
            terms=(*denominators, Scalar((), box.span, value=box.eps)),
            signs=(*signs, 1),
        )
        quotient = Quotient(legs, box.span, numerator=numerator, denominator=denominator)
        factors = (quotient, *rest)
        inner = list(dict.fromkeys(leg for f in factors for leg in f.legs))
        summed = tuple(leg for leg in inner if leg not in expr.legs)
        rebuilt = dataclasses.replace(expr, factors=factors, summed=summed, batch=())
        return dataclasses.replace(reader, expr=rebuilt)

    # -- causal products

    def replaced(self, e: Expr, target: str) -> Expr:
        """`e` with each causal product replaced by a tensor that stands for it."""
        if isinstance(e, Contraction):
            pair = self.pair(e)
            if pair is not None:
                return self.product(e, target, *pair)
        return map_children(e, lambda child: self.replaced(child, target))

    def pair(self, e: Contraction) -> tuple[str, str] | None:
        """(query, key) where `e` sums one position leg and keeps one: a candidate causal product."""
        keys = [leg for leg in e.summed if self.positional(leg)]
        queries = [leg for leg in e.legs if self.positional(leg)]
        if len(keys) == 1 and len(queries) == 1:
            return queries[0], keys[0]
        return None

    def product(self, e: Contraction, target: str, query: str, key: str) -> TensorRef:
        coefficient, factors = self.flattened(e)
        queries, keys, u, w, running, causal = [], [], [], [], [], False
        for f in factors:
            if isinstance(f, CausalFactor) and (f.query, f.key) == (query, key):
                causal = True
                continue
            reads = _legs_in(f)
            if query in reads and key in reads:
                if not (isinstance(f, ElementwiseMap) and f.name == "exp"):
                    raise _NoStateError(
                        f"{target} sums over {key} a factor ({f.kind}) that reads {query} and {key} together: it"
                        " does not split into a query side and a key side"
                    )
                self.decay(f, target, query, key, u, w, running)
            elif key in reads:
                keys.append(f)
            else:
                queries.append(f)
        if not causal and not running:
            raise _NoStateError(f"{target} sums over {key} without causal({query}, {key}) or a segment sum")
        for side, leg in ((queries, query), (keys, key)):
            for f in side:
                self.check_rows(f, target, {leg})
        for _, term in (*u, *w):
            self.check_rows(term, target, {query, key})
        for _, seg in running:
            self.check_rows(seg.operand, target, {seg.along})
        u_legs = self.side_legs([t for _, t in u], [s.operand.legs for _, s in running])
        w_legs = self.side_legs(
            [t for _, t in w], [tuple(s.key if x == s.along else x for x in s.operand.legs) for _, s in running]
        )
        if query in w_legs or key in u_legs:
            raise _NoStateError(f"{target}'s decay has a query part reading {key} or a key part reading {query}")
        key_side = {leg for f in keys for leg in f.legs} | set(w_legs) | (set(u_legs) - {query})
        query_side = {leg for f in queries for leg in f.legs} | set(u_legs) | set(e.legs)
        order = list(dict.fromkeys([*e.legs, *(leg for f in factors for leg in f.legs), *u_legs, *w_legs]))
        state = tuple(leg for leg in order if leg in key_side & query_side and leg not in (query, key))
        slot = self.labels.get(id(e)) or f"{target}.state"
        if slot in self.tensors:
            slot += str(len([p for p in self.products if p.statement == target]))
        product = CausalProduct(
            slot, target, e, query, key, tuple(queries), tuple(keys), coefficient,
            tuple(u), tuple(w), tuple(running), state, u_legs, w_legs,
        )  # fmt: skip
        self.products.append(product)
        self.tensors[slot] = Tensor(slot, "derived", tuple(Axis(leg, self.legs[leg].size) for leg in e.legs), e.span)
        return TensorRef(e.legs, e.span, name=slot, groups=tuple((leg,) for leg in e.legs))

    @staticmethod
    def side_legs(terms: list[Expr], more: list[tuple[str, ...]]) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*(leg for t in terms for leg in t.legs), *(leg for legs in more for leg in legs)]))

    def flattened(self, e: Contraction) -> tuple[sympy.Expr, list[Expr]]:
        """The coefficient and factors of `e` with the products among its factors multiplied out
        (their summed legs renamed apart) and integer powers 1..4 of them written as copies."""
        coefficient, factors = e.coefficient, []
        for f in e.factors:
            copies = 1
            if isinstance(f, ElementwiseMap) and f.name == "pow" and isinstance(f.operand, Contraction):
                exponent = f.params[0]
                if exponent.is_Integer and 1 <= int(exponent) <= 4:
                    copies, f = int(exponent), f.operand
            if not isinstance(f, Contraction):
                factors += [f] * copies
                continue
            for _ in range(copies):
                inner = renamed(f, {leg: self.fresh(leg, "x") for leg in f.summed})
                c, more = self.flattened(inner)
                coefficient *= c
                factors += more
        return coefficient, factors

    def decay(self, f: ElementwiseMap, target: str, query: str, key: str, u: list, w: list, running: list) -> None:
        for sign, term in additive_terms(f.operand):  # type: ignore[arg-type]
            if isinstance(term, SegmentSum) and (term.along, term.key) == (query, key):
                running.append((sign, term))
                continue
            reads = _legs_in(term)
            if key not in reads:
                u.append((sign, term))
            elif query not in reads:
                w.append((sign, term))
            else:
                raise _NoStateError(
                    f"{target}'s exp factor has a term ({term.kind}) reading {query} and {key} together: not a decay"
                    " exp(U[n] + W[m])"
                )

    def check_rows(self, e: Expr, target: str, allowed: set[str]) -> None:
        """That `e` reads positions only along the rows it is computed for (`allowed`): a step
        evaluates it at the new positions alone."""
        for node in walk(e):
            extra = {leg for leg in _legs_in(node) if self.positional(leg)} - allowed
            if extra:
                raise _NoStateError(
                    f"{target} reads positions {', '.join(sorted(extra))} beside its rows in a {node.kind}"
                    f" ({self.what(node)}): no recurrent state of a fixed size serves it"
                )
            if isinstance(node, Scan) and self.positional(node.along):
                raise _NoStateError(
                    f"{target} scans along the positions {node.along} (a running total outside a product)"
                )
            if isinstance(node, SegmentSum):
                raise _NoStateError(f"{target} takes segment sums outside the decay of a causal product")
            if isinstance(node, Convolution) and any(self.positional(s.leg) for s in node.shifts):
                raise _NoStateError(f"{target} convolves along the positions (it reads earlier rows)")
            if isinstance(node, Gather) and node.source is not None:
                tensor = self.tensors[node.source.name]
                axis = node.source.legs.index(node.axis)
                if tensor.axes[axis].size == self.symbol:
                    raise _NoStateError(f"{target} gathers {node.source.name} along its positions")
            if isinstance(node, TensorRef) and self.tensors[node.name].kind == "random":
                init = self.tensors[node.name].init
                if init is not None and str(init.param("mode", "train")) == "always":
                    raise _NoStateError(f"noise {node.name} is drawn over every position at each call (mode = always)")

    @staticmethod
    def what(node: Expr) -> str:
        if isinstance(node, SoftmaxBox):
            return f"{node.box_name} over {', '.join(node.normalized)}"
        if isinstance(node, Reduction):
            return f"{node.name} over {', '.join(node.over)}"
        if isinstance(node, Contraction):
            return "a product over " + ", ".join(node.summed)
        if isinstance(node, CausalFactor | WindowFactor):
            return f"{node.kind}({node.query}, {node.key})"
        return ", ".join(node.legs)


def written_out(e: Expr) -> Expr:
    """`e` with each layer norm the planner fused (a compiled module's graph, plan/norms.py)
    written out again in nodes the reference evaluator takes:
    (Z − mean(Z)) (mean((Z − mean(Z))²) + eps)^(−1/2) [· weight] [+ bias]."""
    e = map_children(e, written_out)
    if not isinstance(e, LayerNormNode):
        return e
    z = e.operand
    assert z is not None
    rest = tuple(leg for leg in z.legs if leg not in e.over)
    centred = SumNode(
        z.legs, e.span, terms=(z, Reduction(rest, e.span, name="mean", over=e.over, operand=z)), signs=(1, -1)
    )
    square = ElementwiseMap(z.legs, e.span, name="pow", operand=centred, params=(sympy.Integer(2),))
    variance = Reduction(rest, e.span, name="mean", over=e.over, operand=square)
    shifted = SumNode(rest, e.span, terms=(variance, Scalar((), e.span, value=e.eps)), signs=(1, 1))
    root = ElementwiseMap(rest, e.span, name="pow", operand=shifted, params=(sympy.Rational(-1, 2),))
    factors = (centred, root) if e.weight is None else (centred, root, e.weight)
    normed = Contraction(z.legs, e.span, factors=factors)
    if e.bias is None:
        return align_legs(normed, e.legs)
    return SumNode(e.legs, e.span, terms=(normed, e.bias), signs=(1, 1))


def align_legs(e: Expr, legs: tuple[str, ...]) -> Expr:
    """`e` with its legs listed as `legs` (a product of it alone where they differ in order)."""
    return e if tuple(e.legs) == tuple(legs) else Contraction(tuple(legs), e.span, factors=(e,))


def _content_terms(e: Expr) -> list[tuple[Expr, int]]:
    if not isinstance(e, SumNode):
        return [(e, 1)]
    return [(term, sign * inner) for t, sign in zip(e.terms, e.signs, strict=True) for term, inner in _content_terms(t)]


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
    cache._batch = batch
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
        last = before.get(f"{_base(p)}.decay")  # the terms of U other than segment sums, at r
        if terms:
            held[f"{_base(p)}.decay"] = _signed_sum(terms, p.u_legs).select(dim, -1)
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
