"""with_causal_mask: the same design with a causal mask on every attention over a key leg, added
after building (`tdiag show --causal`, Design.causal()): a mask on each box normalized over the key
and on each reduction over it,
a causal factor in each contraction that sums it beside the query; the masking is traced through
earlier statements so nothing is masked twice. A reverse scan along the key beside the query is
masked too; a forward scan is a prefix, causal as it is. A sum, reduction or box that mixes the
keys of an input without the query leg (Σ_m K[m] V[m] of a factored linear attention, a mean over
keys, a softmax over queries), and a reverse scan along a position leg without it (a suffix sum
sees the future), have no causal form and are refused at their position. A convolution that shifts
the query or key leg of an operand with both is masked before the shift (zeroed above the
diagonal, Multi-Token Attention's Mask_0); one whose shift reads a later query, or a later position
of an operand without the query leg, is refused at its position."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import TypeGuard

import sympy

from ..errors import Diagnostic, Span, TdiagError
from ..ir import (
    CausalFactor,
    CausalMask,
    Contraction,
    Convolution,
    ElementwiseMap,
    Expr,
    PositionIndex,
    Quotient,
    Reduction,
    Scalar,
    Scan,
    SegmentSum,
    SoftmaxBox,
    SquaredDistance,
    SumNode,
    TensorRef,
    WindowFactor,
    WindowMask,
    map_children,
    walk,
)
from .dataflow import dataflow_graph
from .model import DesignGraph


def _hides_future(mask: object) -> TypeGuard[CausalMask | WindowMask]:
    """A causal mask, or a one-sided window (`window(n, m, W)`), which hides the future too."""
    return isinstance(mask, CausalMask) or (isinstance(mask, WindowMask) and mask.is_causal)


def _causal_factor(node: Expr) -> bool:
    """`causal(n, m)` or a one-sided `window(n, m, W)` as a factor."""
    return isinstance(node, CausalFactor) or (isinstance(node, WindowFactor) and node.mask.is_causal)


def _masked(
    expr: Expr, query: str, key: str, span: Span, hidden: Mapping[str, set[tuple[int, int]]]
) -> tuple[Expr, int]:
    """`expr` with a causal mask added to every box normalized over `key` that has `query` and to
    every reduction (max, logsumexp, mean) over `key` that keeps `query`, to every reverse scan
    along `key` that keeps `query` (a suffix sum over the keys would reach the future), and a
    causal factor in every contraction that sums `key` beside `query` where no factor is masked
    already (an un-normalized attention: Σ_m f(S)[n m] V[m] with m <= n). `hidden` holds, for
    each statement masked so far, the (query, key) pairs of its axes of one leg it is masked on."""
    if isinstance(expr, TensorRef | Scalar | CausalFactor | WindowFactor):
        return expr, 0
    count = 0

    def rebuild(child: Expr) -> Expr:
        nonlocal count
        rebuilt, n = _masked(child, query, key, span, hidden)
        count += n
        return rebuilt

    expr = map_children(expr, rebuild)
    changes: dict[str, object] = {}
    reduced = isinstance(expr, Reduction) and key in expr.over and query in expr.legs
    reduced = reduced or (isinstance(expr, Scan) and expr.reverse and expr.along == key and query in expr.legs)
    if isinstance(expr, Scan) and expr.name == "cumsum" and (query, key) in _hidden_pairs(expr.operand, hidden):
        reduced = False  # a suffix sum of entries zero past the query adds nothing from the future
    if isinstance(expr, SoftmaxBox) and (query, key) in _zeroed_content(expr, hidden):
        reduced = False  # the box's content hides the later keys itself (a decay of segment sums)
    elif isinstance(expr, SoftmaxBox) and key in expr.normalized and query in expr.legs:
        reduced = True
    if reduced:
        if not any(_hides_future(m) and (m.query, m.key) == (query, key) for m in expr.masks):
            changes["masks"] = (*expr.masks, CausalMask(query, key, span))
            count += 1
    if isinstance(expr, Convolution) and _shifts_positions(expr, query, key):
        operand = expr.operand
        hides = any(_hides_future(m) and (m.query, m.key) == (query, key) for m in expr.masks)
        if not hides and (query, key) not in _hidden_pairs(operand, hidden):
            changes["masks"] = (*expr.masks, CausalMask(query, key, span))
            count += 1
    if isinstance(expr, Contraction) and key in expr.summed and query in expr.legs:
        factors = expr.factors
        if not any((query, key) in _hidden_pairs(f, hidden) for f in factors if key in f.legs):
            changes["factors"] = (*factors, CausalFactor((query, key), span, query, key))
            changes["batch"] = tuple(dict.fromkeys((*expr.batch, query)))
            count += 1
    return (dataclasses.replace(expr, **changes) if changes else expr), count


def _shifts_positions(expr: Convolution, query: str, key: str) -> bool:
    """Whether a convolution over an operand with both `query` and `key` legs shifts either: its
    operand is then zeroed where the key is after the query before the shift (Multi-Token
    Attention's Mask_0), so that a shifted read sees no key after its own query."""
    shifted = {s.leg for s in expr.shifts}
    return query in expr.legs and key in expr.legs and bool(shifted & {query, key})


def _future_shift(expr: Expr, queries: set[str], keys: set[str], graph: DesignGraph) -> Diagnostic | None:
    """A shift that reads a later position where nothing hides it: along a query leg, or along a
    position leg of an operand without a query leg beside its key (a token shift of the keys),
    any offset that reads ahead (n + i, or m - j + P with P > 0) would let a position see the
    ones after it. A shift along the key leg of an operand with the query leg reads ahead safely
    once the operand is zeroed above the diagonal (mask = causal(n, m), Mask_0)."""
    size = graph.legs[next(iter(keys))].size if keys and next(iter(keys)) in graph.legs else None
    for node in walk(expr):
        if not isinstance(node, Convolution) or not _reads_an_input(node, graph):
            continue
        for shift in node.shifts:
            leg = shift.leg
            positional = leg in queries or leg in keys or (leg in graph.legs and graph.legs[leg].size == size)
            if not positional:
                continue
            width = graph.evaluate(graph.legs[shift.offset].size)
            ahead = graph.evaluate(shift.start + (width - 1 if shift.sign > 0 else 0))
            masked = any(_hides_future(m) and m.key == leg and m.query in node.legs for m in node.masks)
            if ahead > 0 and not (masked and leg not in queries):
                return Diagnostic(
                    f"with_causal_mask cannot mask the conv's shift {leg} = {shift.source()}: it reads position"
                    f" {leg} + {ahead}, after the one it computes",
                    (node.span,),
                    f"shift along the query leg backwards only ({leg} = {leg} - {shift.offset}); a centred shift"
                    " of the keys needs the query leg beside them, as in conv[n = n - i, m = m - j + P](S[h n m], ...)",
                )
    return None


def _hidden_pairs(expr: Expr, hidden: Mapping[str, set[tuple[int, int]]]) -> set[tuple[str, str]]:
    """The (query, key) leg pairs along which `expr` is causally masked or zeroed already."""
    if _causal_factor(expr):
        return {(expr.query, expr.key)}  # type: ignore[attr-defined]
    if _causal_clamp(expr) is not None:
        return {_causal_clamp(expr)}  # type: ignore[arg-type]
    if isinstance(expr, ElementwiseMap) and expr.name == "exp" and expr.operand is not None:
        return _minus_infinity_pairs(expr.operand)
    if isinstance(expr, ElementwiseMap) and expr.operand is not None and _keeps_zero(expr):
        return _hidden_pairs(expr.operand, hidden)
    if isinstance(expr, SoftmaxBox):
        return {(m.query, m.key) for m in expr.masks if _hides_future(m)} | _zeroed_content(expr, hidden)
    if isinstance(expr, Contraction):
        return set().union(*(_hidden_pairs(f, hidden) for f in expr.factors))
    if isinstance(expr, SumNode):  # zero where every term is
        return set.intersection(*(_hidden_pairs(t, hidden) for t in expr.terms))
    if isinstance(expr, Quotient):
        return _hidden_pairs(expr.numerator, hidden)  # type: ignore[arg-type]
    if isinstance(expr, TensorRef) and expr.name in hidden:  # a head axis read as (g k) keeps n, m
        groups = expr.groups
        return {(groups[q][0], groups[k][0]) for q, k in hidden[expr.name] if len(groups[q]) == len(groups[k]) == 1}
    return set()


def _zeroed_content(box: SoftmaxBox, hidden: Mapping[str, set[tuple[int, int]]]) -> set[tuple[str, str]]:
    """The pairs along which a box's entries are zero past the query by its content alone: a
    normalize box of a content zero there, a softmax of one −inf there."""
    if box.content is None:
        return set()
    if box.is_exp:
        return _minus_infinity_pairs(box.content)
    return _hidden_pairs(box.content, hidden)


def _minus_infinity_pairs(expr: Expr) -> set[tuple[str, str]]:
    """The (query, key) pairs along which `expr` is −inf past the query (segment sums, and a sum
    with such a term), so that its exp is zero there (Mamba-2's decay mask exp(segsum(a)))."""
    if isinstance(expr, SegmentSum):
        return {(expr.along, expr.key)}
    if isinstance(expr, SumNode):
        return set().union(
            *(_minus_infinity_pairs(t) for t, sign in zip(expr.terms, expr.signs, strict=True) if sign > 0)
        )
    return set()


def _position_legs(
    expr: Expr, query: str, key: str, roles: Mapping[str, dict[int, str]], graph: DesignGraph
) -> tuple[set[str], set[str]]:
    """The legs of a statement that run over queries and over keys: `query` and `key` by name,
    and any leg naming an earlier statement's query or key axis under another name (the
    denominator Σ_k E[h n k] of an attention E[h n m] written out). A leg that would be both is
    neither. Any other leg of the key's size that the statement sums, reduces or normalizes runs
    over key positions too (Σ_l X[l f] beside the values mixes every position). Leg names are
    local to a statement: a tensor with one position axis (V defined over m) read at the query
    leg (V[n h e]) is read at a query, so only an attention pattern's axes (a query and a key
    axis of one tensor) override the statement's own names."""
    queries, keys = {query}, {key}
    for node in walk(expr):
        if isinstance(node, TensorRef) and not node.is_reshaped and node.name in roles:
            is_pattern = len(set(roles[node.name].values())) == 2
            for axis, role in roles[node.name].items():
                if is_pattern or node.legs[axis] not in (query, key):
                    (queries if role == "query" else keys).add(node.legs[axis])
    both = queries & keys
    queries, keys = queries - both, keys - both
    if key in graph.legs:
        size = graph.legs[key].size
        for node in walk(expr):
            keys.update(leg for leg in _reduced_legs(node) if leg in graph.legs and graph.legs[leg].size == size)
        keys -= queries | both
    return queries, keys


def _mixes_positions(
    expr: Expr, queries: set[str], keys: set[str], graph: DesignGraph, query_leg: str
) -> Diagnostic | None:
    """Why `expr` cannot be made causal, at the node that mixes the positions of an input: a
    contraction, reduction, box or distance over a key leg without a query leg beside it (each
    query would see every key), or a box normalized over a query leg, with a key leg beside it or
    none (its sum runs over the later queries)."""
    for node in walk(expr):
        over = _reduced_legs(node)
        if not over or not _reads_an_input(node, graph):
            continue
        mixed_keys = sorted(keys & set(over))
        if mixed_keys and not queries & set(node.legs):
            query, what = min(queries, default=query_leg), _construct(node)
            return Diagnostic(
                f"with_causal_mask cannot mask {what} over key leg '{mixed_keys[0]}': it has no query leg"
                f" '{query}', so every query would see every key",
                (node.span,),
                f"keep the query leg beside the keys (Σ_{mixed_keys[0]} causal({query}, {mixed_keys[0]}) ...)"
                " or write the causal design yourself",
            )
        mixed_queries = sorted(queries & set(over))
        if isinstance(node, SoftmaxBox) and mixed_queries:
            return Diagnostic(
                f"with_causal_mask cannot mask a box normalized over query leg '{mixed_queries[0]}':"
                " each query would see the later queries",
                (node.span,),
                "normalize over the key leg, or write the causal design yourself",
            )
        if not isinstance(node, SoftmaxBox) and mixed_queries and not queries & set(node.legs):
            return Diagnostic(
                f"with_causal_mask cannot mask {_construct(node)} over query leg '{mixed_queries[0]}':"
                " each query would see the later queries",
                (node.span,),
                "keep the query leg in the result, or write the causal design yourself",
            )
    return None


def _future_scan(
    expr: Expr, queries: set[str], keys: set[str], graph: DesignGraph, hidden: Mapping[str, set[tuple[int, int]]]
) -> Diagnostic | None:
    """A reverse scan (a suffix sum) along a position leg that no causal mask limits to the keys
    a query may see: each position would see the later ones. A forward scan is a prefix, causal
    as it is; a reverse one along the key leg beside the query leg is masked by with_causal_mask."""
    size = graph.legs[next(iter(keys))].size if keys and next(iter(keys)) in graph.legs else None
    for node in walk(expr):
        if not isinstance(node, Scan) or not node.reverse or not _reads_an_input(node, graph):
            continue
        leg = node.along
        positional = leg in queries or leg in keys or (leg in graph.legs and graph.legs[leg].size == size)
        zeroed = node.name == "cumsum" and any((q, leg) in _hidden_pairs(node.operand, hidden) for q in queries)
        if positional and not zeroed and not any(_hides_future(m) and m.key == leg for m in node.masks):
            return Diagnostic(
                f"with_causal_mask cannot mask the reverse {node.name} along position leg '{leg}':"
                " each position would see the later ones",
                (node.span,),
                "scan forward (a prefix)"
                + (
                    f", or beside the query leg with mask = causal({min(queries)}, {leg})" if leg not in queries else ""
                ),
            )
    return None


def _reduced_legs(node: Expr) -> tuple[str, ...]:
    """The legs a node sums, reduces or normalizes over."""
    if isinstance(node, Contraction):
        return node.summed
    if isinstance(node, Reduction | SquaredDistance):
        return node.over
    if isinstance(node, SoftmaxBox):
        return node.normalized
    return ()


def _construct(node: Expr) -> str:
    """The node as the user wrote it, in a word or two."""
    if isinstance(node, Reduction):
        return f"the {node.name}"
    if isinstance(node, SoftmaxBox):
        return "the box"
    if isinstance(node, SquaredDistance):
        return "the sqdist"
    return "the sum"


def _reads_an_input(expr: Expr, graph: DesignGraph) -> bool:
    """Whether `expr` depends on an input, mask or noise (a sum of parameters or positions over
    a key leg mixes nothing that arrives later)."""
    for node in walk(expr):
        if isinstance(node, TensorRef):
            tensor = graph.tensors[node.name]
            if tensor.is_batched or (tensor.statement is not None and _reads_an_input(tensor.statement.expr, graph)):
                return True
    return False


def _already_causal(graph: DesignGraph, query: str, key: str) -> bool:
    """Whether the design masks `key` by `query` somewhere already (a causal box or factor, a
    one-sided window, which hides the future as well, or an identity over the two: the diagonal)."""
    diagonal = _identities(graph)
    for statement in graph.statements:
        for node in walk(statement.expr):
            if _causal_factor(node) and (node.query, node.key) == (query, key):  # type: ignore[attr-defined]
                return True
            if isinstance(node, TensorRef) and node.name in diagonal and set(node.legs) == {query, key}:
                return True
            if isinstance(node, SoftmaxBox | Reduction | Scan) and any(
                _hides_future(m) and (m.query, m.key) == (query, key) for m in node.masks
            ):
                return True
            if isinstance(node, SegmentSum) and (node.along, node.key) == (query, key):
                return True
            if _causal_clamp(node) == (query, key):
                return True
    return False


def with_causal_mask(graph: DesignGraph, query: str = "n", key: str = "m") -> DesignGraph:
    """The same design with `mask = causal(query, key)` on every box normalized over `key` that
    also has leg `query`, and the factor causal(query, key) in every contraction that sums `key`
    beside `query` over factors not masked already (sigmoid, ReLU² and linear attention); the
    bundled designs use n for queries and m for keys. A leg that names a query or key axis of an
    earlier statement's tensor under another name counts as one (`Σ_k E[h n k]` over E[h n m]).
    A design causal already (`hides_the_future`) is returned as it is."""
    masking = _Masking.of(graph, query, key)
    if masking.future:
        raise TdiagError(masking.future)
    if masking.causal_as_written(graph, query, key):
        return graph
    if masking.mixing:
        raise TdiagError(sorted(masking.mixing, key=lambda d: (d.spans[0].line, d.spans[0].column)))
    if not masking.total:
        raise TdiagError(
            Diagnostic(
                f"design '{graph.name}' has no attention over leg '{key}' with leg '{query}' to mask"
                " (a box normalized over it, or a contraction that sums it beside the query leg)",
                (Span(graph.file, 1, 1, 1, 2),),
                "name the query and key legs: with_causal_mask(query=..., key=...)",
            )
        )
    tensors = {name: dataclasses.replace(t) for name, t in graph.tensors.items()}
    for statement in masking.statements:
        tensors[statement.target].statement = statement
    return dataclasses.replace(
        graph,
        name=graph.name,
        tensors=tensors,
        statements=masking.statements,
        graph=dataflow_graph(tensors, masking.statements, graph.updates),
    )


@dataclasses.dataclass
class _Masking:
    """The causal masks with_causal_mask would add over (query, key): the masked `statements`,
    how many masks they add (`total`), the sums that mix the keys without the query (`mixing`)
    and the reads of later positions nothing can hide (`future`)."""

    statements: list
    total: int
    mixing: list[Diagnostic]
    future: list[Diagnostic]

    @classmethod
    def of(cls, graph: DesignGraph, query: str, key: str) -> _Masking:
        statements, total, mixing, future = [], 0, [], []
        hidden = _identities(graph)
        roles: dict[str, dict[int, str]] = {}
        for statement in graph.statements:
            queries, keys = _position_legs(statement.expr, query, key, roles, graph)
            problem = _mixes_positions(statement.expr, queries, keys, graph, query)
            if problem is not None:
                mixing.append(problem)
            expr = statement.expr
            for q, k in dict.fromkeys([(query, key), *((q, k) for q in queries for k in keys if q != k)]):
                expr, count = _masked(expr, q, k, statement.span, hidden)
                total += count
            statements.append(dataclasses.replace(statement, expr=expr))
            looking_ahead = _future_scan(expr, queries, keys, graph, hidden) or _future_shift(
                expr, queries, keys, graph
            )
            if looking_ahead is not None:
                future.append(looking_ahead)
            position = {g[0]: k for k, g in enumerate(statement.groups) if len(g) == 1}  # axes of one leg
            hidden[statement.target] = {
                (position[q], position[k]) for q, k in _hidden_pairs(expr, hidden) if q in position and k in position
            }
            if not any(len(g) != 1 for g in statement.groups):
                roles[statement.target] = {
                    axis: "query" if leg in queries else "key"
                    for axis, leg in enumerate(statement.legs)
                    if leg in queries or leg in keys
                }
        return cls(statements, total, mixing, future)

    def causal_as_written(self, graph: DesignGraph, query: str, key: str) -> bool:
        """Whether the design needs no mask over (query, key), hides the future somewhere, and mixes
        no positions a mask cannot reach (a box normalized over the query leg too sums over the
        later queries, whatever its causal mask)."""
        return not self.total and not self.future and not self.mixing and _already_causal(graph, query, key)


def _identities(graph: DesignGraph) -> dict[str, set[tuple[int, int]]]:
    """The identity constants over two axes of one size, zero off their diagonal: a factor of
    one hides the later keys (and the earlier ones), as `causal(n, m) - I[n m]` relies on."""
    hidden = {}
    for tensor in graph.tensors.values():
        init = tensor.init
        square = len(tensor.axes) == 2 and tensor.axes[0].size == tensor.axes[1].size
        if tensor.kind == "const" and init is not None and init.name == "identity" and square:
            hidden[tensor.name] = {(0, 1), (1, 0)}
    return hidden


def _position_difference(expr: Expr) -> tuple[str, str] | None:
    """(n, m) for `index(n) - index(m)`, plus a number of at most zero (`index(n) - index(m) - 1`)."""
    if not isinstance(expr, SumNode):
        return None
    plus, minus = [], []
    for term, sign in zip(expr.terms, expr.signs, strict=True):
        if isinstance(term, PositionIndex):
            (plus if sign > 0 else minus).append(term.leg)
        elif not (isinstance(term, Scalar) and _number(term) * sign <= 0):
            return None
    return (plus[0], minus[0]) if len(plus) == len(minus) == 1 and plus != minus else None


def _number(scalar: Scalar) -> float:
    try:
        return float(scalar.value)
    except (TypeError, ValueError):
        return 1.0  # not a number here: not taken as an offset that keeps the factor causal


def _causal_clamp(expr: Expr) -> tuple[str, str] | None:
    """(n, m) for a factor zero wherever key m is after query n: `clamp(index(n) - index(m), 0, c)`
    (stick-breaking's strictly-earlier keys), `relu(...)` or `max(..., 0)` of that difference."""
    if not isinstance(expr, ElementwiseMap) or expr.operand is None:
        return None
    floor = {"clamp": 0, "maximum": 0}.get(expr.name)
    if expr.name == "relu" or (floor is not None and expr.params and expr.params[0] == 0):
        return _position_difference(expr.operand)
    return None


def _keeps_zero(node: ElementwiseMap) -> bool:
    """Whether the map sends 0 to 0, so that an operand zero past the query stays zero there."""
    params = [sympy.sympify(p) for p in node.params]
    if node.name in ("relu", "abs", "sin", "tanh", "sqrt", "silu", "gelu"):
        return True
    if node.name == "clamp":
        return len(params) == 2 and params[0].is_nonpositive is True and params[1].is_nonnegative is True
    if node.name == "maximum":
        return len(params) == 1 and params[0].is_nonpositive is True
    if node.name == "minimum":
        return len(params) == 1 and params[0].is_nonnegative is True
    return node.name == "pow" and len(params) == 1 and params[0].is_positive is True


def hides_the_future(graph: DesignGraph, query: str | None = None, key: str | None = None) -> bool:
    """Whether the design is causal as written over query leg `query` and key leg `key` (by
    default any leg of the first output and any other leg): with_causal_mask would add no mask and
    returns it as it is, and some statement hides later keys from a query (a causal box,
    reduction, scan or factor, a one-sided window, segment sums, a clamp of the index
    difference). The one test of causality: with_causal_mask's, and what decoding with a cache
    relies on (tdiag/decode.py), since the outputs at earlier positions then never change."""
    queries = [query] if query is not None else _output_legs(graph)
    for q in queries:
        keys = [key] if key is not None else [leg for leg in graph.legs if leg != q]
        if any(_already_causal(graph, q, k) and _Masking.of(graph, q, k).causal_as_written(graph, q, k) for k in keys):
            return True
    return False


def _output_legs(graph: DesignGraph) -> list[str]:
    """The legs of the first output, as its statement names them."""
    if not graph.outputs or graph.tensors[graph.outputs[0]].statement is None:
        return []
    return [group[0] for group in graph.tensors[graph.outputs[0]].statement.groups if len(group) == 1]
