"""The footprint rules of the tensor ops (ops.py): what each allocates, copies and saves for
backward as torch runs it. Elementwise results keep their operands' memory order; reductions,
softmax and matmul results are contiguous; torch.matmul folds batch legs (copying where that is no
view) and bmm loops over matrices neither row- nor column-major; each autograd node saves what its
backward reads (SAVES_INPUT, SAVES_RESULT). A sum over short innermost rows is recorded for the
time model (row_extent)."""

from __future__ import annotations

import math

import sympy

from .abstract import BOOL, CACHE_LINE, FLOAT, LONG, AbstractMachine, Meta
from .footprint_rules import rule
from .program import (
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
    Step,
    SumAxes,
)
from .strides import contiguous, padded, view_strides

SAVES_INPUT = {
    "log",
    "clamp",
    "maximum",
    "minimum",
    "pow",
    "elu1",
    "softplus",
    "silu",
    "gelu",
    "sin",
    "cos",
    "abs",
}  # autograd keeps the input
SAVES_RESULT = {"exp", "relu", "sigmoid", "tanh", "sqrt"}  # ... or its result

# A sum whose rows (the entries summed into one) are the innermost axes in memory and fewer than
# this runs below the bandwidth on a CPU, paying per row (measured on torch 2.13's CPU build, one
# thread, 8 MB summed: 1.8 GB/s over rows of 2, 4.5 of 4, 6.3 of 8, 13 of 16, 19 of 32, 27 from 64
# on; over an outer axis of 2, 13 GB/s): the time model prices it (timing.py `short_rows_factor`).
SHORT_ROW = 32


def row_extent(shape: tuple[int, ...], strides: tuple[int, ...], dims: tuple[int, ...]) -> int:
    """The entries of each row a sum over `dims` adds up, where those axes are the innermost in
    memory (unit stride, all below every kept axis) and hold fewer than SHORT_ROW entries; else 0."""
    summed = [d for d in dims if shape[d] > 1]
    kept = [d for d in range(len(shape)) if d not in dims and shape[d] > 1]
    extent = math.prod(shape[d] for d in summed)
    if not summed or extent >= SHORT_ROW or min(strides[d] for d in summed) != 1:
        return 0
    if kept and max(strides[d] for d in summed) >= min(strides[d] for d in kept):
        return 0
    return extent


@rule(Reshape)
def _reshape(machine: AbstractMachine, op: Reshape, step: Step) -> Meta:
    return machine.reshape(machine.value(op.x), machine.output(step)[0], op.x.var)


@rule(Scale)
def _scale(machine: AbstractMachine, op: Scale, step: Step) -> Meta:
    x = machine.value(op.x)
    return machine.like(x.shape, [x], x.numel, x.grad, step.out.var)  # type: ignore[union-attr]


@rule(SumAxes)
def _sum_axes(machine: AbstractMachine, op: SumAxes, step: Step) -> Meta:
    x = machine.value(op.x)
    shape, numel = machine.output(step)
    short_rows(machine, x, op.dims)
    return machine.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]


def short_rows(machine: AbstractMachine, x: Meta, dims: tuple[int, ...]) -> None:
    """Records a sum over short innermost rows of `x` (`row_extent`) for the time model."""
    extent = row_extent(x.shape, x.strides, dims)
    if extent:
        machine.record.short_rows = extent
        machine.record.short_bytes = x.numel * FLOAT * sympy.Rational(extent + 1, extent)  # read, and the sums written


@rule(Matmul)
def _matmul(machine: AbstractMachine, op: Matmul, step: Step) -> Meta:
    a, b = machine.read(op.a), machine.read(op.b)
    shape, numel = machine.output(step)
    if op.matvec:  # codegen's _matvec keeps its operands as given
        if b.grad:
            machine.save(a)
        if a.grad:
            machine.save(b)
        return machine.fresh(shape, numel, a.grad or b.grad, step.out.var)  # type: ignore[union-attr]
    transposed = matmul(machine, a, b)
    if transposed:  # (bᵀ aᵀ)ᵀ comes back transposed; torch copies it contiguous
        machine.record.copies += numel
        machine.record.moved += 2 * numel * FLOAT
    grad = a.grad or b.grad
    if op.bias is not None:  # addmm saves what mm saves; its bias's gradient needs nothing saved
        grad = grad or machine.read(op.bias).grad
    return machine.fresh(shape, numel, grad, step.out.var)  # type: ignore[union-attr]


