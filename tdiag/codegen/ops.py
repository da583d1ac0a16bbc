"""The printers of the tensor ops (plan/ops.py) as one Python expression each: contractions
(matmul, multiply, einsum), maps and reductions, scans and convolutions, masks and softmax or
normalize boxes as torch runs them, tables and positions. `op_code` dispatches on the op's type;
box_ops.py registers the printers of the lowered forms' ops on it."""

from __future__ import annotations

from collections.abc import Callable, Sequence
from functools import singledispatch

import sympy

from ..plan.program import (
    Binary,
    BufferUpdate,
    Concat,
    Convolve,
    CumulativeScan,
    Einsum,
    Elementwise,
    Expand,
    Fill,
    GatherAt,
    LayerNorm,
    LiteralCombination,
    Map,
    MaskFill,
    MaskNumbers,
    Materialize,
    Matmul,
    Multiply,
    Normalize,
    OnesColumn,
    Operand,
    Permute,
    Positions,
    PositionTensor,
    Ratio,
    Reduce,
    Reshape,
    Scale,
    SegmentSums,
    Slice,
    Softmax,
    SplitTable,
    SumAxes,
    Value,
)
from .state import WIDE_LIKE, WIDENED
from .text import dims_code, expr_code, scalar_code, sizes_code, source


def var_code(value: Value, attributes: frozenset[str]) -> str:
    name = source(value.var, "name")
    if name in attributes:
        return f"self.{name}"  # stored in the module's dtype
    return f"_wide({name}, {WIDE_LIKE.get()})" if value.var in WIDENED.get() else name


def read_code(operand: Operand, attributes: frozenset[str]) -> str:
    code = var_code(operand.value, attributes)
    if operand.invert:
        code = f"(~{code})"
    if operand.permutation is not None:
        code = f"{code}.permute({tuple(operand.permutation)})"
    if operand.shape is not None:
        code = f"{code}.reshape({', '.join(expr_code(s) for s in operand.shape)})"
    if operand.index is not None:
        code = f"{code}[{', '.join(':' if kept else 'None' for kept in operand.index)}]"
    return code


def _tree(tree: Binary | Operand, attributes: frozenset[str]) -> str:
    if isinstance(tree, Operand):
        return read_code(tree, attributes)
    return f"({_tree(tree.left, attributes)} {tree.op} {_tree(tree.right, attributes)})"


@singledispatch
def op_code(op: object, attributes: frozenset[str]) -> str:
    raise TypeError(f"no Python for {type(op).__name__}")


@op_code.register
def _(op: Reshape, attributes: frozenset[str]) -> str:
    return f"{var_code(op.x, attributes)}.reshape({sizes_code(op.shape)})"


@op_code.register
def _(op: Scale, attributes: frozenset[str]) -> str:
    return f"{var_code(op.x, attributes)} * {scalar_code(op.factor)}"


@op_code.register
def _(op: SumAxes, attributes: frozenset[str]) -> str:
    return f"{var_code(op.x, attributes)}.sum({dims_code(op.dims)})"


@op_code.register
def _(op: Matmul, attributes: frozenset[str]) -> str:
    if op.bias is not None:
        return _addmm(op, attributes)
    a, b = read_code(op.a, attributes), read_code(op.b, attributes)
    product = f"_matvec({a}, {b})" if op.matvec else f"{a} @ {b}"
    if op.shape is None:
        return product
    return f"({product}).reshape({sizes_code(op.shape) or '()'})"


def _addmm(op: Matmul, attributes: frozenset[str]) -> str:
    """A projection with a bias as nn.Linear runs it: one addmm over the rows of a (measured on
    CPU, fwd+bwd, one thread: a tie with F.linear, both faster than a matmul then an add)."""
    rows = read_code(op.a, attributes)
    rows = f"{rows}.flatten(0, -2)" if len(op.a.shape or op.a.value.legs) > 2 else rows
    product = f"torch.addmm({read_code(op.bias, attributes)}, {rows}, {read_code(op.b, attributes)})"  # type: ignore[arg-type]
    return f"{product}.reshape({sizes_code(op.shape)})"  # type: ignore[arg-type]


