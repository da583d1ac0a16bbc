"""Constant folding: identity constants merge the legs they join, fills and all-ones become a
coefficient, so THSA with C = I_H ⊗ J_D costs what MHSA costs (Tuformer Prop. 1); a
sub-expression of numbers, sizes and such constants (`1 + exp(-S)`'s 1, `log(N)`, `1e-5`) is a
number, computed once as a 0-dim tensor that broadcasts wherever it is added.
Guarantees: no all-ones tensor reaches an op, nor an identity whose legs can merge without
repeating a leg on another factor; a leg that only folded constants carry and that is summed
multiplies the coefficient by its size (Σ_g J[f g] = G)."""

from __future__ import annotations

import sympy

from ..ir import (
    Contraction,
    ElementwiseMap,
    Expr,
    Quotient,
    Reduction,
    Scalar,
    SoftmaxBox,
    SumNode,
    TensorRef,
)
from .context import Leaf, Lowering
from .program import Fill, Step, Value

# Each map as a function of a sympy number (the same definitions the reference evaluates).
SCALAR_MAPS = {
    "exp": sympy.exp,
    "log": sympy.log,
    "relu": lambda x: sympy.Max(x, 0),
    "elu1": lambda x: sympy.Piecewise((x + 1, x > 0), (sympy.exp(x), True)),
    "sigmoid": lambda x: 1 / (1 + sympy.exp(-x)),
    "tanh": sympy.tanh,
    "softplus": lambda x: sympy.log(1 + sympy.exp(x)),
    "silu": lambda x: x / (1 + sympy.exp(-x)),
    "gelu": lambda x: x / 2 * (1 + sympy.erf(x / sympy.sqrt(2))),
    "sin": sympy.sin,
    "cos": sympy.cos,
    "sqrt": sympy.sqrt,
    "abs": sympy.Abs,
}


def fold_constants(ctx: Lowering, leaves: list[Leaf], out: tuple[str, ...], coefficient: sympy.Expr):
    """Identity constants merge the legs they join; fills, all-ones and constant leaves
    become a coefficient, times the size of each leg that only they carried and that is summed.
    An identity is kept as a factor where merging its legs would repeat a leg on another
    factor (δ[n m] P[n m] summed over both is the trace of P, not P[m m] summed twice)."""
    renamed, folded_out, folded = _fold_constants(ctx, leaves, out, coefficient, fold_identities=True)
    if any(len(set(leaf.legs)) < len(leaf.legs) for leaf in renamed):
        return _fold_constants(ctx, leaves, out, coefficient, fold_identities=False)
    return renamed, folded_out, folded


def _fold_constants(ctx, leaves: list[Leaf], out: tuple[str, ...], coefficient: sympy.Expr, fold_identities: bool):
    parent: dict[str, str] = {}

    def find(leg: str, links: dict[str, str] = parent) -> str:
        while links.get(leg, leg) != leg:
            leg = links[leg]
        return leg

    def is_identity(leaf: Leaf) -> bool:
        return (
            leaf.tensor is not None
            and leaf.tensor.kind == "const"
            and leaf.tensor.init is not None
            and (leaf.tensor.init.name == "identity")
        )

    kept: list[Leaf] = []
    folded_legs: set[str] = set()
    for k, leaf in enumerate(leaves):
        if leaf.constant is not None:
            coefficient *= leaf.constant
            folded_legs |= set(leaf.legs)
            continue
        tensor = leaf.tensor
        if tensor is None or tensor.kind != "const" or tensor.init is None:
            kept.append(leaf)
            continue
        init = tensor.init
        if init.name in ("ones", "zeros", "fill"):
            value = {"ones": sympy.Integer(1), "zeros": sympy.Integer(0)}.get(init.name)
            coefficient *= value if value is not None else sympy.sympify(init.param("value"))
            folded_legs |= set(leaf.legs)
            continue
        roots = {find(leg) for leg in leaf.legs}
        if fold_identities and init.name == "identity" and len([r for r in roots if r in out]) <= 1:
            anchor = next((r for r in roots if r in out), sorted(roots)[0])
            trial = {**parent, **{root: anchor for root in roots}}
            others = [*kept, *(other for other in leaves[k + 1 :] if not is_identity(other))]
            if all(
                len({find(leg, trial) for leg in other.legs}) == len(other.legs)
                for other in others
                if other.constant is None
            ):
                coefficient *= sympy.sympify(init.param("scale", sympy.Integer(1)))
                parent.update(trial)
                folded_legs |= set(leaf.legs)
                continue
        kept.append(leaf)
    renamed = [
        Leaf(
            tuple(find(leg) for leg in leaf.legs),
            leaf.tensor,
            leaf.value,
            tuple(tuple(find(leg) for leg in a) for a in leaf.view),
            leaf.box,
            decay=None
            if leaf.decay is None
            else (leaf.decay[0], {k: tuple(find(p) for p in v) for k, v in leaf.decay[1].items()}),
            triangle=None if leaf.triangle is None else (find(leaf.triangle[0]), find(leaf.triangle[1])),
        )
        for leaf in kept
    ]
    out = tuple(find(leg) for leg in out)
    carried = {leg for leaf in renamed for leg in leaf.legs} | set(out)
    for leg in {find(leg) for leg in folded_legs} - carried:
        coefficient *= ctx.size(leg)
    return renamed, out, coefficient