def matmul(machine: AbstractMachine, a: Meta, b: Meta) -> bool:
    """torch.matmul: a batched operand beside a matrix is folded into a matrix (copied when
    the matrix needs a gradient and the fold is no view), else both go to bmm as 3-D (copied
    where the batch legs do not merge); each operand is saved when the other needs a gradient.
    True when a matrix times a batched operand ran as (bᵀ aᵀ)ᵀ, whose result torch copies."""
    a, b = _matrix_if_unit_batch(a, b), _matrix_if_unit_batch(b, a)
    da, db = len(a.shape), len(b.shape)
    transposed = False
    if da >= 3 and db <= 2:
        folded = (math.prod(a.shape[:-1]), a.shape[-1])
        if b.grad or view_strides(a.shape, a.strides, folded) is not None:
            a = machine.reshape(a, folded, "matmul operand")
    elif db >= 3 and da <= 2:
        t = Meta(
            (*b.shape[:-2], b.shape[-1], b.shape[-2]),
            (*b.strides[:-2], b.strides[-1], b.strides[-2]),
            b.storage,
            b.grad,
            b.numel,
        )
        folded = (math.prod(t.shape[:-1]), t.shape[-1])
        if a.grad or view_strides(t.shape, t.strides, folded) is not None:
            b = machine.reshape(t, folded, "matmul operand")
            transposed = True
    elif da >= 3 and db >= 3:
        batch = tuple(
            max(x, y)
            for x, y in zip(padded(a.shape[:-2], b.shape[:-2]), padded(b.shape[:-2], a.shape[:-2]), strict=True)
        )
        a, b = _broadcast_batch(a, batch), _broadcast_batch(b, batch)  # torch.matmul expands, then folds
        a = machine.reshape(a, (math.prod(a.shape[:-2]), *a.shape[-2:]), "matmul operand")
        b = machine.reshape(b, (math.prod(b.shape[:-2]), *b.shape[-2:]), "matmul operand")
        if bmm_loops(a, b):
            machine.record.looped += a.shape[0]
            for m in (a, b):
                if not _blas_ready(m):
                    machine.record.copies += m.numel
                    machine.record.moved += m.numel * (CACHE_LINE + FLOAT)
    if b.grad:
        machine.save(a)
    if a.grad:
        machine.save(b)
    return transposed


@rule(Multiply)
def _multiply(machine: AbstractMachine, op: Multiply, step: Step) -> Meta:
    a, b = machine.read(op.a), machine.read(op.b)
    full = tuple(max(x, y) for x, y in zip(padded(a.shape, b.shape), padded(b.shape, a.shape), strict=True))
    shape, out_numel = machine.output(step)
    numel = out_numel if not op.summed else sympy.Integer(math.prod(full))
    if op.a == op.b:
        product = machine.like(full, [a], numel, a.grad, "square")
        if a.grad:
            machine.save(a)
    else:
        product = machine.like(full, [a, b], numel, a.grad or b.grad, step.out.var)  # type: ignore[union-attr]
        if b.grad:
            machine.save(a)
        if a.grad:
            machine.save(b)
    if not op.summed:
        return Meta(shape, product.strides, product.storage, product.grad, out_numel)
    short_rows(machine, product, op.summed)
    return machine.fresh(shape, out_numel, product.grad, step.out.var)  # type: ignore[union-attr]


@rule(Einsum)
def _einsum(machine: AbstractMachine, op: Einsum, step: Step) -> Meta:
    operands = [machine.value(v) for v in op.operands]
    for k, m in enumerate(operands):
        if any(o.grad for j, o in enumerate(operands) if j != k):
            machine.save(m)
    shape, numel = machine.output(step)
    return machine.fresh(shape, numel, any(m.grad for m in operands), step.out.var)  # type: ignore[union-attr]


@rule(MaskFill)
def _mask_fill(machine: AbstractMachine, op: MaskFill, step: Step) -> Meta:
    x, mask = machine.value(op.x), machine.read(op.mask)
    if x.grad:
        machine.save(mask)
    return machine.fresh(x.shape, x.numel, x.grad, step.out.var)  # type: ignore[union-attr]