@op_code.register
def _(op: Multiply, attributes: frozenset[str]) -> str:
    a = read_code(op.a, attributes)
    product = f"{a}.square()" if op.a == op.b else f"{a} * {read_code(op.b, attributes)}"
    if not op.summed:
        return product
    if op.a != op.b:
        product = f"({product})"
    return f"{product}.sum({dims_code(op.summed)})"


@op_code.register
def _(op: Einsum, attributes: frozenset[str]) -> str:
    return f'torch.einsum("{op.equation}", {", ".join(var_code(v, attributes) for v in op.operands)})'


@op_code.register
def _(op: MaskFill, attributes: frozenset[str]) -> str:
    fill = {"lowest": f"torch.finfo({var_code(op.x, attributes)}.dtype).min", "-inf": 'float("-inf")', "zero": "0.0"}[
        op.fill
    ]
    return f"{var_code(op.x, attributes)}.masked_fill({read_code(op.mask, attributes)}, {fill})"


@op_code.register
def _(op: Softmax, attributes: frozenset[str]) -> str:
    code = read_code(op.x, attributes)
    if op.sink is not None:
        sink = read_code(op.sink, attributes)
        if op.count == 1:
            return f"_sink_softmax({code}, {sink})"
        return f"_sink_softmax({code}.flatten(-{op.count}), {sink}).unflatten(-1, ({sizes_code(op.normalized)}))"
    if op.count == 1:
        return f"{code}.softmax(-1)"
    return f"{code}.flatten(-{op.count}).softmax(-1).unflatten(-1, ({sizes_code(op.normalized)}))"


@op_code.register
def _(op: Normalize, attributes: frozenset[str]) -> str:
    code = read_code(op.x, attributes)
    dims = ", ".join(str(-1 - k) for k in range(op.count))
    if op.guard:
        return f"{code} / _nonzero({code}.sum(dim=({dims},), keepdim=True))"
    return f"{code} / ({code}.sum(dim=({dims},), keepdim=True) + {scalar_code(op.eps)})"


@op_code.register
def _(op: Expand, attributes: frozenset[str]) -> str:
    kept = len(op.x.legs)
    index = ", ".join([":"] * kept + ["None"] * len(op.sizes))
    shape = ", ".join(["-1"] * kept + [expr_code(size) for size in op.sizes])
    return f"{var_code(op.x, attributes)}[{index}].expand({shape})"


@op_code.register
def _(op: Materialize, attributes: frozenset[str]) -> str:
    return f"{read_code(op.x, attributes)}.expand({sizes_code(op.shape)}).contiguous()"


@op_code.register
def _(op: Map, attributes: frozenset[str]) -> str:
    return map_code(op.name, var_code(op.x, attributes), op.params)


def map_code(name: str, x: str, parameters: Sequence[sympy.Expr]) -> str:
    """Elementwise map `name` of the Python expression `x` (a variable or parenthesized)."""
    params = [_bound(p, x) if name in ("clamp", "maximum", "minimum") else scalar_code(p) for p in parameters]
    return {
        "exp": lambda: f"{x}.exp()",
        "log": lambda: f"{x}.log()",
        "relu": lambda: f"torch.relu({x})",
        "elu1": lambda: f"torch.nn.functional.elu({x}) + 1",
        "sigmoid": lambda: f"torch.sigmoid({x})",
        "tanh": lambda: f"torch.tanh({x})",
        "softplus": lambda: f"torch.nn.functional.softplus({x})",
        "silu": lambda: f"torch.nn.functional.silu({x})",
        "gelu": lambda: f"torch.nn.functional.gelu({x})",
        "sin": lambda: f"torch.sin({x})",
        "cos": lambda: f"torch.cos({x})",
        "sqrt": lambda: f"torch.sqrt({x})",
        "abs": lambda: f"torch.abs({x})",
        "clamp": lambda: f"{x}.clamp({', '.join(params)})",
        "maximum": lambda: f"{x}.clamp(min={params[0]})",
        "minimum": lambda: f"{x}.clamp(max={params[0]})",
        "pow": lambda: f"{x} ** {params[0] if params else 1}",
    }[name]()


