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
of an operand without the query leg, is refused at its position. What each expression kind
means here (where its mask goes, what it hides, mixes or reads ahead) is its rule in the tables
of graph/position_rules.py, registered by its construct module; this module walks the statements."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from ..errors import Diagnostic, Span, TdiagError
from ..ir import CausalFactor, CausalMask, Expr, TensorRef, map_children, walk
from .dataflow import dataflow_graph
from .model import DesignGraph
from .position_rules import FUTURE, HIDES, MASK_SITE, MIXING, SEEN, Hidden, Positions, reads_an_input, zeros


def _masked(expr: Expr, query: str, key: str, span: Span, hidden: Hidden) -> tuple[Expr, int]:
    """`expr` with a causal mask over (query, key) on every node whose kind takes one there
    (`MASK_SITE`: a box normalized over `key` that has `query`, a reduction over `key` that keeps
    `query`, a reverse scan along `key` that keeps `query`, a convolution that shifts either) and
    a causal factor in every contraction that sums `key` beside `query` (an un-normalized
    attention: Σ_m f(S)[n m] V[m] with m <= n), wherever the node does not hide those keys
    already (`SEEN`). `hidden` holds, for each statement masked so far, the (query, key) pairs
    of its axes of one leg it is masked on."""
    count = 0

    def rebuild(child: Expr) -> Expr:
        nonlocal count
        rebuilt, n = _masked(child, query, key, span, hidden)
        count += n
        return rebuilt

    expr = map_children(expr, rebuild)
    site = MASK_SITE.lookup(expr)(expr, query, key)
    if site is None or SEEN.lookup(expr)(expr, query, key, hidden):
        return expr, count
    if site == "masks":
        return dataclasses.replace(expr, masks=(*expr.masks, CausalMask(query, key, span))), count + 1  # type: ignore[attr-defined]
    factors = (*expr.factors, CausalFactor((query, key), span, query, key))  # type: ignore[attr-defined]
    batch = tuple(dict.fromkeys((*expr.batch, query)))  # type: ignore[attr-defined]
    return dataclasses.replace(expr, factors=factors, batch=batch), count + 1


def _future(expr: Expr, positions: Positions) -> Diagnostic | None:
    """The first read of a later position that nothing hides (`FUTURE`): a reverse scan along a
    position leg no causal mask limits, a convolution's shift that reads ahead."""
    for node in walk(expr):
        problem = FUTURE.lookup(node)(node, positions)
        if problem is not None:
            return problem
    return None


def position_legs(
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


def _reduced_legs(node: Expr) -> tuple[str, ...]:
    """The legs a node sums, reduces or normalizes over (`MIXING`)."""
    mixing = MIXING.lookup(node)(node)
    return mixing.over if mixing is not None else ()


def _mixes_positions(
    expr: Expr, queries: set[str], keys: set[str], graph: DesignGraph, query_leg: str
) -> Diagnostic | None:
    """Why `expr` cannot be made causal, at the node that mixes the positions of an input: a
    contraction, reduction, box or distance over a key leg without a query leg beside it (each
    query would see every key), or a box normalized over a query leg, with a key leg beside it or
    none (its sum runs over the later queries)."""
    for node in walk(expr):
        mixing = MIXING.lookup(node)(node)
        if mixing is None or not mixing.over or not reads_an_input(node, graph):
            continue
        over, what = mixing.over, mixing.what
        mixed_keys = sorted(keys & set(over))
        if mixed_keys and not queries & set(node.legs):
            query = min(queries, default=query_leg)
            return Diagnostic(
                f"with_causal_mask cannot mask {what} over key leg '{mixed_keys[0]}': it has no query leg"
                f" '{query}', so every query would see every key",
                (node.span,),
                f"keep the query leg beside the keys (Σ_{mixed_keys[0]} causal({query}, {mixed_keys[0]}) ...)"
                " or write the causal design yourself",
            )
        mixed_queries = sorted(queries & set(over))
        if mixing.normalizes and mixed_queries:
            return Diagnostic(
                f"with_causal_mask cannot mask a box normalized over query leg '{mixed_queries[0]}':"
                " each query would see the later queries",
                (node.span,),
                "normalize over the key leg, or write the causal design yourself",
            )
        if not mixing.normalizes and mixed_queries and not queries & set(node.legs):
            return Diagnostic(
                f"with_causal_mask cannot mask {what} over query leg '{mixed_queries[0]}':"
                " each query would see the later queries",
                (node.span,),
                "keep the query leg in the result, or write the causal design yourself",
            )
    return None


def _already_causal(graph: DesignGraph, query: str, key: str) -> bool:
    """Whether the design masks `key` by `query` somewhere already (`HIDES`: a causal box or
    factor, a one-sided window, which hides the future as well, segment sums, a clamp of the
    index difference, or an identity over the two: the diagonal)."""
    diagonal = _identities(graph)
    return any(
        HIDES.lookup(node)(node, query, key, diagonal)
        for statement in graph.statements
        for node in walk(statement.expr)
    )


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
            queries, keys = position_legs(statement.expr, query, key, roles, graph)
            problem = _mixes_positions(statement.expr, queries, keys, graph, query)
            if problem is not None:
                mixing.append(problem)
            expr = statement.expr
            for q, k in dict.fromkeys([(query, key), *((q, k) for q in queries for k in keys if q != k)]):
                expr, count = _masked(expr, q, k, statement.span, hidden)
                total += count
            statements.append(dataclasses.replace(statement, expr=expr))
            looking_ahead = _future(expr, Positions(queries, keys, graph, hidden))
            if looking_ahead is not None:
                future.append(looking_ahead)
            position = {g[0]: k for k, g in enumerate(statement.groups) if len(g) == 1}  # axes of one leg
            hidden[statement.target] = {
                (position[q], position[k]) for q, k in zeros(expr, hidden) if q in position and k in position
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
