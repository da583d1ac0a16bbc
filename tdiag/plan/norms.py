"""Layer normalization as one kernel: a design's LayerNorm / GroupNorm written out as
`C = Z − mean[g](Z)` then `C (mean[g](C ^ 2) + eps) ^ -0.5` (BERT's output norm, RetNet's and
GLA's per-head GroupNorm) is found in the graph the planner is given and lowered to
`torch.nn.functional.layer_norm` over the normalized legs, one pass forward and one backward
where the written form takes eight elementwise passes each way. Any other factor of the product
stays a factor, except a weight over exactly the normalized legs, and a bias over them added to
the product, which the kernel applies (nn.LayerNorm's affine map); `C` is dropped where nothing
else reads it. Only the
planner's copy of the graph changes: show, render and the reference evaluator see the design as
written, and the lowered program (cost, codegen) the fused step."""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, ClassVar

import sympy

from ..graph.dataflow import dataflow_graph
from ..graph.position_rules import plain
from ..ir import ONE, Contraction, ElementwiseMap, Expr, Reduction, Scalar, SumNode, TensorRef, map_children, walk
from .boxes import expand_broadcast
from .context import Lowering
from .program import LayerNorm, Operand, Step, Value, align, show_legs

if TYPE_CHECKING:
    from ..graph import DesignGraph
    from ..ir import Statement


@dataclass(frozen=True)
class LayerNormNode(Expr):
    """(Z − mean_over(Z)) / sqrt(mean_over((Z − mean_over(Z))²) + eps), the planner's reading
    of a written-out layer norm of `operand` over its legs `over`."""

    operand: Expr | None = None
    over: tuple[str, ...] = ()
    eps: sympy.Expr = ONE
    weight: TensorRef | None = None  # times a tensor over exactly the normalized legs
    bias: TensorRef | None = None  # then plus one
    kind: ClassVar[str] = "layer_norm"

    def children(self) -> tuple[Expr, ...]:
        return tuple(e for e in (self.operand, self.weight, self.bias) if e is not None)


# The planner's graph reaches the position tables (codegen asks hides_the_future of it): a norm over
# feature legs takes no mask, hides nothing and mixes no positions.
plain(LayerNormNode)


def fuse_layer_norms(graph: DesignGraph) -> DesignGraph:
    """`graph` with every written-out layer norm read as a `LayerNormNode`, the centred
    statements nothing reads any more dropped; `graph` itself where there is none."""
    statements = [dataclasses.replace(s, expr=_rewritten(s.expr, graph)) for s in graph.statements]
    if all(new.expr is old.expr for new, old in zip(statements, graph.statements, strict=True)):
        return graph
    uses = _uses(statements, graph)
    kept = [s for s in statements if uses[s.target] or s.target in graph.outputs]
    tensors = {name: dataclasses.replace(t) for name, t in graph.tensors.items()}
    for statement in kept:
        tensors[statement.target].statement = statement
    return dataclasses.replace(
        graph, tensors=tensors, statements=kept, graph=dataflow_graph(tensors, kept, graph.updates)
    )


def _uses(statements: list[Statement], graph: DesignGraph) -> Counter[str]:
    uses: Counter[str] = Counter()
    for e in [*(s.expr for s in statements), *(u.expr for u in graph.updates)]:
        uses.update(node.name for node in walk(e) if isinstance(node, TensorRef))
    return uses


def _rewritten(e: Expr, graph: DesignGraph) -> Expr:
    """`e` with each product holding a centred tensor times its inverse root mean square read as
    the layer norm of the tensor it centres, below and at `e`."""
    e = map_children(e, lambda child: _rewritten(child, graph))
    if isinstance(e, Contraction) and not e.summed:
        return _fused_product(e, graph)
    if isinstance(e, SumNode):
        return _fused_bias(e)
    return e


def _affine(e: Expr, norm: LayerNormNode) -> bool:
    """Is `e` a stored tensor over exactly the norm's legs `over`, each once (a weight or bias
    nn.LayerNorm would hold)?"""
    return (
        isinstance(e, TensorRef)
        and not (e.is_reshaped or e.is_sliced or e.offsets)
        and len(e.legs) == len(norm.over)
        and set(e.legs) == set(norm.over)
    )


def _fused_bias(e: SumNode) -> Expr:
    """A layer norm (with or without its weight) plus a bias over its legs: the bias applied by
    the kernel; the sum's other terms stay."""
    for k, term in enumerate(e.terms):
        if not (isinstance(term, LayerNormNode) and term.bias is None and e.signs[k] == 1):
            continue
        for j, other in enumerate(e.terms):
            if j != k and e.signs[j] == 1 and _affine(other, term):
                fused = dataclasses.replace(term, bias=other)
                rest = [(t, s) for i, (t, s) in enumerate(zip(e.terms, e.signs, strict=True)) if i not in (j, k)]
                if not rest:
                    return fused
                terms, signs = zip(*[(fused, 1), *rest], strict=True)
                return dataclasses.replace(e, terms=terms, signs=signs)
    return e