HALF_MAX = 65504.0  # float16's largest finite number: a bound beyond it overflows a half tensor


def _bound(value: sympy.Expr, x: str) -> str:
    """A clamp bound as Python, taken into the dtype of `x` where float16 cannot hold it (mLSTM's
    clamp(|n·q|, 1, 1e15)): a finite x lies within its dtype's range, so the clamp is the same, and
    torch refuses a bound a half tensor cannot convert to."""
    code = scalar_code(value)
    if not value.is_number or abs(float(value)) <= HALF_MAX:
        return code
    return f"max({code}, torch.finfo({x}.dtype).min)" if value < 0 else f"min({code}, torch.finfo({x}.dtype).max)"


@op_code.register
def _(op: LayerNorm, attributes: frozenset[str]) -> str:
    shape = f"({sizes_code(op.shape)},)"
    affine = "".join(
        f", {name}={read_code(t, attributes)}"
        for name, t in (("weight", op.weight), ("bias", op.bias))
        if t is not None
    )
    return f"torch.nn.functional.layer_norm({read_code(op.x, attributes)}, {shape}{affine}, eps={scalar_code(op.eps)})"


@op_code.register
def _(op: Reduce, attributes: frozenset[str]) -> str:
    x = var_code(op.x, attributes)
    if op.hidden:
        visible = f"torch.broadcast_to(~{hidden_code(op.hidden, attributes)}, {x}.shape)"
        return f"{x}.sum(dim={dims_code(op.dims)}) / {visible}.sum(dim={dims_code(op.dims)}).clamp(min=1)"
    return f"{x}.{op.method}(dim={dims_code(op.dims)})"


@op_code.register
def _(op: CumulativeScan, attributes: frozenset[str]) -> str:
    x, dim = var_code(op.x, attributes), op.dim
    values = ".values" if op.method == "cummax" else ""  # torch.cummax returns (values, indices)
    if op.reverse:
        code = f"{x}.flip({dim}).{op.method}({dim}){values}.flip({dim})"
    else:
        code = f"{x}.{op.method}({dim}){values}"
    if not op.exclusive:
        return code
    empty = "0.0" if op.method == "cumsum" else "-torch.inf"
    return f"_shifted({code}, {dim}, {empty}{', reverse=True' if op.reverse else ''})"


@op_code.register
def _(op: Convolve, attributes: frozenset[str]) -> str:
    kernel = read_code(op.kernel, attributes)
    if op.flips:
        first = len(op.channels)
        kernel = f"{kernel}.flip({tuple(first + k for k in op.flips)})"
    pads = ", ".join(f"({expr_code(before)}, {expr_code(after)})" for before, after in op.pads)
    return f"_convolve({var_code(op.x, attributes)}, {kernel}, {op.dims}, {op.channels}, ({pads},))"


@op_code.register
def _(op: SegmentSums, attributes: frozenset[str]) -> str:
    x = var_code(op.x, attributes)
    last = len(op.x.legs) - 1
    return f"_segsum({x})" if op.dim == last else f"_segsum({x}.movedim({op.dim}, -1))"


@op_code.register
def _(op: Elementwise, attributes: frozenset[str]) -> str:
    code = _tree(op.tree, attributes)
    if isinstance(op.tree, Binary):
        code = code[1:-1]
    return f"-({code})" if op.negate else code


@op_code.register
def _(op: Ratio, attributes: frozenset[str]) -> str:
    numerator, denominator = var_code(op.numerator, attributes), read_code(op.denominator, attributes)
    if op.column is not None:
        stored = [leg for leg in op.numerator.legs if leg not in op.numerator.broadcast]
        lead = "..., " if op.column == len(stored) - 1 else ":, " * op.column
        numerator, denominator = f"{numerator}[{lead}:-1]", f"{numerator}[{lead}-1:]"
    if op.guard:
        return f"{numerator} / _nonzero({denominator})"
    return f"{numerator} / ({denominator} + {scalar_code(op.eps)})"


