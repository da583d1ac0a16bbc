"""Memory footprint of a lowered program: which storages each op allocates, copies and saves for
the backward pass, found by running the program abstractly on shapes and strides (at the planned
sizes) with PyTorch's own rules: elementwise results keep their operands' memory order, reductions,
softmax and matmul results are contiguous, a reshape is a view exactly when torch's stride rule
allows it (else a copy), torch.matmul folds batch legs and saves the operands it multiplies, and
each autograd node saves what its backward reads (softmax and exp their result; log, pow, clamp,
elu their input; division both operands; masked_fill its mask; SDPA q, k, v, its output and the
log-sum-exp, or on the math fallback the whole attention).

Guarantees: `Footprint.saved` lists every activation storage autograd keeps after the forward
pass (parameters, buffers and inputs excluded), each once, with its size as a formula in the
design's sizes and B; `copies` the elements each step copies that the program does not show."""

from __future__ import annotations

import math
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from functools import singledispatchmethod

import sympy

from ..ir import ZERO
from .program import (
    BATCH_SIZE,
    Attention,
    Binary,
    BufferUpdate,
    Einsum,
    Elementwise,
    Expand,
    JoinChunks,
    Map,
    MaskFill,
    Materialize,
    Matmul,
    Normalize,
    Operand,
    Permute,
    Plan,
    PrefixSum,
    Ratio,
    Reduce,
    Reshape,
    Scale,
    Softmax,
    SplitChunks,
    Step,
    SumAxes,
    Triangle,
    Value,
    VisibleMask,
    reads,
)
from .strides import contiguous, elementwise_strides, padded, view_strides

FLOAT, BOOL = 4, 1  # bytes per entry, with float32 activations
SAVES_INPUT = {"log", "clamp", "pow", "elu1"}
SAVES_RESULT = {"exp", "relu"}


@dataclass
class Storage:
    """One allocation: its entries as a formula, bytes per entry, and the step that made it."""

    numel: sympy.Expr
    itemsize: int
    step: int
    what: str

    @property
    def bytes(self) -> sympy.Expr:
        return self.numel * self.itemsize


@dataclass(frozen=True)
class Meta:
    """A tensor as torch lays it out: sizes and strides at the planned sizes, the storage it
    views (None for parameters, buffers and inputs, held anyway) and whether it needs a gradient."""

    shape: tuple[int, ...]
    strides: tuple[int, ...]
    storage: int | None
    grad: bool
    numel: sympy.Expr  # its entries as a formula


@dataclass
class StepFootprint:
    """What one step allocates, copies (elements the program does not show) and saves."""

    allocated: list[int] = field(default_factory=list)
    copies: sympy.Expr = ZERO
    saved: list[int] = field(default_factory=list)
    kernel: str = ""  # for SDPA: "flash" or "math"
    moved: sympy.Expr = ZERO  # bytes read and written, copies included


@dataclass
class Footprint:
    storages: list[Storage]
    steps: list[StepFootprint]
    saved: list[int]  # storages kept for backward, each once

    def saved_at(self, step: int) -> sympy.Expr:
        """Bytes of the storages first saved by `step`."""
        first = {}
        for k, record in enumerate(self.steps):
            for s in record.saved:
                first.setdefault(s, k)
        return sympy.Add(*(self.storages[s].bytes for s in self.saved if first.get(s) == step))

    @property
    def saved_bytes(self) -> sympy.Expr:
        """Bytes autograd keeps after the forward pass (float32 activations), a formula in B."""
        return sympy.Add(*(self.storages[s].bytes for s in self.saved))


