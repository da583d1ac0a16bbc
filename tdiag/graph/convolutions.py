"""`conv[n = n - i, m = m - j + P, mask = causal(n, m)](S[h n m], theta[h i j])`: a zero-padded
convolution of a computed tensor along its position legs (Multi-Token Attention's key-query
convolution, docs/language.md "Convolutions"). Each option `leg = leg ± offset + start` shifts one
position leg of the argument by a leg of the kernel (a fixed width); the kernel's other legs are
legs of the argument (a kernel per head); masks zero hidden entries before the shift."""

from __future__ import annotations

from typing import TYPE_CHECKING

import sympy

from .. import parse as syn
from ..errors import did_you_mean
from ..ir import Convolution, Expr, Mask, Shift, TensorRef, walk
from .sizes import expand_sizes, size_symbol, size_values
from .syntax import available_legs

if TYPE_CHECKING:
    from .calls import BoxesAndMaps

USAGE = "conv[n = n - i, m = m - j + P](S[h n m], theta[h i j])"
MAX_SHIFTS = 3  # one torch.nn.functional.conv1d, conv2d or conv3d call


def convolution(builder: BoxesAndMaps, e: syn.Call, keep: set[str]) -> Expr:
    """The Convolution node of `e`, or a poisoned stand-in after reporting every mistake at its
    position: a shift of a leg the argument lacks or of a feature leg, a shift that is not
    `leg ± offset + whole number or size`, an offset leg the kernel lacks or that is a position
    or a leg of the argument, a kernel leg that is neither an offset nor a leg of the argument
    (the kernel's legs are never summed inside the conv), a kernel that reads an input."""
    b = builder.b
    if e.legs:
        b.error(
            "conv names its shifted legs as options, not as legs",
            e.legs[0].span,
            hint=f"write each shift as leg = leg - offset: {USAGE}",
        )
    if e.keywords or len(e.args) != 2:
        b.error(f"conv takes two arguments, the tensor it shifts and the kernel, got {len(e.args)}", e.span, hint=USAGE)
        return builder.poison(e)
    shifts = [o for o in e.options if o.name != "mask"]
    if not shifts:
        b.error("conv needs at least one shifted leg", e.name_span, hint=USAGE)
        return builder.poison(e)
    if len(shifts) > MAX_SHIFTS:
        b.error(
            f"conv shifts at most {MAX_SHIFTS} legs (torch's conv1d, conv2d, conv3d), got {len(shifts)}",
            shifts[MAX_SHIFTS].span,
            hint="convolve in two steps: conv[...](conv[...](S, theta1), theta2)",
        )
        return builder.poison(e)
    mask_legs = {leg for o in e.options if o.name == "mask" for leg in _names(o.value) if leg not in b.sizes}
    operand = builder.inside(e.args[0], keep | {o.name for o in shifts} | mask_legs)
    offsets = {leg for o in shifts for leg in _names(o.value)} - {o.name for o in shifts} - set(b.sizes)
    kernel = builder.inside(e.args[1], set(operand.legs) | offsets | available_legs(e.args[1], b.tensors))
    built: list[Shift] = []
    ok = True
    for option in shifts:
        shift = _shift(builder, option, operand, kernel, built)
        ok = ok and shift is not None
        if shift is not None:
            built.append(shift)
    taps = {s.offset for s in built}
    for leg in kernel.legs:
        if leg not in taps and leg not in operand.legs and ok:
            b.error(
                f"the conv kernel's leg '{leg}' is neither a shift's offset nor a leg of the argument",
                e.args[1].span,
                hint=f"the kernel has the offset legs and legs the argument shares (a kernel per head): {USAGE}",
            )
            ok = False
    batched = _batched_tensor(builder, kernel)
    if batched is not None and ok:
        b.error(
            f"the conv kernel reads {batched}, which differs per sequence: a kernel is one for every sequence",
            e.args[1].span,
            hint="make the kernel of parameters and constants (param theta[h: H, i: CQ, j: CK])",
        )
        ok = False
    masks: list[Mask] = []
    for option in e.options:
        if option.name == "mask":
            mask = builder.mask_option(option.value, operand, "conv")
            if mask is not None:
                masks.append(mask)
    if not ok:
        return builder.poison(e)
    node = Convolution(operand.legs, e.span, operand, kernel, tuple(built), tuple(masks))
    return builder.restrict(node, keep, e.span)