@rule(Softmax)
def _softmax(machine: AbstractMachine, op: Softmax, step: Step) -> Meta:
    x = machine.read(op.x)
    if op.sink is not None:  # _sink_softmax: the scores and the sinks concatenated, a copy
        return sink_softmax(machine, x, op, step)
    if x.strides != contiguous(x.shape):
        machine.record.copies += x.numel
        machine.record.moved += 2 * x.numel * FLOAT
    out = machine.fresh(x.shape, x.numel, x.grad, step.out.var)  # type: ignore[union-attr]
    if x.grad:
        machine.save(out)
    return out


def sink_softmax(machine: AbstractMachine, x: Meta, op: Softmax, step: Step) -> Meta:
    """torch.cat([x, sink], -1).softmax(-1)[..., :-1]: the scores copied beside one sink
    column, softmaxed (autograd keeps that softmax), the sink's column dropped (a view)."""
    width = sympy.Mul(*x.shape[len(x.shape) - op.count :])
    rows = x.numel / width
    machine.record.copies += x.numel
    machine.record.moved += 2 * x.numel * FLOAT
    joined = machine.fresh((*x.shape[: len(x.shape) - op.count], width + 1), x.numel + rows, x.grad, "scores and sinks")
    if x.grad:
        machine.save(joined)
    strides = (*joined.strides[:-1], *contiguous(x.shape[len(x.shape) - op.count :]))
    return Meta(x.shape, strides, joined.storage, joined.grad, x.numel)


@rule(Normalize)
def _normalize(machine: AbstractMachine, op: Normalize, step: Step) -> Meta:
    x = machine.read(op.x)
    kept = x.shape[: len(x.shape) - op.count]
    rows = x.numel / sympy.Mul(*trailing(machine, step, op.count))
    total = machine.fresh((*kept, *[1] * op.count), rows, x.grad, "normalizer")
    if op.guard:
        total = guarded(machine, total)
    if x.grad:
        machine.save(x, total)
    return machine.like(x.shape, [x, total], x.numel, x.grad, step.out.var)  # type: ignore[union-attr]


def guarded(machine: AbstractMachine, total: Meta) -> Meta:
    """`_nonzero(total)`, total.masked_fill(total == 0, 1): masked_fill keeps its boolean mask
    when total needs a gradient; the filled total is a new tensor."""
    zero = machine.like(total.shape, [total], total.numel, False, "zero denominators", BOOL)
    if total.grad:
        machine.save(zero)
    return machine.like(total.shape, [total], total.numel, total.grad, "denominator, zeros read as 1")


def trailing(machine: AbstractMachine, step: Step, count: int) -> list[sympy.Expr]:
    return [machine.plan.leg_sizes[leg] for leg in step.out.legs[len(step.out.legs) - count :]]  # type: ignore[union-attr]


@rule(Expand)
def _expand(machine: AbstractMachine, op: Expand, step: Step) -> Meta:
    x = machine.value(op.x)
    shape, numel = machine.output(step)
    return Meta(shape, (*x.strides, *[0] * len(op.sizes)), x.storage, x.grad, numel)


@rule(Materialize)
def _materialize(machine: AbstractMachine, op: Materialize, step: Step) -> Meta:
    x = machine.read(op.x)
    shape, numel = machine.output(step)
    return machine.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]


@rule(Map)
def _map(machine: AbstractMachine, op: Map, step: Step) -> Meta:
    x = machine.value(op.x)
    out = machine.like(x.shape, [x], x.numel, x.grad, step.out.var)  # type: ignore[union-attr]
    if op.name == "elu1":
        machine.allocate(x.numel, "elu before + 1")
    if x.grad and op.name in SAVES_INPUT:
        machine.save(x)
    if x.grad and op.name in SAVES_RESULT:
        machine.save(out)
    return out


@rule(LayerNorm)
def _layer_norm(machine: AbstractMachine, op: LayerNorm, step: Step) -> Meta:
    """layer_norm reads x contiguous (a copy otherwise) and keeps x, its rows' mean and
    reciprocal standard deviation for backward."""
    x = machine.read(op.x)
    if x.strides != contiguous(x.shape):
        machine.record.copies += x.numel
        machine.record.moved += 2 * x.numel * FLOAT
    out = machine.fresh(x.shape, x.numel, x.grad, step.out.var)  # type: ignore[union-attr]
    if x.grad:
        rows = x.shape[: len(x.shape) - len(op.shape)]
        count = x.numel / sympy.Mul(*op.shape)
        machine.save(x)
        machine.save(machine.fresh((*rows, 1), count, False, "layer norm mean"))
        machine.save(machine.fresh((*rows, 1), count, False, "layer norm reciprocal deviation"))
    return out


