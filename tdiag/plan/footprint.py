"""Memory footprint of a lowered program: which storages each op allocates, copies and saves for
the backward pass, found by running the program abstractly on shapes and strides (at the sizes it
runs at) with PyTorch's own rules: elementwise results keep their operands' memory order, reductions,
softmax and matmul results are contiguous, a reshape is a view exactly when torch's stride rule
allows it (else a copy), torch.matmul folds batch legs and saves the operands it multiplies, and
each autograd node saves what its backward reads (softmax and exp their result; log, pow, clamp,
elu their input; division both operands; masked_fill its mask; SDPA q, k, v, its output and the
log-sum-exp, or on the math fallback the whole attention; a boolean attn_mask converted to float).
The rules depend on the sizes the code runs at (a batch of one is a matrix to torch.matmul), so
the footprint is found at those sizes, not only at the ones planned for.

Input convention: the design's inputs need a gradient, as the input of a layer inside a network
does (tdiag.measure.INPUT_CONVENTION, which the measurement follows); their own storage is not
counted, as parameters' and buffers' is not.

Guarantees: `Footprint.saved` lists every activation storage autograd keeps after the forward
pass (parameters, buffers and inputs excluded), each once, with its size as a formula in the
design's sizes and B; `copies` the elements each step copies that the program does not show."""

from __future__ import annotations

import math
from collections.abc import Mapping
from functools import singledispatchmethod

import sympy