def _shift(
    builder: BoxesAndMaps, option: syn.Option, operand: Expr, kernel: Expr, earlier: list[Shift]
) -> Shift | None:
    """One option `n = n - i + c` as a Shift, or None after reporting why it is not one."""
    b = builder.b
    leg = option.name
    if leg not in operand.legs:
        b.error(
            f"conv shifts leg '{leg}', which its argument does not have",
            option.span,
            hint=did_you_mean(leg, operand.legs) or f"its legs are: {', '.join(operand.legs) or 'none'}",
        )
        return None
    if any(s.leg == leg for s in earlier):
        b.error(f"conv shifts leg '{leg}' twice", option.span, hint="one option per shifted leg")
        return None
    known = b.legs.get(leg)
    if known is not None and not known.size.free_symbols & b.runtime_sizes:
        b.error(
            f"conv shifts along a position leg, but '{leg}' has the fixed size {known.size}",
            option.span,
            hint="shift a leg whose size is a run-time length such as N (size N); mix a feature leg with a product",
        )
        return None
    linear = _linear(builder, option.value)
    if linear is None:
        return None
    coefficients, start = linear
    offsets = {name: c for name, c in coefficients.items() if name != leg and c != 0}
    if coefficients.get(leg, 0) != 1 or len(offsets) != 1 or abs(next(iter(offsets.values()))) != 1:
        b.error(
            f"a shift of leg '{leg}' reads {leg} plus or minus one offset leg of the kernel and a whole number or size",
            option.value.span,
            hint=f"e.g. {leg} = {leg} - i (the i-th earlier position) or {leg} = {leg} - j + P (centred)",
        )
        return None
    ((offset, sign),) = offsets.items()
    if offset in operand.legs:
        b.error(
            f"the shift's offset leg '{offset}' is a leg of the argument too",
            option.value.span,
            hint="name the kernel's offset legs apart from the argument's legs",
        )
        return None
    if offset not in kernel.legs:
        b.error(
            f"the shift's offset leg '{offset}' is not a leg of the conv kernel",
            option.value.span,
            hint=f"the kernel carries one leg per shift: {USAGE}",
        )
        return None
    size = b.legs[offset].size if offset in b.legs else None
    if size is not None and size.free_symbols & b.runtime_sizes:
        b.error(
            f"the shift's offset leg '{offset}' has the run-time size {size}: a kernel has a fixed width",
            option.value.span,
            hint="declare the kernel over a fixed size, e.g. param theta[h: H, i: CQ, j: CK]",
        )
        return None
    known = expand_sizes(start, b.sizes).xreplace({size_symbol(k): v for k, v in size_values(b.sizes).items()})
    if not known.free_symbols and not known.is_integer:
        b.error(
            f"a shift moves by whole positions, but {sympy.sstr(sympy.factor(start))} is {known}",
            option.value.span,
            hint="a kernel of odd width W centres on (W - 1) / 2",
        )
        return None
    return Shift(leg, offset, sign, start)


def _batched_tensor(builder: BoxesAndMaps, kernel: Expr) -> str | None:
    """The input, mask or noise the kernel depends on (directly or through statements), if any."""
    tensors = builder.b.tensors
    for node in walk(kernel):
        if isinstance(node, TensorRef) and node.name in tensors:
            tensor = tensors[node.name]
            if tensor.is_batched:
                return f"{tensor.kind} {tensor.name}"
            if tensor.statement is not None:
                found = _batched_tensor(builder, tensor.statement.expr)
                if found is not None:
                    return found
    return None


def _linear(builder: BoxesAndMaps, e: syn.Expr) -> tuple[dict[str, int], sympy.Expr] | None:
    """`e` as Σ coefficient·leg + start, over legs and whole numbers or sizes with + and −."""
    b = builder.b
    if isinstance(e, syn.Number):
        return {}, sympy.sympify(e.value)
    if isinstance(e, syn.Name) and e.name in b.sizes:
        return {}, b.scalar_of(e, sizes_only=True)
    if isinstance(e, syn.Name):
        return {e.name: 1}, sympy.Integer(0)
    if isinstance(e, syn.Neg):
        inner = _linear(builder, e.operand)
        return None if inner is None else ({k: -v for k, v in inner[0].items()}, -inner[1])
    if isinstance(e, syn.BinOp) and e.op in ("+", "-"):
        left, right = _linear(builder, e.left), _linear(builder, e.right)
        if left is None or right is None:
            return None
        sign = 1 if e.op == "+" else -1
        merged = dict(left[0])
        for k, v in right[0].items():
            merged[k] = merged.get(k, 0) + sign * v
        return merged, left[1] + sign * right[1]
    if isinstance(e, syn.BinOp | syn.Call) and not _names(e) - set(b.sizes):
        return {}, b.scalar_of(e, sizes_only=True)
    b.error(
        "a shift is written with legs, whole numbers and sizes joined by + and -",
        e.span,
        hint=f"e.g. {USAGE}",
    )
    return None


def _names(e: syn.Expr) -> set[str]:
    """The bare names in an option's value (legs and sizes)."""
    if isinstance(e, syn.Name):
        return {e.name}
    if isinstance(e, syn.Neg):
        return _names(e.operand)
    if isinstance(e, syn.BinOp):
        return _names(e.left) | _names(e.right)
    if isinstance(e, syn.Call):
        return set().union(*(_names(a) for a in e.args)) if e.args else set()
    return set()