@rule(Reduce)
def _reduce(machine: AbstractMachine, op: Reduce, step: Step) -> Meta:
    x = machine.value(op.x)
    shape, numel = machine.output(step)
    if op.hidden:  # Σ x / count: the count is kept for the division's backward
        machine.fresh(x.shape, sympy.Integer(math.prod(x.shape)), False, "visible entries", BOOL)
        machine.fresh(shape, numel, False, "sum of x")
        count = machine.fresh(shape, numel, False, "visible count", LONG)
        if x.grad:
            machine.save(count)
    if not op.hidden:
        short_rows(machine, x, op.dims)
    out = machine.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]
    if x.grad and op.method in ("amax", "logsumexp"):
        machine.save(x, out)
    return out


@rule(Elementwise)
def _elementwise(machine: AbstractMachine, op: Elementwise, step: Step) -> Meta:
    shape, numel = machine.output(step)
    out = tree_meta(machine, op.tree, shape, numel, step.out.var)  # type: ignore[union-attr]
    if op.negate:
        out = machine.like(shape, [out], numel, out.grad, step.out.var)  # type: ignore[union-attr]
    return out


def tree_meta(
    machine: AbstractMachine, tree: Binary | Operand, shape: tuple[int, ...], numel: sympy.Expr, what: str
) -> Meta:
    if isinstance(tree, Operand):
        return machine.read(tree)
    left, right = tree_meta(machine, tree.left, shape, numel, what), tree_meta(machine, tree.right, shape, numel, what)
    here = tuple(max(a, b) for a, b in zip(padded(left.shape, shape), padded(right.shape, shape), strict=True))
    size = numel if here == shape else sympy.Integer(math.prod(here))
    out = machine.like(here, [left, right], size, left.grad or right.grad, what)
    if tree.op == "/":
        if right.grad:
            machine.save(left)
        if left.grad or right.grad:
            machine.save(right)
    return out


@rule(Ratio)
def _ratio(machine: AbstractMachine, op: Ratio, step: Step) -> Meta:
    numerator, denominator = machine.value(op.numerator), machine.read(op.denominator)
    numel = machine.value(op.denominator.value).numel
    if op.column is not None:  # views of the one [values, denominator] result
        numerator, denominator = columns(machine, numerator, op.column)
        numel = denominator.numel
    if op.guard:
        plus = guarded(
            machine, Meta(denominator.shape, denominator.strides, denominator.storage, denominator.grad, numel)
        )
    else:
        plus = machine.like(denominator.shape, [denominator], numel, denominator.grad, "denominator + eps")
    if plus.grad:
        machine.save(numerator)
    if numerator.grad or plus.grad:
        machine.save(plus)
    return machine.like(numerator.shape, [numerator, plus], numerator.numel, numerator.grad or plus.grad, "ratio")


def columns(machine: AbstractMachine, m: Meta, axis: int) -> tuple[Meta, Meta]:
    """The views m[..., :-1] and m[..., -1:] along `axis`."""
    width = m.shape[axis]
    metas = []
    for kept in (width - 1, 1):
        shape = (*m.shape[:axis], kept, *m.shape[axis + 1 :])
        metas.append(Meta(shape, m.strides, m.storage, m.grad, m.numel * kept / width))
    return metas[0], metas[1]


@rule(OnesColumn)
def _ones_column(machine: AbstractMachine, op: OnesColumn, step: Step) -> Meta:
    x = machine.value(op.x)  # constant padding saves nothing for backward
    shape, numel = machine.output(step)
    return machine.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]


@rule(CumulativeScan)
def _cumulative_scan(machine: AbstractMachine, op: CumulativeScan, step: Step) -> Meta:
    """torch.cumsum saves nothing for backward (its gradient is the reverse cumsum),
    logcumsumexp its input and result, cummax the index of each running max; a reverse scan
    flips its input and its result (two copies), an exclusive one concatenates the empty sum
    before the shifted result."""
    x = machine.value(op.x)
    source = machine.fresh(x.shape, x.numel, x.grad, "flipped input") if op.reverse else x
    if op.reverse:
        machine.record.copies += x.numel
    scanned = machine.fresh(x.shape, x.numel, x.grad, step.out.var if not (op.reverse or op.exclusive) else "scan")  # type: ignore[union-attr]
    if x.grad and op.method == "logcumsumexp":
        machine.save(source, scanned)
    if x.grad and op.method == "cummax":
        machine.save(machine.fresh(x.shape, x.numel, False, "cummax indices", itemsize=8))  # int64
    if op.reverse:
        machine.record.copies += x.numel
        scanned = machine.fresh(x.shape, x.numel, x.grad, step.out.var if not op.exclusive else "flipped scan")  # type: ignore[union-attr]
    if op.exclusive:
        machine.record.copies += x.numel
        scanned = machine.fresh(x.shape, x.numel, x.grad, step.out.var)  # type: ignore[union-attr]
    return scanned


