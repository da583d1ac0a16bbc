"""The recurrent form of a causal design, read off its graph (issue 25, cache kind "state"): which
sums over the keys are causal products, how each splits into a query side, a key side and a
decay, and what state it keeps (`state_plan`); decode_state.py evaluates a step from it and owns
the docstring of the whole rule. Nothing here imports torch.

What a kind means here is a rule of decode_rules.py, registered by its construct module: how a
factor takes part in a causal product (STATE_FACTOR) and a term of a decay's exponent
(DECAY_TERM), the statements rewritten first (STATE_STATEMENT: a causal normalize box into its
linear order, decode_linear.py), and why a kind cannot be evaluated at the new rows alone
(STATE_ROWS, STATE_WHAT). Products and references are the structure the rule is about and are
read directly."""

from __future__ import annotations

import dataclasses
import weakref
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sympy

from .decode_fused import written_out
from .decode_rules import (
    DECAY_TERM,
    STATE_FACTOR,
    STATE_ROWS,
    STATE_STATEMENT,
    STATE_WHAT,
    NoStateError,
    StatementRewrite,
    legs_in,
)
from .graph import DesignGraph
from .ir import (
    Axis,
    Contraction,
    ElementwiseMap,
    Expr,
    SegmentSum,
    Statement,
    Tensor,
    TensorRef,
    map_children,
    renamed,
    walk,
)
from .plan.decay import additive_terms

if TYPE_CHECKING:
    import torch

__all__ = ["CausalProduct", "ProductParts", "StatePlan", "StatePlanner", "state_plan"]

Signed = tuple[tuple[int, Expr], ...]


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

    @property
    def base(self) -> str:
        """The name its cache entries start with (`.state`, `.decay`)."""
        return self.slot.removesuffix(".state")


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
                held.append(f"{p.base}.decay")
        return tuple(held)


_PLANS: dict[int, StatePlan | str] = {}


def state_plan(graph: DesignGraph) -> StatePlan | str:
    """The recurrent form of a causal design graph of one input, or why it has none (a
    sentence naming the statement). Kept while the graph lives."""
    key = id(graph)
    if key not in _PLANS:
        try:
            _PLANS[key] = StatePlanner(graph).plan()
        except NoStateError as refused:
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


class StatePlanner:
    """The state analysis of one design graph (`plan`): the graph's legs and tensors as the
    rewrites extend them, and the causal products found. The rules of decode_rules.py read
    `graph`, `tensors`, `symbol`, `labels`, `positional` and `fresh`."""

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
        """Whether `leg` runs over the positions (the run-time length)."""
        return self.legs[leg].size == self.symbol

    def fresh(self, leg: str, tag: str) -> str:
        """A new leg like `leg`, named after it and `tag`, added to the graph's legs."""
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
                raise NoStateError(f"{statement.target} keeps two position legs (scores of queries against keys)")
            expr = self.replaced(statement.expr, statement.target)
            self.check_rows(expr, statement.target, set(statement.legs))
            work.append(statement if expr is statement.expr else dataclasses.replace(statement, expr=expr))
        if not self.products:
            raise NoStateError("no causal product or causal normalize box sums over the positions")
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
            if self.rewrite_of(statement) is not None or any(len(g) != 1 for g in statement.groups):
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
            hidden = sorted(legs_in(inner) - set(statement.legs))
            names.update({leg: self.fresh(leg, "in") for leg in hidden})
            summed += [names[leg] for leg in hidden]
            factors.append(renamed(inner, names))
        return dataclasses.replace(e, factors=tuple(factors), summed=tuple(dict.fromkeys(summed)))

    # -- statements their kind rewrites first (a causal normalize box into its linear order)

    def rewrite_of(self, statement: Statement) -> StatementRewrite | None:
        """The rewrite `statement`'s kind takes before causal products are found (STATE_STATEMENT)."""
        return STATE_STATEMENT.lookup(statement.expr)(self, statement)

    def unboxed(self, statements: list[Statement]) -> list[Statement]:
        """The statements with each one's rewrite applied in turn (the box's statement dropped,
        its reader rewritten as the quotient of two sums of causal products)."""
        out = list(statements)
        for statement in statements:
            rewrite = self.rewrite_of(statement)
            if rewrite is not None:
                out = rewrite(out)
        return out

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
        """`e` as a causal product: its factors sorted into sides and decay (ProductParts), its
        state's legs, and the tensor that stands for it."""
        parts = ProductParts(self, target, query, key, e.coefficient)
        for f in e.factors:
            parts.take(f)
        if not parts.causal and not parts.running:
            raise NoStateError(f"{target} sums over {key} without causal({query}, {key}) or a segment sum")
        queries, keys, u, w, running = parts.queries, parts.keys, parts.u, parts.w, parts.running
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
            raise NoStateError(f"{target}'s decay has a query part reading {key} or a key part reading {query}")
        key_side = {leg for f in keys for leg in f.legs} | set(w_legs) | (set(u_legs) - {query})
        query_side = {leg for f in queries for leg in f.legs} | set(u_legs) | set(e.legs)
        order = list(dict.fromkeys([*e.legs, *(leg for f in parts.factors for leg in f.legs), *u_legs, *w_legs]))
        state = tuple(leg for leg in order if leg in key_side & query_side and leg not in (query, key))
        slot = self.labels.get(id(e)) or f"{target}.state"
        if slot in self.tensors:
            slot += str(len([p for p in self.products if p.statement == target]))
        product = CausalProduct(
            slot, target, e, query, key, tuple(queries), tuple(keys), parts.coefficient,
            tuple(u), tuple(w), tuple(running), state, u_legs, w_legs,
        )  # fmt: skip
        self.products.append(product)
        self.tensors[slot] = Tensor(slot, "derived", tuple(Axis(leg, self.legs[leg].size) for leg in e.legs), e.span)
        return TensorRef(e.legs, e.span, name=slot, groups=tuple((leg,) for leg in e.legs))

    @staticmethod
    def side_legs(terms: list[Expr], more: list[tuple[str, ...]]) -> tuple[str, ...]:
        return tuple(dict.fromkeys([*(leg for t in terms for leg in t.legs), *(leg for legs in more for leg in legs)]))

    def check_rows(self, e: Expr, target: str, allowed: set[str]) -> None:
        """That `e` reads positions only along the rows it is computed for (`allowed`): a step
        evaluates it at the new positions alone (and each kind's STATE_ROWS rule agrees)."""
        for node in walk(e):
            extra = {leg for leg in legs_in(node) if self.positional(leg)} - allowed
            if extra:
                raise NoStateError(
                    f"{target} reads positions {', '.join(sorted(extra))} beside its rows in a {node.kind}"
                    f" ({STATE_WHAT.lookup(node)(node)}): no recurrent state of a fixed size serves it"
                )
            reason = STATE_ROWS.lookup(node)(self, node, target)
            if reason is not None:
                raise NoStateError(reason)