@op_code.register
def _(op: OnesColumn, attributes: frozenset[str]) -> str:
    pads = "0, 0, " * op.trailing + "0, 1"
    return f"torch.nn.functional.pad({var_code(op.x, attributes)}, ({pads}), value=1.0)"


@op_code.register
def _(op: Concat, attributes: frozenset[str]) -> str:
    return f"torch.cat([{', '.join(read_code(part, attributes) for part in op.parts)}], -1)"


@op_code.register
def _(op: Fill, attributes: frozenset[str]) -> str:
    like = f", dtype={op.like}.dtype, device={op.like}.device" if op.like else ""
    return f"torch.full((), {scalar_code(op.value)}{like})"


@op_code.register
def _(op: MaskNumbers, attributes: frozenset[str]) -> str:
    like = f"{op.like}.dtype" if op.like else "torch.get_default_dtype()"
    return f"{read_code(op.mask, attributes)}.to({like})"


@op_code.register
def _(op: Positions, attributes: frozenset[str]) -> str:
    # in a step run in float32 under autocast, the positions too: bfloat16 holds no whole number
    # above 256 exactly, so a bfloat16 input's index(n) would put Lightning's decays at wrong distances
    dtype = (
        f"_wide({op.like}, {WIDE_LIKE.get()}).dtype" if op.like and WIDE_LIKE.get() != "None" else f"{op.like}.dtype"
    )
    like = f", dtype={dtype}, device={op.like}.device" if op.like else ""
    total = expr_code(sympy.Mul(*op.shape))
    code = f"torch.arange({total}{like})"
    return code if len(op.shape) == 1 else f"{code}.reshape({sizes_code(op.shape)})"


def _position(position, legs: tuple[str, ...], sizes: tuple[sympy.Expr, ...], device: str) -> str:
    """An integer position as a torch expression broadcast over axes `legs`."""

    def axis(leg: str) -> str:
        k = legs.index(leg)
        shape = ", ".join("-1" if j == k else "1" for j in range(len(legs)))
        return f"torch.arange({expr_code(sizes[k])}, device={device}).reshape({shape}{',' if len(legs) == 1 else ''})"

    return integer_position(position, axis)


def integer_position(position, leg: Callable[[str], str]) -> str:
    """A Position (ir.py) as Python, each leg printed by `leg`: numbers, + - * /, negation,
    clamp, min, max, abs, floor, log. A part without legs is Python arithmetic on numbers and
    sizes (in double); a part with legs is int64, or float32 where real (an int64 part is
    converted with .float() first, as T5's `relative_position.float()`); floor(a / b) of whole
    parts is floor division."""
    return _position_code(position, leg)[0]


def _position_code(position, leg: Callable[[str], str]) -> tuple[str, bool]:
    """(Python, whether it is a tensor) for a position part."""
    op = position.op
    if op == "leg":
        return leg(position.name), True
    if op == "number":
        return scalar_code(position.value), False
    inner = position.operands[0]
    if op == "floor" and inner.op == "/" and not inner.is_real():
        a, b = (_position_code(o, leg)[0] for o in inner.operands)
        return f"({a} // {b})", bool(position.legs())
    parts = [_position_code(o, leg) for o in position.operands]
    codes = [code for code, _ in parts]
    if not position.legs():
        functions = {"log": "math.log", "floor": "math.floor", "abs": "abs", "min": "min", "max": "max"}
        if op in functions:
            return f"{functions[op]}({', '.join(codes)})", False
        if op == "clamp":
            return f"min(max({codes[0]}, {codes[1]}), {codes[2]})", False
        if op == "neg":
            return f"(-{codes[0]})", False
        return f"({codes[0]} {op} {codes[1]})", False
    if position.is_real():
        codes = [
            f"{code}.float()" if tensor and not o.is_real() else code
            for (code, tensor), o in zip(parts, position.operands, strict=True)
        ]
    if op == "neg":
        return f"(-{codes[0]})", True
    if op in ("abs", "log"):
        return f"torch.{op}({codes[0]})", True
    if op == "floor":
        return (f"torch.floor({codes[0]}).long()" if inner.is_real() else codes[0]), True
    if op == "clamp":
        return f"torch.clamp({', '.join(codes)})", True
    if op in ("min", "max"):
        if parts[0][1] and parts[1][1]:
            return f"torch.{'minimum' if op == 'min' else 'maximum'}({codes[0]}, {codes[1]})", True
        x, bound = (codes[0], codes[1]) if parts[0][1] else (codes[1], codes[0])
        return f"torch.clamp({x}, {'max' if op == 'min' else 'min'}={bound})", True
    return f"({codes[0]} {op} {codes[1]})", True