def constant_value(ctx: Lowering, e: Expr) -> sympy.Expr | None:
    """The number `e` is at every index when it reads no input, parameter, buffer or noise
    (a formula in sizes, e.g. log(N)); None when it varies or reads a stored tensor."""
    if isinstance(e, Scalar):
        return e.value
    if isinstance(e, TensorRef):
        tensor = ctx.g.tensors[e.name]
        if tensor.statement is not None:
            return constant_value(ctx, tensor.statement.expr) if tensor.is_constant else None
        if tensor.kind != "const" or tensor.init is None or tensor.init.name not in ("ones", "zeros", "fill"):
            return None
        return {"ones": sympy.Integer(1), "zeros": sympy.Integer(0)}.get(
            tensor.init.name, sympy.sympify(tensor.init.param("value"))
        )
    if isinstance(e, Contraction):
        values = [constant_value(ctx, f) for f in e.factors]
        if any(v is None for v in values):
            return None
        sizes = [ctx.g.legs[leg].size for leg in e.summed]
        return e.coefficient * sympy.Mul(*values) * sympy.Mul(*sizes)
    if isinstance(e, SumNode):
        values = [constant_value(ctx, t) for t in e.terms]
        if any(v is None for v in values):
            return None
        return sympy.Add(*(s * v for s, v in zip(e.signs, values, strict=True)))
    if isinstance(e, Quotient):
        a, b = constant_value(ctx, e.numerator), constant_value(ctx, e.denominator)  # type: ignore[arg-type]
        return None if a is None or b is None else a / b
    if isinstance(e, ElementwiseMap):
        x = constant_value(ctx, e.operand)  # type: ignore[arg-type]
        if x is None:
            return None
        if e.name == "pow":
            return x ** e.params[0]
        if e.name == "clamp":
            return sympy.Min(sympy.Max(x, e.params[0]), e.params[1])
        if e.name in ("maximum", "minimum"):
            return (sympy.Max if e.name == "maximum" else sympy.Min)(x, e.params[0])
        return SCALAR_MAPS[e.name](x)
    if isinstance(e, Reduction) and not e.masks:
        x = constant_value(ctx, e.operand)  # type: ignore[arg-type]
        if x is None:
            return None
        if e.name == "logsumexp":
            return x + sympy.log(sympy.Mul(*(ctx.g.legs[leg].size for leg in e.over)))
        return x
    if isinstance(e, SoftmaxBox) and not e.masks and e.sink is None:
        x = constant_value(ctx, e.content)  # type: ignore[arg-type]
        if x is None:
            return None
        count = sympy.Mul(*(ctx.g.legs[leg].size for leg in e.normalized))
        return 1 / count if e.is_exp else x / (x * count + e.eps)
    return None


def fill(ctx: Lowering, value: sympy.Expr, legs: tuple[str, ...], var: str | None) -> Value:
    """A constant as a 0-dim tensor (one per number per program: `1` and a size Lo = 1 are one
    step), broadcast along `legs`."""
    value = sympy.sympify(value)
    key = ("fill", ctx.runtime(value))
    if key not in ctx.memo:
        inputs = [t.name for t in ctx.g.inputs]
        like = ctx.input_vars[inputs[0]] if inputs else None
        name = ctx.names.fresh(var or "constant")
        ctx.memo[key] = (
            ctx.emit(Step("constant", Fill(ctx.runtime(value), like), Value(name, ()), f"constant {value}")),
            (),
        )
    stored, _ = ctx.memo[key]
    return Value(stored.var, (), frozenset(legs))