@dataclass
class ProductParts:
    """The factors of one causal product of `target` (summing position leg `key`, keeping
    `query`) as each kind's STATE_FACTOR rule sorts them: the query side (reading n, or neither
    leg) and the key side (reading m); the decay's exponent terms `u` (reading n) and `w`
    (reading m) and its segment sums `running` (DECAY_TERM); whether the causal factor was
    met; `coefficient` the product of those of the products multiplied out; `factors` every
    factor taken, in order, once the products among them are multiplied out."""

    planner: StatePlanner
    target: str
    query: str
    key: str
    coefficient: sympy.Expr
    queries: list[Expr] = field(default_factory=list)
    keys: list[Expr] = field(default_factory=list)
    u: list[tuple[int, Expr]] = field(default_factory=list)
    w: list[tuple[int, Expr]] = field(default_factory=list)
    running: list[tuple[int, SegmentSum]] = field(default_factory=list)
    causal: bool = False
    factors: list[Expr] = field(default_factory=list)

    def take(self, factor: Expr) -> None:
        """Sort one factor by its kind's rule."""
        STATE_FACTOR.lookup(factor)(self, factor)

    def reads_both(self, e: Expr) -> bool:
        """Whether `e` reads the query leg and the key leg."""
        reads = legs_in(e)
        return self.query in reads and self.key in reads

    def split(self, factor: Expr) -> None:
        """`factor` on the key side where it reads the key leg, else on the query side; one
        reading both does not split."""
        self.factors.append(factor)
        reads = legs_in(factor)
        if self.query in reads and self.key in reads:
            raise NoStateError(
                f"{self.target} sums over {self.key} a factor ({factor.kind}) that reads {self.query} and"
                f" {self.key} together: it does not split into a query side and a key side"
            )
        (self.keys if self.key in reads else self.queries).append(factor)

    def mark_causal(self, factor: Expr) -> None:
        """`factor` is the product's causal(n, m): Σ_{m ≤ n}."""
        self.factors.append(factor)
        self.causal = True

    def multiply_out(self, product: Contraction) -> None:
        """The factors of a product among the factors, its summed legs renamed apart."""
        inner = renamed(product, {leg: self.planner.fresh(leg, "x") for leg in product.summed})
        self.coefficient *= inner.coefficient
        for f in inner.factors:
            self.take(f)

    def decay(self, factor: ElementwiseMap) -> None:
        """exp(U[n] + W[m]): each term of the exponent sorted by its kind's DECAY_TERM rule."""
        self.factors.append(factor)
        for sign, term in additive_terms(factor.operand):  # type: ignore[arg-type]
            DECAY_TERM.lookup(term)(self, sign, term)

    def split_term(self, sign: int, term: Expr) -> None:
        """A term of the decay's exponent in U where it does not read the key leg, else in W
        where it does not read the query leg; one reading both is not a decay."""
        reads = legs_in(term)
        if self.key not in reads:
            self.u.append((sign, term))
        elif self.query not in reads:
            self.w.append((sign, term))
        else:
            raise NoStateError(
                f"{self.target}'s exp factor has a term ({term.kind}) reading {self.query} and {self.key} together:"
                " not a decay exp(U[n] + W[m])"
            )