@op_code.register
def _(op: PositionTensor, attributes: frozenset[str]) -> str:
    device = f"{op.like}.device" if op.like else "None"
    return _position(op.position, op.legs, op.sizes, device)


@op_code.register
def _(op: Slice, attributes: frozenset[str]) -> str:
    if op.piece is not None:
        return f"{var_code(op.x, attributes)}[{op.piece}]"
    cuts = {k: (op.start(i), extent) for i, (k, extent, _) in enumerate(op.dims)}
    last = max(cuts)
    index = ", ".join(_cut(*cuts[k]) if k in cuts else ":" for k in range(last + 1))
    return f"{var_code(op.x, attributes)}[{index}]"


def _cut(start: sympy.Expr, extent: sympy.Expr) -> str:
    """`:N` for the first N entries, `a:a + N` from entry a: basic indexing, a view."""
    return f":{expr_code(extent)}" if start == 0 else f"{expr_code(start)}:{expr_code(start + extent)}"


@op_code.register
def _(op: SplitTable, attributes: frozenset[str]) -> str:
    sizes = ", ".join(expr_code(size) for size in op.sizes)
    return f"{var_code(op.x, attributes)}.split([{sizes}], {op.dim})"


@op_code.register
def _(op: GatherAt, attributes: frozenset[str]) -> str:
    return f"{read_code(op.x, attributes)}.movedim({op.dim}, -1)[..., {var_code(op.index, attributes)}]"


@op_code.register
def _(op: LiteralCombination, attributes: frozenset[str]) -> str:
    x = var_code(op.x, attributes)
    last = max(op.dims)

    def at(index: tuple[int, ...]) -> str:
        where = dict(zip(op.dims, index, strict=True))
        return f"{x}[{', '.join(str(where[k]) if k in where else ':' for k in range(last + 1))}]"

    slices = []
    for row in op.rows:
        code = ""
        for coefficient, index in row:
            sign, size = ("-", -coefficient) if coefficient < 0 else ("+", coefficient)
            term = at(index) if size == 1 else f"{scalar_code(size)} * {at(index)}"
            code = f"{sign}{term}" if not code and sign == "-" else term if not code else f"{code} {sign} {term}"
        slices.append(code or f"torch.zeros_like({at(tuple(0 for _ in op.dims))})")
    if not op.sizes:  # the constant keeps no leg (a selector E[t] = values(0, 1, 0)): one slice
        return slices[0]
    stacked = f"torch.stack([{', '.join(slices)}], -1)"
    return stacked if len(op.sizes) == 1 else f"{stacked}.unflatten(-1, {tuple(op.sizes)})"


@op_code.register
def _(op: Permute, attributes: frozenset[str]) -> str:
    return f"{var_code(op.x, attributes)}.permute({tuple(op.permutation)})"  # a tuple, empty for a scalar


@op_code.register
def _(op: BufferUpdate, attributes: frozenset[str]) -> str:
    x = var_code(op.x, attributes)
    mean = f"{x}.mean(0)" if op.x.is_batched else x
    return f"self.{source(op.target, 'name')}.copy_({mean}.reshape({sizes_code(op.shape)}))"


def hidden_code(hidden: tuple[Operand, ...], attributes: frozenset[str]) -> str:
    code = " | ".join(read_code(h, attributes) for h in hidden)
    return f"({code})" if len(hidden) > 1 else code