class _Interpreter:
    """Runs a plan on Metas, recording storages, copies and saved tensors per step."""

    def __init__(self, plan: Plan):
        self.plan = plan
        self.g = plan.graph
        self.storages: list[Storage] = []
        self.env: dict[str, Meta] = {}
        self.numbers: dict[str, int] = {}
        self.step = -1
        self.record = StepFootprint()
        self.checkpointed: set[int] = {k for a, b in plan.segments for k in range(a, b + 1)}
        self.kept: list[int] = []  # storages the checkpointed segments read from outside
        self.defined: dict[str, int] = {}

    # -- sizes --
    def number(self, leg: str) -> int:
        if leg not in self.numbers:
            self.numbers[leg] = self.integer(self.plan.leg_sizes[leg])
        return self.numbers[leg]

    def numel(self, legs: Iterable[str]) -> sympy.Expr:
        return sympy.Mul(*(self.plan.leg_sizes[leg] for leg in legs))

    def allocate(self, numel: sympy.Expr, what: str, itemsize: int = FLOAT) -> int:
        self.record.moved += numel * itemsize
        self.storages.append(Storage(numel, itemsize, self.step, what))
        self.record.allocated.append(len(self.storages) - 1)
        return len(self.storages) - 1

    def fresh(self, shape: tuple[int, ...], numel: sympy.Expr, grad: bool, what: str, itemsize: int = FLOAT) -> Meta:
        return Meta(shape, contiguous(shape), self.allocate(numel, what, itemsize), grad, numel)

    def like(self, shape: tuple[int, ...], operands: Sequence[Meta], numel, grad: bool, what: str) -> Meta:
        """A new elementwise result laid out as torch lays it out."""
        return Meta(shape, elementwise_strides(shape, operands), self.allocate(numel, what), grad, numel)

    def save(self, *metas: Meta) -> None:
        if self.step in self.checkpointed or self.step >= len(self.plan.steps):
            return  # recomputed in backward, or a state update under no_grad
        for m in metas:
            if m.storage is not None and m.storage not in self.record.saved:
                self.record.saved.append(m.storage)

    # -- values and operands --
    def value(self, v: Value) -> Meta:
        if v.var not in self.env:
            shape = tuple(self.number(leg) for leg in v.legs)
            meta = Meta(shape, contiguous(shape), None, self.is_parameter(v.var), self.numel(v.legs))
            if v.var in self.plan.causal.values():
                meta = self.fresh(shape, self.numel(v.legs), False, f"causal mask {v.var}", BOOL)
            elif v.var in self.noise:
                meta = self.fresh(shape, self.numel(v.legs), False, f"noise {v.var}")
            self.env[v.var] = meta
        meta = self.env[v.var]
        outside = self.defined.get(v.var, -1) not in self.checkpointed
        if self.step in self.checkpointed and outside and meta.storage is not None:
            self.kept.append(meta.storage)  # a checkpointed segment keeps what it reads
        return meta

    def is_parameter(self, var: str) -> bool:
        tensor = self.g.tensors.get(var)
        return var in self.plan.attributes and tensor is not None and tensor.kind == "param"

    @property
    def noise(self) -> set[str]:
        return {self.plan.names[t.name] for t in self.g.tensors_of_kind("random")}

    def reshape(self, m: Meta, shape: tuple[int, ...], what: str) -> Meta:
        strides = view_strides(m.shape, m.strides, shape)
        if strides is not None:
            return Meta(shape, strides, m.storage, m.grad, m.numel)
        self.record.copies += m.numel
        self.record.moved += m.numel * FLOAT
        return self.fresh(shape, m.numel, m.grad, f"copy of {what}")

    def read(self, operand: Operand) -> Meta:
        m = self.value(operand.value)
        if operand.invert:
            m = self.like(m.shape, [m], m.numel, False, f"~{operand.value.var}")
            self.storages[m.storage].itemsize = BOOL  # type: ignore[index]
        if operand.permutation is not None:
            p = operand.permutation
            m = Meta(tuple(m.shape[k] for k in p), tuple(m.strides[k] for k in p), m.storage, m.grad, m.numel)
        if operand.shape is not None:
            shape = tuple(self.integer(s) for s in operand.shape)
            m = self.reshape(m, shape, operand.value.var)
        if operand.index is not None:
            shape, strides, it = [], [], iter(zip(m.shape, m.strides, strict=True))
            for kept in operand.index:
                size, stride = next(it) if kept else (1, 0)
                shape.append(size)
                strides.append(stride)
            m = Meta(tuple(shape), tuple(strides), m.storage, m.grad, m.numel)
        return m

    def integer(self, expr: sympy.Expr) -> int:
        sizes = {k: v for k, v in self.plan.sizes.items() if k in self.g.sizes}
        symbols = {s: sympy.Integer(self.chunk_count(str(s))) for s in expr.free_symbols if str(s).startswith("chunks")}
        value = self.g.evaluate(expr.xreplace(symbols), **sizes).xreplace({BATCH_SIZE: self.plan.sizes.get("B", 1)})
        return int(sympy.ceiling(value))

    def chunk_count(self, name: str) -> int:
        chunk = next(c for c in self.plan.chunks if c.name == name)
        return -(-self.integer(chunk.extent) // chunk.size)

    def output(self, step: Step) -> tuple[tuple[int, ...], sympy.Expr]:
        legs = step.out.legs  # type: ignore[union-attr]
        return tuple(self.number(leg) for leg in legs), self.numel(legs)

    # -- the program --
    def run(self) -> Footprint:
        steps = [*self.plan.steps, *self.plan.update_steps]
        records = []
        for k, step in enumerate(steps):
            self.step, self.record = k, StepFootprint()
            self.record.moved = sympy.Add(*(self.value(v).numel * FLOAT for v in dict.fromkeys(reads(step.op))))
            result = self.op(step.op, step)
            if step.out is not None and result is not None:
                self.env[step.out.var] = result
                self.defined[step.out.var] = k
            records.append(self.record)
        saved = list(dict.fromkeys([s for r in records for s in r.saved] + self.kept))
        return Footprint(self.storages, records, saved)

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
        return self.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: Matmul, step: Step) -> Meta:
        a, b = self.read(op.a), self.read(op.b)
        self.matmul(a, b)
        shape, numel = self.output(step)
        return self.fresh(shape, numel, a.grad or b.grad, step.out.var)  # type: ignore[union-attr]

    def matmul(self, a: Meta, b: Meta) -> None:
        """torch.matmul: a batched operand beside a matrix is folded into a matrix (copied when
        the matrix needs a gradient and the fold is no view), else both go to bmm as 3-D (copied
        where the batch legs do not merge); each operand is saved when the other needs a gradient."""
        da, db = len(a.shape), len(b.shape)
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
        elif da >= 3 and db >= 3:
            a = self.reshape(a, (math.prod(a.shape[:-2]), *a.shape[-2:]), "matmul operand")
            b = self.reshape(b, (math.prod(b.shape[:-2]), *b.shape[-2:]), "matmul operand")
        if b.grad:
            self.save(a)
        if a.grad:
            self.save(b)

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
        if x.strides != contiguous(x.shape):
            self.record.copies += x.numel
            self.record.moved += 2 * x.numel * FLOAT
        out = self.fresh(x.shape, x.numel, x.grad, step.out.var)  # type: ignore[union-attr]
        if x.grad:
            self.save(out)
        return out

    @op.register
    def _(self, op: Normalize, step: Step) -> Meta:
        x = self.read(op.x)
        kept = x.shape[: len(x.shape) - op.count]
        rows = x.numel / sympy.Mul(*self.trailing(step, op.count))
        total = self.fresh((*kept, *[1] * op.count), rows, x.grad, "normalizer")
        if x.grad:
            self.save(x, total)
        return self.like(x.shape, [x, total], x.numel, x.grad, step.out.var)  # type: ignore[union-attr]

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
    def _(self, op: Reduce, step: Step) -> Meta:
        x = self.value(op.x)
        shape, numel = self.output(step)
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
        plus = self.like(denominator.shape, [denominator], self.value(op.denominator.value).numel, denominator.grad, "")
        if plus.grad:
            self.save(numerator)
        if numerator.grad or plus.grad:
            self.save(plus)
        return self.like(numerator.shape, [numerator, plus], numerator.numel, numerator.grad or plus.grad, "ratio")

    @op.register
    def _(self, op: PrefixSum, step: Step) -> Meta:
        x = self.value(op.x)
        self.allocate(x.numel, "cumsum")
        return self.fresh(x.shape, x.numel, x.grad, step.out.var)  # type: ignore[union-attr]

    @op.register
    def _(self, op: Triangle, step: Step) -> Meta:
        return self.fresh((op.size, op.size), sympy.Integer(op.size**2), False, "triangle")

    @op.register
    def _(self, op: SplitChunks, step: Step) -> Meta:
        x = self.value(op.x)
        shape, numel = self.output(step)
        return self.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]

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
        if op.pad_value:
            v = self.widened(v, op.pad_value, keys * (features + op.pad_value), "v padded")
            features += op.pad_value
        if op.pad_query_key:
            latent += op.pad_query_key
            q = self.widened(q, op.pad_query_key, rows * latent, "q padded")
            k = self.widened(k, op.pad_query_key, keys * latent, "k padded")
        grad = q.grad or k.grad or v.grad
        shape = (*q.shape[:-1], v.shape[-1])
        flash = (
            len(q.shape) == len(k.shape) == len(v.shape) == 4
            and q.shape[-1] == k.shape[-1] == v.shape[-1]
            and all(m.strides[-1] == 1 for m in (q, k, v))
        )
        self.record.kernel = "flash" if flash else "math: " + _math_reason(q, k, v)
        if flash:
            physical = (0, 2, 1, 3)
            out = self.fresh(tuple(shape[d] for d in physical), rows * features, grad, step.out.var)  # type: ignore[union-attr]
            out = Meta(shape, tuple(out.strides[physical.index(d)] for d in range(4)), out.storage, grad, out.numel)
            lse = self.fresh(shape[:-1], rows, False, "log-sum-exp")
            if grad:
                self.save(q, k, v, out, lse, *([self.value(op.mask)] if op.mask is not None else []))
        else:
            entries = rows * self.numel(leg for leg in k_legs if leg not in q_legs)
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
            if scores:
                self.save(v)
        if op.width is not None:
            out = Meta((*out.shape[:-1], op.width), out.strides, out.storage, out.grad, out.numel)
        if op.shape is not None:
            out = self.reshape(out, self.output(step)[0], step.out.var)  # type: ignore[union-attr]
        return out

    def widened(self, m: Meta, extra: int, numel: sympy.Expr, what: str) -> Meta:
        return self.fresh((*m.shape[:-1], m.shape[-1] + extra), numel, m.grad, what)

    @op.register
    def _(self, op: Permute, step: Step) -> Meta:
        x = self.value(op.x)
        p = op.permutation
        return Meta(tuple(x.shape[d] for d in p), tuple(x.strides[d] for d in p), x.storage, x.grad, x.numel)

    @op.register
    def _(self, op: BufferUpdate, step: Step) -> None:
        return None


def _math_reason(*qkv: Meta) -> str:
    """Why torch's SDPA on CPU falls back to its math kernel, which keeps the whole attention."""
    if any(len(m.shape) != 4 for m in qkv):
        return "q, k and v are not 4-D (batch, heads, positions, features)"
    if len({m.shape[-1] for m in qkv}) > 1:
        return "the value head size differs from the query and key head size"
    return "a last axis whose stride is not 1"


def footprint(plan: Plan) -> Footprint:
    """The storages the plan's forward allocates and keeps for backward (see the module doc)."""
    return _Interpreter(plan).run()
