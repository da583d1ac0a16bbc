"""The graphs behind a compiled module's call-time masks (`attn_mask`, `key_padding_mask`), as
`torch.nn.functional.scaled_dot_product_attention` and `nn.MultiheadAttention` take them: a mask
over (query, key) is put exactly where `with_causal_mask` puts `causal(query, key)`, traced through
statements the same way, so `is_causal` and a mask hide the same entries of the same nodes.

- `with_call_mask`: a boolean `mask` input M[query key] (True = attend): a padding mask on every box
  normalized over the key beside the query (softmax, normalize) and on every reduction over it and
  reverse scan along it, and a factor M[query key] in every contraction that sums the key beside
  the query over factors not masked already (sigmoid, ReLU² and linear attention: the hidden
  entries are zeroed, as the language's masks are).
- `with_call_bias`: a float `input` S[query key] added to the scores of every softmax box over the
  key beside the query, after its scale (SDPA's float attn_mask: softmax(scale·q·k + S)); or, per
  head, S[heads query key] over each box's head legs (`box_heads`). Only where every node the
  mask would reach is a softmax box: a bias has no meaning for a normalize box, a map or a sum,
  and `CallMaskError` says which node refuses it.

How a call mask passes through each kind (the pairs it hides, a reached node's head legs, whether it
takes a bias) is its rule in graph/position_rules.py's tables, registered by its construct module."""

from __future__ import annotations

import dataclasses

from ..errors import Span
from ..ir import Axis, Expr, PaddingMask, SoftmaxBox, Tensor, TensorRef, map_children
from ..resources import shown_path
from .causal import position_legs
from .dataflow import dataflow_graph
from .model import DesignGraph
from .position_rules import BIAS, CALL_WORD, HEADS, MASK_SITE, Bias, Hidden, call_hidden

# a node a mask per head reaches, its head legs (node_heads) and the legs only its query side holds
Reached = tuple[Expr, tuple[str, ...], tuple[str, ...]]


class CallMaskError(ValueError):
    """A float mask where the design's attention is not a softmax box: the reason, naming the node."""


def call_mask_name(graph: DesignGraph, stem: str = "attn_mask") -> str:
    """A tensor name for the call mask that no tensor or size of the design has."""
    name = stem
    while name in graph.tensors or name in graph.sizes:
        name += "_"
    return name


def call_mask_ref(name: str, query: str, key: str, span: Span, heads: tuple[str, ...] = ()) -> TensorRef:
    """The call mask (or bias) `name` read over its head legs, the query and the key leg."""
    legs = (*heads, query, key)
    return TensorRef(legs=legs, span=span, name=name, groups=tuple((leg,) for leg in legs))


def is_call_mask(mask: object, name: str) -> bool:
    """Whether `mask` is the call mask `name` (a padding mask over its tensor)."""
    return isinstance(mask, PaddingMask) and mask.tensor.name == name


def box_heads(box: SoftmaxBox, query: str) -> tuple[str, ...]:
    """A box's head legs: its legs other than the query leg and the normalized ones, in its order
    (h; g r under grouped-query attention, kv-head-major as Hugging Face numbers the heads)."""
    return tuple(leg for leg in box.legs if leg != query and leg not in box.normalized)


def node_heads(node: Expr, query: str, key: str) -> tuple[str, ...]:
    """The head legs of a node the call mask reaches, over which a mask per head is laid (`HEADS`):
    a box's (box_heads); a reduction's, reverse scan's or convolution's legs other than the query
    and key legs, in its order; a contraction's legs that its query side and its key side share,
    other than the features they contract."""
    return HEADS.lookup(node)(node, query, key)[0]


def _masked(
    expr: Expr,
    query: str,
    key: str,
    name: str,
    span: Span,
    hidden: Hidden,
    bias: bool,
    refused: list[tuple[str, Span]],
    heads: list[Reached] | None = None,
) -> tuple[Expr, int]:
    """`expr` with the call mask (or, with `bias`, the call bias) on every node over `key` beside
    `query` that `with_causal_mask` masks (`MASK_SITE`, as graph/causal.py `_masked`); with
    `bias`, each such node that takes no bias (`BIAS`: all but a softmax box) is recorded in
    `refused` and left as it is. With `heads` (a list), the mask or bias is per head, over each
    node's head legs (`HEADS`): each node and its head legs are appended to it."""
    count = 0

    def rebuild(child: Expr) -> Expr:
        nonlocal count
        rebuilt, n = _masked(child, query, key, name, span, hidden, bias, refused, heads)
        count += n
        return rebuilt

    node = map_children(expr, rebuild)
    site = MASK_SITE.lookup(node)(node, query, key)
    if site is None:
        return node, count
    if site == "factor" and any((query, key) in call_hidden(f, name, hidden) for f in node.factors if key in f.legs):  # type: ignore[attr-defined]
        return node, count
    legs, alone = HEADS.lookup(node)(node, query, key) if heads is not None else ((), ())
    if bias:
        biased = BIAS.lookup(node)(node, Bias(name, query, key, span, heads is not None))
        if biased is None:
            refused.append((CALL_WORD.lookup(node)(node), node.span))
            return node, count
        if heads is not None:
            heads.append((node, legs, alone))
        return biased, count + 1
    if heads is not None:
        heads.append((node, legs, alone))
    ref = call_mask_ref(name, query, key, span, legs)
    if site == "masks":
        return dataclasses.replace(node, masks=(*node.masks, PaddingMask(ref, span))), count + 1  # type: ignore[attr-defined]
    batch = tuple(dict.fromkeys((*node.batch, query)))  # type: ignore[attr-defined]
    return dataclasses.replace(node, factors=(*node.factors, ref), batch=batch), count + 1  # type: ignore[attr-defined]