@rule(Convolve)
def _convolve(machine: AbstractMachine, op: Convolve, step: Step) -> Meta:
    """The operand padded (a copy), then the convolution's result; for backward torch keeps
    the padded input and the kernel."""
    x = machine.value(op.x)
    shape, numel = machine.output(step)
    sizes = [machine.plan.leg_sizes[leg] for leg in op.x.legs]
    widths = dict(zip(op.dims, op.pads, strict=True))
    padded_numel = sympy.Mul(*(size + sum(widths[d]) if d in widths else size for d, size in enumerate(sizes)))
    padded_shape = tuple(n + int(sum(widths[d])) if d in widths else n for d, n in enumerate(x.shape))
    padded = machine.fresh(padded_shape, padded_numel, x.grad, "padded")
    machine.record.copies += padded_numel
    if x.grad:
        machine.save(padded)
    return machine.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]


@rule(SegmentSums)
def _segment_sums(machine: AbstractMachine, op: SegmentSums, step: Step) -> Meta:
    """_segsum: the boolean k > m triangle and its negation, the repeated operand zeroed
    below (masked_fill saves its mask), its cumsum (saves nothing), the −inf fill above the
    diagonal (saves the triangle it reads transposed)."""
    x = machine.value(op.x)
    shape, numel = machine.output(step)
    square = machine.numel(step.out.legs[-2:])  # type: ignore[union-attr]
    after = machine.fresh(shape[-2:], square, False, "k > m", BOOL)
    before = machine.fresh(shape[-2:], square, False, "k <= m", BOOL)
    machine.fresh(shape, numel, x.grad, "repeated, zeroed")
    machine.fresh(shape, numel, x.grad, "running sums")
    out = machine.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]
    if x.grad:
        machine.save(before, after)
    return out


@rule(Concat)
def _concat(machine: AbstractMachine, op: Concat, step: Step) -> Meta:
    parts = [machine.read(part) for part in op.parts]  # torch.cat saves no operand
    shape, numel = machine.output(step)
    return machine.fresh(shape, numel, any(p.grad for p in parts), step.out.var)  # type: ignore[union-attr]


@rule(Fill)
def _fill(machine: AbstractMachine, op: Fill, step: Step) -> Meta:
    return machine.fresh((), sympy.Integer(1), False, step.out.var)  # type: ignore[union-attr]


@rule(MaskNumbers)
def _mask_numbers(machine: AbstractMachine, op: MaskNumbers, step: Step) -> Meta:
    machine.read(op.mask)
    shape, numel = machine.output(step)
    return machine.fresh(shape, numel, False, step.out.var)  # type: ignore[union-attr]


@rule(Positions)
def _positions(machine: AbstractMachine, op: Positions, step: Step) -> Meta:
    shape, numel = machine.output(step)
    return machine.fresh(shape, numel, False, step.out.var)  # type: ignore[union-attr]


@rule(PositionTensor)
def _position_tensor(machine: AbstractMachine, op: PositionTensor, step: Step) -> Meta:
    shape, numel = machine.output(step)
    return machine.fresh(shape, numel, False, step.out.var, LONG)  # type: ignore[union-attr]


@rule(Slice)
def _slice(machine: AbstractMachine, op: Slice, step: Step) -> Meta:
    """A view of the stored table: its strides are the whole table's (a range of a middle
    axis does not merge with the axis before it, so a matmul that folds them copies)."""
    x = machine.value(op.x)
    shape, numel = machine.output(step)
    whole = list(shape)
    for k, _, size in op.dims:
        whole[k] = size
    return Meta(
        shape,
        x.strides[: len(shape)] if len(x.strides) >= len(shape) else contiguous(tuple(whole)),
        x.storage,
        x.grad,
        numel,
    )