def _fused_product(e: Contraction, graph: DesignGraph) -> Expr:
    for k, factor in enumerate(e.factors):
        found = _inverse_rms(factor)
        if found is None:
            continue
        centred, over, eps = found
        for j, other in enumerate(e.factors):
            if j == k or other != dataclasses.replace(centred, span=other.span):
                continue
            norm = _layer_norm(centred, over, eps, graph)
            if norm is None:
                continue
            factors = [norm if i == j else f for i, f in enumerate(e.factors) if i != k]
            weights = [f for f in factors if f is not norm and _affine(f, norm)]
            if len(factors) == 2 and len(weights) == 1 and e.coefficient == 1:
                norm = dataclasses.replace(norm, weight=weights[0])
                factors = [norm]
            if len(factors) == 1 and e.coefficient == 1 and set(e.legs) == set(norm.legs):
                return norm
            return dataclasses.replace(e, factors=tuple(factors))
    return e


def _inverse_rms(e: Expr) -> tuple[TensorRef, tuple[str, ...], sympy.Expr] | None:
    """`(mean[over](C ^ 2) + eps) ^ -0.5` as (C, over, eps), eps a positive number."""
    if not (isinstance(e, ElementwiseMap) and e.name == "pow" and tuple(e.params) == (sympy.Rational(-1, 2),)):
        return None
    inner = e.operand
    if not (isinstance(inner, SumNode) and len(inner.terms) == 2 and tuple(inner.signs) == (1, 1)):
        return None
    means = [t for t in inner.terms if isinstance(t, Reduction)]
    numbers = [t for t in inner.terms if isinstance(t, Scalar)]
    if len(means) != 1 or len(numbers) != 1:
        return None
    (mean,), (eps,) = means, numbers
    eps_value = sympy.sympify(eps.value)
    if mean.name != "mean" or mean.masks or not (eps_value.is_number and eps_value > 0):
        return None
    square = mean.operand
    if not (isinstance(square, ElementwiseMap) and square.name == "pow" and tuple(square.params) == (2,)):
        return None
    centred = square.operand
    if not isinstance(centred, TensorRef) or centred.is_reshaped or centred.is_sliced or centred.offsets:
        return None
    return centred, tuple(mean.over), eps_value


def _layer_norm(centred: TensorRef, over: tuple[str, ...], eps: sympy.Expr, graph: DesignGraph) -> Expr | None:
    """The layer norm of Z over `over` where `centred` reads a statement `Z − mean[over](Z)`
    (its legs renamed as `centred` reads them), else None."""
    tensor = graph.tensors.get(centred.name)
    statement = tensor.statement if tensor is not None else None
    if statement is None or any(len(g) != 1 for g in statement.groups):
        return None
    expr = statement.expr
    if not (isinstance(expr, SumNode) and len(expr.terms) == 2 and tuple(expr.signs) == (1, -1)):
        return None
    whole, mean = expr.terms
    if not (isinstance(whole, TensorRef) and isinstance(mean, Reduction) and mean.name == "mean" and not mean.masks):
        return None
    if mean.operand != dataclasses.replace(whole, span=mean.operand.span) or whole.is_sliced or whole.offsets:  # type: ignore[union-attr]
        return None
    rename = dict(zip(statement.legs, centred.legs, strict=True))
    if {rename.get(leg) for leg in mean.over} != set(over) or not set(whole.legs) <= set(rename):
        return None
    operand = dataclasses.replace(
        whole,
        legs=tuple(rename[leg] for leg in whole.legs),
        groups=tuple(tuple(rename[leg] for leg in g) for g in whole.groups),
        span=centred.span,
    )
    return LayerNormNode(centred.legs, centred.span, operand, over, eps)


def lower_layer_norm(ctx: Lowering, e: LayerNormNode, ren, var: str | None) -> Value:
    """One layer_norm over the normalized legs, read last; the result keeps that order."""
    operand = ctx.lower(e.operand, ren)  # type: ignore[arg-type]
    operand = expand_broadcast(ctx, operand, set(operand.broadcast))
    over = [p for leg in e.over for p in ren[leg]]
    order = [leg for leg in operand.legs if leg not in over] + [leg for leg in operand.legs if leg in over]
    permutation = None if order == list(operand.legs) else tuple(operand.legs.index(leg) for leg in order)
    normalized = tuple(order[len(order) - len(over) :])
    affine = [align(ctx.lower(t, ren), normalized) if t is not None else None for t in (e.weight, e.bias)]
    name = ctx.names.fresh(var or "layer_norm")
    return ctx.emit(
        Step(
            "map",
            LayerNorm(Operand(operand, permutation), ctx.shape(over), ctx.runtime(e.eps), *affine),
            Value(name, tuple(order), operand.broadcast),
            f"layer norm over {' '.join(show_legs(over))}",
            elementwise=ctx.numel(order),
            inputs=(operand,),
        )
    )  # type: ignore[return-value]
