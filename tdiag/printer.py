"""Expressions printed back as `.td` text: `tdiag show`'s statements, the diagram's statement
panels (render.py), codegen's comments and error messages all name a node by how it is written.
Reads the IR only, so every stage above the language may use it."""

from __future__ import annotations

from .ir import (
    CausalFactor,
    CausalMask,
    Contraction,
    Convolution,
    ElementwiseMap,
    Expr,
    Gather,
    PaddingMask,
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
)


def format_groups(groups: tuple[tuple[str, ...], ...]) -> str:
    """`h (r d) n`: a tensor's axes as legs, a merged axis in parentheses."""
    return " ".join(g[0] if len(g) == 1 else "(" + " ".join(g) + ")" for g in groups)


def _sliced_groups(ref: TensorRef) -> str:
    """`h, r: 0..R, f` or `h, n: N, m: N`: the axes of a table read in slices, as written."""
    parts = []
    for k, (group, extent) in enumerate(zip(ref.groups, ref.slices, strict=True)):
        start = ref.offset(k)
        cut = "" if extent is None else f": {extent}" if start == 0 else f": {start}..{start + extent}"
        parts.append(format_groups((group,)) + cut)
    return ", ".join(parts)


def format_mask(mask: CausalMask | WindowMask | PaddingMask) -> str:
    """A mask as its `.td` option: `causal(n, m)`, `window(n, m, W)` or the padding tensor."""
    if isinstance(mask, PaddingMask):
        return f"{mask.tensor.name}[{' '.join(mask.tensor.legs)}]"
    if isinstance(mask, WindowMask):
        return str(mask)
    return f"causal({mask.query}, {mask.key})"


def format_expr(e: Expr) -> str:
    """An expression node as `.td`-like text (for show, codegen comments and errors)."""
    if isinstance(e, TensorRef) and e.is_sliced:
        return f"{e.name}[{_sliced_groups(e)}]"
    if isinstance(e, TensorRef):
        return f"{e.name}[{format_groups(e.groups)}]"
    if isinstance(e, Scalar):
        return str(e.value)
    if isinstance(e, Contraction):
        text = " ".join(_wrap(f) for f in e.factors)
        if e.coefficient == 1:
            return text
        coefficient = str(e.coefficient)
        if not (e.coefficient.is_Atom or e.coefficient.is_Pow):
            coefficient = f"({coefficient})"
        return f"{coefficient} * {text}"
    if isinstance(e, SumNode):
        parts = [
            ("- " if s < 0 else ("+ " if i else "")) + format_expr(t)
            for i, (t, s) in enumerate(zip(e.terms, e.signs, strict=True))
        ]
        return " ".join(parts)
    if isinstance(e, Quotient):
        return f"{_wrap(e.numerator)} / {_wrap(e.denominator)}"  # type: ignore[arg-type]
    if isinstance(e, SoftmaxBox):
        sink = f", sink = {format_expr(e.sink)}" if e.sink is not None else ""
        return f"{e.box_name}[{' '.join(e.normalized)}{sink}]({format_expr(e.content)})"  # type: ignore[arg-type]
    if isinstance(e, ElementwiseMap):
        if e.name == "pow":
            return f"{_wrap(e.operand)} ^ {e.params[0]}"  # type: ignore[arg-type]
        params = "".join(f", {p}" for p in e.params)
        name = {"maximum": "max", "minimum": "min"}.get(e.name, e.name)
        return f"{name}({format_expr(e.operand)}{params})"  # type: ignore[arg-type]
    if isinstance(e, Reduction):
        masks = "".join(f", mask = {format_mask(m)}" for m in e.masks)
        return f"{e.name}[{' '.join(e.over)}{masks}]({format_expr(e.operand)})"  # type: ignore[arg-type]
    if isinstance(e, Scan):
        flags = "".join(f", {word} = 1" for word, flag in (("exclusive", e.exclusive), ("reverse", e.reverse)) if flag)
        masks = "".join(f", mask = {format_mask(m)}" for m in e.masks)
        return f"{e.name}[{e.along}{flags}{masks}]({format_expr(e.operand)})"  # type: ignore[arg-type]
    if isinstance(e, SegmentSum):
        return f"segsum[{e.along}, {e.key}]({format_expr(e.operand)})"  # type: ignore[arg-type]
    if isinstance(e, Convolution):
        options = [f"{s.leg} = {s.source()}" for s in e.shifts] + [f"mask = {format_mask(m)}" for m in e.masks]
        return f"conv[{', '.join(options)}]({format_expr(e.operand)}, {format_expr(e.kernel)})"  # type: ignore[arg-type]
    if isinstance(e, CausalFactor):
        return f"causal({e.query}, {e.key})"
    if isinstance(e, WindowFactor):
        return str(e.mask)
    if isinstance(e, SquaredDistance):
        return f"sqdist[{' '.join(e.over)}]({format_expr(e.left)}, {format_expr(e.right)})"  # type: ignore[arg-type]
    if isinstance(e, PositionIndex):
        return f"index({e.leg})"
    if isinstance(e, Gather) and e.source is not None:
        legs = [f"{leg} = {e.position}" if leg == e.axis else leg for leg in e.source.legs]
        return f"{e.source.name}[{', '.join(legs)}]"
    return type(e).__name__


def _wrap(e: Expr) -> str:
    text = format_expr(e)
    return f"({text})" if isinstance(e, SumNode | Quotient | Contraction) else text