@rule(SplitTable)
def _split_table(machine: AbstractMachine, op: SplitTable, step: Step) -> Meta:
    return machine.value(op.x)  # views of the table; each piece is read by a Slice


@rule(GatherAt)
def _gather_at(machine: AbstractMachine, op: GatherAt, step: Step) -> Meta:
    x = machine.read(op.x)
    if not op.index.legs:  # a read at one number (a fused QKV's j = H): a view, nothing saved
        shape, numel = machine.output(step)
        strides = x.strides
        if len(strides) != len(shape) + 1:  # a stored table named without its legs: contiguous
            strides = contiguous(tuple(machine.integer(a.size) for a in machine.g.tensors[op.x.value.var].axes))
        machine.record.moved = sympy.Integer(0)
        return Meta(shape, tuple(s for k, s in enumerate(strides) if k != op.dim), x.storage, x.grad, numel)
    index = machine.value(op.index)
    if x.grad:
        machine.save(index)
    shape, numel = machine.output(step)
    return machine.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]


@rule(LiteralCombination)
def _literal_combination(machine: AbstractMachine, op: LiteralCombination, step: Step) -> Meta:
    x = machine.value(op.x)  # slices are views; negations and numbers times slices save nothing
    shape, numel = machine.output(step)
    return machine.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]


@rule(Permute)
def _permute(machine: AbstractMachine, op: Permute, step: Step) -> Meta:
    x = machine.value(op.x)
    p = op.permutation
    return Meta(tuple(x.shape[d] for d in p), tuple(x.strides[d] for d in p), x.storage, x.grad, x.numel)


@rule(BufferUpdate)
def _buffer_update(machine: AbstractMachine, op: BufferUpdate, step: Step) -> None:
    return None


def _broadcast_batch(m: Meta, batch: tuple[int, ...]) -> Meta:
    """A batched matmul operand expanded to the common batch shape (stride 0 where it broadcasts);
    folding it then copies every expanded entry."""
    shape = (*batch, *m.shape[-2:])
    if shape == m.shape:
        return m
    lead = len(batch) - (len(m.shape) - 2)
    strides = [0] * lead + list(m.strides)
    for k, (have, want) in enumerate(zip((1,) * lead + m.shape[:-2], batch, strict=True)):
        if have == 1 and want != 1:
            strides[k] = 0
    return Meta(shape, tuple(strides), m.storage, m.grad, sympy.Integer(math.prod(shape)))


# torch's CPU bmm below this many multiply-adds per matrix runs its own loop over the entries
# (ATen LinearAlgebra.cpp `bmm_out_or_baddbmm_`), whatever the strides.
SMALL_MATRIX = 400


def _blas_ready(m: Meta) -> bool:
    """The matrices of a 3-D bmm operand are row- or column-major, as BLAS takes them (ATen's
    `batch_items_contiguous_or_transposed`; a unit axis's stride does not matter)."""
    _, rows, cols = m.shape
    _, row_stride, col_stride = m.strides
    return (col_stride == 1 and (rows == 1 or row_stride >= cols)) or (
        row_stride == 1 and (cols == 1 or col_stride >= rows)
    )


def bmm_loops(a: Meta, b: Meta) -> bool:
    """torch's CPU bmm multiplies matrix by matrix, one addmm each, when an operand's matrices
    are neither row- nor column-major (and are not small): each such matrix is then copied to a
    contiguous one, entry by entry from its own cache line. A layout that puts a long leg on the
    batch axis and the matrix legs far apart (a mixing of heads over chunked scores) costs this."""
    _, rows, inner = a.shape
    return inner * rows * b.shape[-1] >= SMALL_MATRIX and not (_blas_ready(a) and _blas_ready(b))


def _matrix_if_unit_batch(m: Meta, other: Meta) -> Meta:
    """torch.matmul treats a 3-D operand whose batch axis is 1 as a matrix (a 4-D one with unit
    batch axes beside a 4-D batched operand is expanded for bmm instead, measured with torch
    2.13: the head mix `w[:, None, :, :] @ A.reshape(1, B, C, N*N)` copies no score)."""
    if (len(m.shape) == 3 or len(other.shape) <= 2) and all(size == 1 for size in m.shape[:-2]):
        return Meta(m.shape[-2:], m.strides[-2:], m.storage, m.grad, m.numel)
    return m