def _rewritten(
    graph: DesignGraph,
    name: str,
    query: str,
    key: str,
    bias: bool,
    heads: list[Reached] | None = None,
) -> list:
    """The statements with the call mask or bias, traced through them as with_causal_mask traces
    the causal mask; raises CallMaskError where a bias meets a node that is not a softmax box.
    With `heads` (a list) the mask or bias is per head, and each node it reaches is appended
    with its head legs."""
    statements, refused = [], []
    hidden: dict[str, set[tuple[int, int]]] = {}
    roles: dict[str, dict[int, str]] = {}
    for statement in graph.statements:
        queries, keys = position_legs(statement.expr, query, key, roles, graph)
        expr = statement.expr
        for q, k in dict.fromkeys([(query, key), *((q, k) for q in queries for k in keys if q != k)]):
            expr, _ = _masked(expr, q, k, name, statement.span, hidden, bias, refused, heads)
        statements.append(dataclasses.replace(statement, expr=expr))
        position = {g[0]: k for k, g in enumerate(statement.groups) if len(g) == 1}  # axes of one leg
        hidden[statement.target] = {
            (position[q], position[k]) for q, k in call_hidden(expr, name, hidden) if q in position and k in position
        }
        if not any(len(g) != 1 for g in statement.groups):
            roles[statement.target] = {
                axis: "query" if leg in queries else "key"
                for axis, leg in enumerate(statement.legs)
                if leg in queries or leg in keys
            }
    if refused:
        what, span = refused[0]
        raise CallMaskError(
            f"design '{graph.name}' attends over {key} through {what} ({shown_path(span.file)} line {span.line}),"
            " not a softmax box: a float mask adds to softmax scores only; pass a bool mask (True = attend),"
            " which zeroes the hidden entries"
        )
    return statements


def _with(graph: DesignGraph, name: str, query: str, key: str, bias: bool, per_head: bool = False) -> DesignGraph:
    """The graph with the call mask or bias: its statements rewritten, the tensor declared (over
    the nodes' head legs too, `per_head`)."""
    heads: list[Reached] | None = [] if per_head else None
    statements = _rewritten(graph, name, query, key, bias, heads)
    span = Span(graph.file, 1, 1, 1, 2)
    tensors = {n: dataclasses.replace(t) for n, t in graph.tensors.items()}
    legs = (*(heads[0][1] if heads else ()), query, key)
    tensors[name] = Tensor(
        name, "input" if bias else "mask", tuple(Axis(leg, graph.legs[leg].size) for leg in legs), span
    )
    for statement in statements:
        tensors[statement.target].statement = statement
    return dataclasses.replace(
        graph, tensors=tensors, statements=statements, graph=dataflow_graph(tensors, statements, graph.updates)
    )


def _node_named(node: Expr) -> str:
    """A node as a refusal names it: what it is and where it is written."""
    return f"{CALL_WORD.lookup(node)(node)} ({shown_path(node.span.file)} line {node.span.line})"


def _heads_of(graph: DesignGraph, reached: list[Reached]) -> tuple[tuple | None, str]:
    """The sizes of the head legs of the nodes a mask per head reaches, where every one has head
    legs of the same sizes; else None and why, naming the node."""
    if not reached:
        return None, "no node takes the mask per head"
    first, first_legs, _ = reached[0]
    sizes = tuple(graph.legs[leg].size for leg in first_legs)
    for node, legs, alone in reached:
        if not legs:
            return None, f"{_node_named(node)} has no head legs beside the query and key legs"
        if alone:
            return None, (
                f"{_node_named(node)} keeps legs ({' '.join(alone)}) that only its query side holds, heads"
                " that no factor over the keys has; write the scores as a statement over all head legs"
            )
        if tuple(graph.legs[leg].size for leg in legs) != sizes:
            return None, (
                f"{_node_named(node)} has head legs ({' '.join(legs)}) of other sizes than those"
                f" ({' '.join(first_legs)}) of {_node_named(first)}"
            )
    return sizes, ""


def call_mask_refusals(
    graph: DesignGraph, name: str, query: str = "n", key: str = "m"
) -> tuple[str, tuple | None, str]:
    """Why a float mask cannot be added to the design's scores (CallMaskError's message), or ""
    where every node the mask reaches is a softmax box; the sizes of the head legs of the nodes
    the mask reaches (`node_heads`), where every one has head legs of the same sizes (a mask per
    head is then taken, float where the nodes are softmax boxes, else bool), else None; and then
    why not, naming the node. Builds no graph."""
    reached: list[Reached] = []
    refusal = ""
    try:
        _rewritten(graph, name, query, key, True, reached)
    except CallMaskError as error:
        refusal, reached = str(error), []
        _rewritten(graph, name, query, key, False, reached)
    sizes, why = _heads_of(graph, reached)
    return refusal, sizes, why


def with_call_mask(
    graph: DesignGraph, name: str, query: str = "n", key: str = "m", per_head: bool = False
) -> DesignGraph:
    """The design with a boolean mask input `name[query key]` (True = attend) wherever
    with_causal_mask puts causal(query, key); `name[heads query key]` per head, over each
    node's head legs (`node_heads`)."""
    return _with(graph, name, query, key, bias=False, per_head=per_head)


def with_call_bias(
    graph: DesignGraph, name: str, query: str = "n", key: str = "m", per_head: bool = False
) -> DesignGraph:
    """The design with a float input `name[query key]` (`name[heads query key]` per head, over
    each box's head legs) added after the scale to the scores of every softmax box that
    with_causal_mask would mask; CallMaskError where the attention is not a softmax box."""
    return _with(graph, name, query, key, bias=True, per_head=per_head)