from .abstract import BOOL, CACHE_LINE, FLOAT, LONG, AbstractMachine, Footprint, Meta
from .program import (
    Attention,
    BandBlocks,
    BandMask,
    Binary,
    BlockMask,
    BufferUpdate,
    ChunkEdge,
    Concat,
    Convolve,
    CumulativeScan,
    DecayedPrefix,
    Einsum,
    Elementwise,
    Expand,
    Fill,
    FlexAttention,
    GatherAt,
    JoinChunks,
    LayerNorm,
    LiteralCombination,
    LiveRows,
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
    Plan,
    Positions,
    PositionTensor,
    PrefixSum,
    Ratio,
    Reduce,
    Reshape,
    Scale,
    ScoreMask,
    SegmentSums,
    Slice,
    Softmax,
    SplitChunks,
    SplitTable,
    Step,
    SumAxes,
    Triangle,
    VisibleMask,
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
# the loop of DecayedPrefix runs about seven small ops a chunk (two exps, two differences, two
# products and a sum) forward and as many backward: about twice a matmul loop's two per matrix
# (timing.LOOP_OVERHEADS), so many small chunks are priced by their ops, not only their bytes
DECAYED_PREFIX_LOOP = 4
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


class _Interpreter(AbstractMachine):
    """The op rules: what each op allocates, copies and saves."""

    @singledispatchmethod
    def op(self, op: object, step: Step) -> Meta | None:
        raise TypeError(f"no footprint rule for {type(op).__name__}")

    @op.register
    def _(self, op: Reshape, step: Step) -> Meta:
        return self.reshape(self.value(op.x), self.output(step)[0], op.x.var)

    @op.register
    def _(self, op: Scale, step: Step) -> Meta:
        x = self.value(op.x)
        return self.like(x.shape, [x], x.numel, x.grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: SumAxes, step: Step) -> Meta:
        x = self.value(op.x)
        shape, numel = self.output(step)
        self.short_rows(x, op.dims)
        return self.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]

    def short_rows(self, x: Meta, dims: tuple[int, ...]) -> None:
        """Records a sum over short innermost rows of `x` (`row_extent`) for the time model."""
        extent = row_extent(x.shape, x.strides, dims)
        if extent:
            self.record.short_rows = extent
            self.record.short_bytes = x.numel * FLOAT * sympy.Rational(extent + 1, extent)  # read, and the sums written

    @op.register
    def _(self, op: Matmul, step: Step) -> Meta:
        a, b = self.read(op.a), self.read(op.b)
        shape, numel = self.output(step)
        if op.matvec:  # codegen's _matvec keeps its operands as given
            if b.grad:
                self.save(a)
            if a.grad:
                self.save(b)
            return self.fresh(shape, numel, a.grad or b.grad, step.out.var)  # type: ignore[union-attr]
        transposed = self.matmul(a, b)
        if transposed:  # (bᵀ aᵀ)ᵀ comes back transposed; torch copies it contiguous
            self.record.copies += numel
            self.record.moved += 2 * numel * FLOAT
        grad = a.grad or b.grad
        if op.bias is not None:  # addmm saves what mm saves; its bias's gradient needs nothing saved
            grad = grad or self.read(op.bias).grad
        return self.fresh(shape, numel, grad, step.out.var)  # type: ignore[union-attr]

    def matmul(self, a: Meta, b: Meta) -> bool:
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
                a = self.reshape(a, folded, "matmul operand")
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
                b = self.reshape(t, folded, "matmul operand")
                transposed = True
        elif da >= 3 and db >= 3:
            batch = tuple(
                max(x, y)
                for x, y in zip(padded(a.shape[:-2], b.shape[:-2]), padded(b.shape[:-2], a.shape[:-2]), strict=True)
            )
            a, b = _broadcast_batch(a, batch), _broadcast_batch(b, batch)  # torch.matmul expands, then folds
            a = self.reshape(a, (math.prod(a.shape[:-2]), *a.shape[-2:]), "matmul operand")
            b = self.reshape(b, (math.prod(b.shape[:-2]), *b.shape[-2:]), "matmul operand")
            if _loops(a, b):
                self.record.looped += a.shape[0]
                for m in (a, b):
                    if not _blas_ready(m):
                        self.record.copies += m.numel
                        self.record.moved += m.numel * (CACHE_LINE + FLOAT)
        if b.grad:
            self.save(a)
        if a.grad:
            self.save(b)
        return transposed

    @op.register
    def _(self, op: Multiply, step: Step) -> Meta:
        a, b = self.read(op.a), self.read(op.b)
        full = tuple(max(x, y) for x, y in zip(padded(a.shape, b.shape), padded(b.shape, a.shape), strict=True))
        shape, out_numel = self.output(step)
        numel = out_numel if not op.summed else sympy.Integer(math.prod(full))
        if op.a == op.b:
            product = self.like(full, [a], numel, a.grad, "square")
            if a.grad:
                self.save(a)
        else:
            product = self.like(full, [a, b], numel, a.grad or b.grad, step.out.var)  # type: ignore[union-attr]
            if b.grad:
                self.save(a)
            if a.grad:
                self.save(b)
        if not op.summed:
            return Meta(shape, product.strides, product.storage, product.grad, out_numel)
        self.short_rows(product, op.summed)
        return self.fresh(shape, out_numel, product.grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: Einsum, step: Step) -> Meta:
        operands = [self.value(v) for v in op.operands]
        for k, m in enumerate(operands):
            if any(o.grad for j, o in enumerate(operands) if j != k):
                self.save(m)
        shape, numel = self.output(step)
        return self.fresh(shape, numel, any(m.grad for m in operands), step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: MaskFill, step: Step) -> Meta:
        x, mask = self.value(op.x), self.read(op.mask)
        if x.grad:
            self.save(mask)
        return self.fresh(x.shape, x.numel, x.grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: Softmax, step: Step) -> Meta:
        x = self.read(op.x)
        if op.sink is not None:  # _sink_softmax: the scores and the sinks concatenated, a copy
            return self.sink_softmax(x, op, step)
        if x.strides != contiguous(x.shape):
            self.record.copies += x.numel
            self.record.moved += 2 * x.numel * FLOAT
        out = self.fresh(x.shape, x.numel, x.grad, step.out.var)  # type: ignore[union-attr]
        if x.grad:
            self.save(out)
        return out

    def sink_softmax(self, x: Meta, op: Softmax, step: Step) -> Meta:
        """torch.cat([x, sink], -1).softmax(-1)[..., :-1]: the scores copied beside one sink
        column, softmaxed (autograd keeps that softmax), the sink's column dropped (a view)."""
        width = sympy.Mul(*x.shape[len(x.shape) - op.count :])
        rows = x.numel / width
        self.record.copies += x.numel
        self.record.moved += 2 * x.numel * FLOAT
        joined = self.fresh(
            (*x.shape[: len(x.shape) - op.count], width + 1), x.numel + rows, x.grad, "scores and sinks"
        )
        if x.grad:
            self.save(joined)
        strides = (*joined.strides[:-1], *contiguous(x.shape[len(x.shape) - op.count :]))
        return Meta(x.shape, strides, joined.storage, joined.grad, x.numel)

    @op.register
    def _(self, op: Normalize, step: Step) -> Meta:
        x = self.read(op.x)
        kept = x.shape[: len(x.shape) - op.count]
        rows = x.numel / sympy.Mul(*self.trailing(step, op.count))
        total = self.fresh((*kept, *[1] * op.count), rows, x.grad, "normalizer")
        if op.guard:
            total = self.guarded(total)
        if x.grad:
            self.save(x, total)
        return self.like(x.shape, [x, total], x.numel, x.grad, step.out.var)  # type: ignore[union-attr]

    def guarded(self, total: Meta) -> Meta:
        """`_nonzero(total)`, total.masked_fill(total == 0, 1): masked_fill keeps its boolean mask
        when total needs a gradient; the filled total is a new tensor."""
        zero = self.like(total.shape, [total], total.numel, False, "zero denominators", BOOL)
        if total.grad:
            self.save(zero)
        return self.like(total.shape, [total], total.numel, total.grad, "denominator, zeros read as 1")

    def trailing(self, step: Step, count: int) -> list[sympy.Expr]:
        return [self.plan.leg_sizes[leg] for leg in step.out.legs[len(step.out.legs) - count :]]  # type: ignore[union-attr]

    @op.register
    def _(self, op: Expand, step: Step) -> Meta:
        x = self.value(op.x)
        shape, numel = self.output(step)
        return Meta(shape, (*x.strides, *[0] * len(op.sizes)), x.storage, x.grad, numel)

    @op.register
    def _(self, op: Materialize, step: Step) -> Meta:
        x = self.read(op.x)
        shape, numel = self.output(step)
        return self.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: Map, step: Step) -> Meta:
        x = self.value(op.x)
        out = self.like(x.shape, [x], x.numel, x.grad, step.out.var)  # type: ignore[union-attr]
        if op.name == "elu1":
            self.allocate(x.numel, "elu before + 1")
        if x.grad and op.name in SAVES_INPUT:
            self.save(x)
        if x.grad and op.name in SAVES_RESULT:
            self.save(out)
        return out

    @op.register
    def _(self, op: LayerNorm, step: Step) -> Meta:
        """layer_norm reads x contiguous (a copy otherwise) and keeps x, its rows' mean and
        reciprocal standard deviation for backward."""
        x = self.read(op.x)
        if x.strides != contiguous(x.shape):
            self.record.copies += x.numel
            self.record.moved += 2 * x.numel * FLOAT
        out = self.fresh(x.shape, x.numel, x.grad, step.out.var)  # type: ignore[union-attr]
        if x.grad:
            rows = x.shape[: len(x.shape) - len(op.shape)]
            count = x.numel / sympy.Mul(*op.shape)
            self.save(x)
            self.save(self.fresh((*rows, 1), count, False, "layer norm mean"))
            self.save(self.fresh((*rows, 1), count, False, "layer norm reciprocal deviation"))
        return out

    @op.register
    def _(self, op: Reduce, step: Step) -> Meta:
        x = self.value(op.x)
        shape, numel = self.output(step)
        if op.hidden:  # Σ x / count: the count is kept for the division's backward
            self.fresh(x.shape, sympy.Integer(math.prod(x.shape)), False, "visible entries", BOOL)
            self.fresh(shape, numel, False, "sum of x")
            count = self.fresh(shape, numel, False, "visible count", LONG)
            if x.grad:
                self.save(count)
        if not op.hidden:
            self.short_rows(x, op.dims)
        out = self.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]
        if x.grad and op.method in ("amax", "logsumexp"):
            self.save(x, out)
        return out

    @op.register
    def _(self, op: Elementwise, step: Step) -> Meta:
        shape, numel = self.output(step)
        out = self.tree(op.tree, shape, numel, step.out.var)  # type: ignore[union-attr]
        if op.negate:
            out = self.like(shape, [out], numel, out.grad, step.out.var)  # type: ignore[union-attr]
        return out

    def tree(self, tree: Binary | Operand, shape: tuple[int, ...], numel: sympy.Expr, what: str) -> Meta:
        if isinstance(tree, Operand):
            return self.read(tree)
        left, right = self.tree(tree.left, shape, numel, what), self.tree(tree.right, shape, numel, what)
        here = tuple(max(a, b) for a, b in zip(padded(left.shape, shape), padded(right.shape, shape), strict=True))
        size = numel if here == shape else sympy.Integer(math.prod(here))
        out = self.like(here, [left, right], size, left.grad or right.grad, what)
        if tree.op == "/":
            if right.grad:
                self.save(left)
            if left.grad or right.grad:
                self.save(right)
        return out

    @op.register
    def _(self, op: Ratio, step: Step) -> Meta:
        numerator, denominator = self.value(op.numerator), self.read(op.denominator)
        numel = self.value(op.denominator.value).numel
        if op.column is not None:  # views of the one [values, denominator] result
            numerator, denominator = self.columns(numerator, op.column)
            numel = denominator.numel
        if op.guard:
            plus = self.guarded(
                Meta(denominator.shape, denominator.strides, denominator.storage, denominator.grad, numel)
            )
        else:
            plus = self.like(denominator.shape, [denominator], numel, denominator.grad, "denominator + eps")
        if plus.grad:
            self.save(numerator)
        if numerator.grad or plus.grad:
            self.save(plus)
        return self.like(numerator.shape, [numerator, plus], numerator.numel, numerator.grad or plus.grad, "ratio")

    def columns(self, m: Meta, axis: int) -> tuple[Meta, Meta]:
        """The views m[..., :-1] and m[..., -1:] along `axis`."""
        width = m.shape[axis]
        metas = []
        for kept in (width - 1, 1):
            shape = (*m.shape[:axis], kept, *m.shape[axis + 1 :])
            metas.append(Meta(shape, m.strides, m.storage, m.grad, m.numel * kept / width))
        return metas[0], metas[1]

    @op.register
    def _(self, op: OnesColumn, step: Step) -> Meta:
        x = self.value(op.x)  # constant padding saves nothing for backward
        shape, numel = self.output(step)
        return self.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: PrefixSum, step: Step) -> Meta:
        x = self.value(op.x)  # codegen's _earlier adds each chunk's state into its slice of the result
        return self.fresh(x.shape, x.numel, x.grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: CumulativeScan, step: Step) -> Meta:
        """torch.cumsum saves nothing for backward (its gradient is the reverse cumsum),
        logcumsumexp its input and result, cummax the index of each running max; a reverse scan
        flips its input and its result (two copies), an exclusive one concatenates the empty sum
        before the shifted result."""
        x = self.value(op.x)
        source = self.fresh(x.shape, x.numel, x.grad, "flipped input") if op.reverse else x
        if op.reverse:
            self.record.copies += x.numel
        scanned = self.fresh(x.shape, x.numel, x.grad, step.out.var if not (op.reverse or op.exclusive) else "scan")  # type: ignore[union-attr]
        if x.grad and op.method == "logcumsumexp":
            self.save(source, scanned)
        if x.grad and op.method == "cummax":
            self.save(self.fresh(x.shape, x.numel, False, "cummax indices", itemsize=8))  # int64
        if op.reverse:
            self.record.copies += x.numel
            scanned = self.fresh(x.shape, x.numel, x.grad, step.out.var if not op.exclusive else "flipped scan")  # type: ignore[union-attr]
        if op.exclusive:
            self.record.copies += x.numel
            scanned = self.fresh(x.shape, x.numel, x.grad, step.out.var)  # type: ignore[union-attr]
        return scanned

    @op.register
    def _(self, op: Convolve, step: Step) -> Meta:
        """The operand padded (a copy), then the convolution's result; for backward torch keeps
        the padded input and the kernel."""
        x = self.value(op.x)
        shape, numel = self.output(step)
        sizes = [self.plan.leg_sizes[leg] for leg in op.x.legs]
        widths = dict(zip(op.dims, op.pads, strict=True))
        padded_numel = sympy.Mul(*(size + sum(widths[d]) if d in widths else size for d, size in enumerate(sizes)))
        padded_shape = tuple(n + int(sum(widths[d])) if d in widths else n for d, n in enumerate(x.shape))
        padded = self.fresh(padded_shape, padded_numel, x.grad, "padded")
        self.record.copies += padded_numel
        if x.grad:
            self.save(padded)
        return self.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: SegmentSums, step: Step) -> Meta:
        """_segsum: the boolean k > m triangle and its negation, the repeated operand zeroed
        below (masked_fill saves its mask), its cumsum (saves nothing), the −inf fill above the
        diagonal (saves the triangle it reads transposed)."""
        x = self.value(op.x)
        shape, numel = self.output(step)
        square = self.numel(step.out.legs[-2:])  # type: ignore[union-attr]
        after = self.fresh(shape[-2:], square, False, "k > m", BOOL)
        before = self.fresh(shape[-2:], square, False, "k <= m", BOOL)
        self.fresh(shape, numel, x.grad, "repeated, zeroed")
        self.fresh(shape, numel, x.grad, "running sums")
        out = self.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]
        if x.grad:
            self.save(before, after)
        return out

    @op.register
    def _(self, op: Triangle, step: Step) -> Meta:
        return self.fresh((op.size, op.size), sympy.Integer(op.size**2), False, "triangle")

    @op.register
    def _(self, op: SplitChunks, step: Step) -> Meta:
        x = self.value(op.x)
        shape, numel = self.output(step)
        return self.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: BandBlocks, step: Step) -> Meta:
        """The padded copy, then the unfolded blocks copied contiguous."""
        x = self.value(op.x)
        shape, numel = self.output(step)
        self.fresh(x.shape, x.numel, x.grad, f"{op.x.var} padded")
        return self.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: BandMask, step: Step) -> Meta:
        shape, numel = self.output(step)
        return self.fresh(shape, numel, False, step.out.var, BOOL)  # type: ignore[union-attr]

    @op.register
    def _(self, op: ChunkEdge, step: Step) -> Meta:
        x = self.value(op.x)
        shape = x.shape[: op.axis] + x.shape[op.axis + 1 :]
        strides = x.strides[: op.axis] + x.strides[op.axis + 1 :]
        return Meta(shape, strides, x.storage, x.grad, self.output(step)[1])

    @op.register
    def _(self, op: DecayedPrefix, step: Step) -> Meta:
        """One carried state per chunk and its decayed copy, then the stack of them; the carried
        states are kept for backward where the decay needs a gradient (a product keeps a factor
        for the other's gradient), a decay of constants (RetNet's γ) keeps none of them."""
        x, start, end = self.value(op.x), self.read(op.start), self.read(op.end)
        grad = x.grad or start.grad or end.grad
        self.record.looped += DECAYED_PREFIX_LOOP * x.shape[op.axis]
        carried = self.fresh(x.shape, x.numel, grad, "carried states")
        self.fresh(x.shape, x.numel, grad, "decayed states")
        if start.grad or end.grad:
            self.save(carried)
        return self.fresh(x.shape, x.numel, grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: JoinChunks, step: Step) -> Meta:
        x = self.read(op.x)
        p = op.position
        flat = (*x.shape[:p], x.shape[p] * x.shape[p + 1], *x.shape[p + 2 :])
        joined = self.reshape(x, flat, op.x.value.var)
        shape, _ = self.output(step)
        return Meta(shape, joined.strides, joined.storage, joined.grad, joined.numel)

    @op.register
    def _(self, op: VisibleMask, step: Step) -> Meta:
        causal = self.read(op.causal)
        shape = tuple(self.integer(s) for s in op.sizes)
        numel = sympy.Mul(*op.sizes)
        self.record.copies += numel
        rows = self.integer(op.rows)
        return self.fresh((rows, math.prod(shape) // rows), numel, causal.grad, step.out.var, BOOL)  # type: ignore[union-attr]

    @op.register
    def _(self, op: ScoreMask, step: Step) -> Meta:
        hidden, bias = [self.read(h) for h in op.hidden], [self.read(b) for b in op.bias]
        future = self.read(op.future) if op.future is not None else None
        metas = [*hidden, *bias, *([future] if future is not None else [])]
        rank = max(len(m.shape) for m in metas)
        shape = tuple(max(d) for d in zip(*(padded(m.shape, (1,) * rank) for m in metas), strict=True))
        grad = any(b.grad for b in bias)
        if hidden and grad:  # torch.where(hidden, lowest, bias) keeps its condition
            rank = max(len(m.shape) for m in hidden)
            where = tuple(max(d) for d in zip(*(padded(m.shape, (1,) * rank) for m in hidden), strict=True))
            self.save(self.fresh(where, sympy.Integer(math.prod(where)), False, "hidden scores", BOOL))
        if future is not None and grad:  # torch.where(future, -inf, ...) keeps the triangle itself
            self.save(future)
        return self.fresh(shape, self.numel(step.out.legs), grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: LiveRows, step: Step) -> Meta:
        hidden = [self.read(h) for h in op.hidden]
        rank = max(len(m.shape) for m in hidden)
        shape = tuple(max(d) for d in zip(*(padded(m.shape, (1,) * rank) for m in hidden), strict=True))
        shape = (*shape[:-1], 1)
        return self.fresh(shape, sympy.Integer(math.prod(shape)), False, step.out.var, BOOL)  # type: ignore[union-attr]

    @op.register
    def _(self, op: Attention, step: Step) -> Meta:
        q, k, v = self.read(op.q), self.read(op.k), self.read(op.v)
        q_legs, k_legs, out_legs = op.q.value.legs, op.k.value.legs, step.out.legs  # type: ignore[union-attr]
        rows = self.numel(leg for leg in out_legs if leg in q_legs)  # heads and queries
        keys = self.numel(leg for leg in k_legs if leg in out_legs or leg not in q_legs)  # heads and keys
        latent = self.numel(leg for leg in q_legs if leg not in out_legs)
        features = self.numel(leg for leg in out_legs if leg not in q_legs)
        if op.bias is not None:
            latent += 1
            q = self.widened(q, 1, rows * latent, "q with a feature of ones")
            k = self.widened(k, 1, keys * latent, "k with the key bias")
        if op.pad_value and op.sink is None:  # beside a sink, padded with the sink key's row
            v = self.widened(v, op.pad_value, keys * (features + op.pad_value), "v padded")
        features += op.pad_value
        if op.pad_query_key:
            latent += op.pad_query_key
            q = self.widened(q, op.pad_query_key, rows * latent, "q padded")
            k = self.widened(k, op.pad_query_key, keys * latent, "k padded")
        if op.sink is not None:  # _sink_attention: a sink feature, a first key, a first query if causal
            latent += 1
            q = self.grown(q, 1 if op.causal else 0, 1, q.grad, "q with the sink feature")
            k = self.grown(k, 1, 1, k.grad, "k with the sink key")
            v = self.grown(v, 1, op.pad_value, v.grad, "v with the sink key's zero value")
        repeat = self.integer(op.repeat)
        if repeat != 1:  # q.repeat_interleave(R, dim=-2): a new q of R times the rows
            rows *= op.repeat
            q = self.fresh((*q.shape[:-2], q.shape[-2] * repeat, q.shape[-1]), rows * latent, q.grad, "q repeated")
        grad = q.grad or k.grad or v.grad
        shape = (*q.shape[:-1], v.shape[-1])
        mask = self.kernel_mask(self.value(op.mask)) if op.mask is not None else None
        flash = (
            len(q.shape) == len(k.shape) == len(v.shape) == 4
            and q.shape[-1] == k.shape[-1] == v.shape[-1]
            and all(m.strides[-1] == 1 for m in (q, k, v))
            and (mask is None or (not mask.grad and len(mask.shape) in (2, 4)))
        )
        self.record.kernel = "flash" if flash else "math: " + _math_reason(q, k, v, mask)
        if flash:  # the CPU flash kernel lays its output out as q is laid out (measured, torch 2.13)
            physical = (*sorted(range(3), key=lambda d: (-q.strides[d], d)), 3)
            out = self.fresh(tuple(shape[d] for d in physical), rows * features, grad, step.out.var)  # type: ignore[union-attr]
            out = Meta(shape, tuple(out.strides[physical.index(d)] for d in range(4)), out.storage, grad, out.numel)
            lse = self.fresh(shape[:-1], rows, False, "log-sum-exp")
            if grad:
                self.save(q, k, v, out, lse, *([mask] if mask is not None else []))
        else:
            entries = rows * self.numel(leg for leg in k_legs if leg not in q_legs)
            if op.grouped and k.shape[-3] != q.shape[-3]:  # the math kernel repeats k and v per query head
                repeats = q.shape[-3] // k.shape[-3]
                k = self.fresh((*k.shape[:-3], q.shape[-3], *k.shape[-2:]), k.numel * repeats, k.grad, "k repeated")
                v = self.fresh((*v.shape[:-3], q.shape[-3], *v.shape[-2:]), v.numel * repeats, v.grad, "v repeated")
            scaled_q = self.fresh(q.shape, q.numel, q.grad, "q scaled (math SDPA)")
            scaled_k = self.fresh(k.shape, k.numel, k.grad, "k scaled (math SDPA)")
            scores = q.grad or k.grad
            attention = self.fresh((*q.shape[:-1], k.shape[-2]), entries, scores, "attention (math SDPA)")
            out = self.fresh(shape, rows * features, grad, step.out.var)  # type: ignore[union-attr]
            if q.grad:
                self.save(scaled_k)
            if k.grad:
                self.save(scaled_q)
            if scores or v.grad:
                self.save(attention)
            if scores:  # attention @ v folds v's batch axes: a copy of its own where that is no view
                self.save(self.reshape(v, (math.prod(v.shape[:-2]), *v.shape[-2:]), "v (math SDPA)"))
        if repeat != 1:  # out[..., R − 1 :: R, :]: every R-th row, a view
            rows /= op.repeat
            strides = (*out.strides[:-2], out.strides[-2] * repeat, out.strides[-1])
            out = Meta(
                (*out.shape[:-2], out.shape[-2] // repeat, out.shape[-1]),
                strides,
                out.storage,
                out.grad,
                rows * features,
            )
        if op.sink is not None and op.causal:  # out[..., 1:, :]: the first query's row dropped, a view
            shape = (*out.shape[:-2], out.shape[-2] - 1, out.shape[-1])
            out = Meta(shape, out.strides, out.storage, out.grad, out.numel / out.shape[-2] * shape[-2])
        if op.live is not None:
            out = self.live_rows(op, q, v, out)
        if op.width is not None:
            out = Meta((*out.shape[:-1], op.width), out.strides, out.storage, out.grad, rows * op.width)
        if op.shape is not None:
            out = self.reshape(out, self.output(step)[0], step.out.var)  # type: ignore[union-attr]
        return out

    def kernel_mask(self, mask: Meta) -> Meta:
        """The attn_mask as SDPA's kernels use it: a boolean mask is first converted to a float one
        of its shape (0 where visible, -inf where hidden; torch's convert_boolean_attn_mask), which
        the CPU flash kernel then keeps for backward: 4 bytes an entry, not 1."""
        if mask.storage is None or self.storages[mask.storage].itemsize != BOOL:
            return mask
        self.record.converted_mask = True
        return self.fresh(mask.shape, mask.numel, mask.grad, "attn_mask as float")

    @op.register
    def _(self, op: FlexAttention, step: Step) -> Meta:
        """The fused kernel keeps q, k, v, its output, the log-sum-exp and the tensors its score_mod
        reads (torch's flex_attention backward); never the scores."""
        q, k, v = (self.dense(self.read(x), f"{x.value.var} dense") for x in (op.q, op.k, op.v))
        tensors = [self.value(t) for t in op.tensors]
        grad = q.grad or k.grad or v.grad or any(t.grad for t in tensors)
        shape = (*q.shape[:-1], v.shape[-1])
        out = self.fresh(shape, sympy.Mul(*shape), grad, step.out.var)  # type: ignore[union-attr]
        lse = self.fresh(shape[:-1], sympy.Mul(*shape[:-1]), False, "log-sum-exp")
        if grad:
            self.save(q, k, v, out, lse, *tensors)
        if op.live is not None:
            out = self.live_rows(op, q, v, out)
        if op.shape is not None:
            out = self.reshape(out, self.output(step)[0], step.out.var)  # type: ignore[union-attr]
        return out

    @op.register
    def _(self, op: BlockMask, step: Step) -> Meta:
        """A few int32 tensors of (query blocks, key blocks) of 128 entries: small, never saved."""
        blocks = sympy.ceiling(op.queries / 128) * sympy.ceiling(op.keys / 128)
        return self.fresh((), blocks, False, step.out.var, BOOL)  # type: ignore[union-attr]

    def dense(self, m: Meta, what: str) -> Meta:
        """`m.contiguous()`: the same tensor when it is dense in its order, else a copy."""
        if m.strides == contiguous(m.shape):
            return m
        self.record.copies += m.numel
        return self.fresh(m.shape, m.numel, m.grad, what)

    def live_rows(self, op: Attention | FlexAttention, q: Meta, v: Meta, out: Meta) -> Meta:
        """torch.where(live, attention, mean of the values): the mean (repeated per query head when
        grouped) and a new output; the where keeps its boolean condition."""
        if op.future is not None:  # (visible @ v) / count over the rows: the visible triangle is kept
            future = self.read(op.future)
            seen = self.fresh(future.shape, sympy.Integer(math.prod(future.shape)), False, "visible keys")
            if v.grad:
                self.save(seen)
            rows = q.shape[-2]
            count = self.fresh((*future.shape[:-1], 1), sympy.Integer(math.prod(future.shape[:-1])), False, "count")
            self.fresh(
                (*v.shape[:-2], rows, v.shape[-1]), v.numel / v.shape[-2] * rows, v.grad, "sum of the seen values"
            )
            if v.grad:
                self.save(count)
            mean = self.fresh((*v.shape[:-2], rows, v.shape[-1]), v.numel / v.shape[-2] * rows, v.grad, "mean")
        else:
            mean = self.fresh((*v.shape[:-2], 1, v.shape[-1]), v.numel / v.shape[-2], v.grad, "mean of the values")
        if op.group != 1:
            self.fresh((*q.shape[:-2], 1, v.shape[-1]), mean.numel * op.group, v.grad, "mean of the values repeated")
        if out.grad:
            self.save(self.value(op.live))  # type: ignore[arg-type]
        return self.fresh(out.shape, out.numel, out.grad, "attention of the live rows")

    def grown(self, m: Meta, rows: int, features: int, grad: bool, what: str) -> Meta:
        """A new tensor of `m`'s shape with `rows` more rows and `features` more features."""
        shape = (*m.shape[:-2], m.shape[-2] + rows, m.shape[-1] + features)
        return self.fresh(shape, sympy.Mul(*shape), grad, what)

    def widened(self, m: Meta, extra: int, numel: sympy.Expr, what: str) -> Meta:
        return self.fresh((*m.shape[:-1], m.shape[-1] + extra), numel, m.grad, what)

    @op.register
    def _(self, op: Concat, step: Step) -> Meta:
        parts = [self.read(part) for part in op.parts]  # torch.cat saves no operand
        shape, numel = self.output(step)
        return self.fresh(shape, numel, any(p.grad for p in parts), step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: Fill, step: Step) -> Meta:
        return self.fresh((), sympy.Integer(1), False, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: MaskNumbers, step: Step) -> Meta:
        self.read(op.mask)
        shape, numel = self.output(step)
        return self.fresh(shape, numel, False, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: Positions, step: Step) -> Meta:
        shape, numel = self.output(step)
        return self.fresh(shape, numel, False, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: PositionTensor, step: Step) -> Meta:
        shape, numel = self.output(step)
        return self.fresh(shape, numel, False, step.out.var, LONG)  # type: ignore[union-attr]

    @op.register
    def _(self, op: Slice, step: Step) -> Meta:
        """A view of the stored table: its strides are the whole table's (a range of a middle
        axis does not merge with the axis before it, so a matmul that folds them copies)."""
        x = self.value(op.x)
        shape, numel = self.output(step)
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

    @op.register
    def _(self, op: SplitTable, step: Step) -> Meta:
        return self.value(op.x)  # views of the table; each piece is read by a Slice

    @op.register
    def _(self, op: GatherAt, step: Step) -> Meta:
        x = self.read(op.x)
        if not op.index.legs:  # a read at one number (a fused QKV's j = H): a view, nothing saved
            shape, numel = self.output(step)
            strides = x.strides
            if len(strides) != len(shape) + 1:  # a stored table named without its legs: contiguous
                strides = contiguous(tuple(self.integer(a.size) for a in self.g.tensors[op.x.value.var].axes))
            self.record.moved = sympy.Integer(0)
            return Meta(shape, tuple(s for k, s in enumerate(strides) if k != op.dim), x.storage, x.grad, numel)
        index = self.value(op.index)
        if x.grad:
            self.save(index)
        shape, numel = self.output(step)
        return self.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: LiteralCombination, step: Step) -> Meta:
        x = self.value(op.x)  # slices are views; negations and numbers times slices save nothing
        shape, numel = self.output(step)
        return self.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: Permute, step: Step) -> Meta:
        x = self.value(op.x)
        p = op.permutation
        return Meta(tuple(x.shape[d] for d in p), tuple(x.strides[d] for d in p), x.storage, x.grad, x.numel)

    @op.register
    def _(self, op: BufferUpdate, step: Step) -> None:
        return None


def _math_reason(q: Meta, k: Meta, v: Meta, mask: Meta | None = None) -> str:
    """Why torch's SDPA on CPU falls back to its math kernel, which keeps the whole attention."""
    qkv = (q, k, v)
    if mask is not None and mask.grad:
        return "an attn_mask that needs a gradient (a learned bias)"
    if mask is not None and len(mask.shape) not in (2, 4):
        return "an attn_mask that is neither 2-D nor 4-D"
    if any(len(m.shape) != 4 for m in qkv):
        return "q, k and v are not 4-D (batch, heads, positions, features)"
    if len({m.shape[-1] for m in qkv}) > 1:
        return "the value head size differs from the query and key head size"
    return "a last axis whose stride is not 1"


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


def _loops(a: Meta, b: Meta) -> bool:
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


def footprint(plan: Plan, sizes: Mapping[str, int] | None = None) -> Footprint:
    """The storages the plan's forward allocates and keeps for backward (see the module doc), when
    its code runs at `sizes` (default: the sizes it was planned for; B, the batch, defaults to 1)."""
    return _Interpreter(plan, sizes).run()
