"""The state of the footprint pass (footprint.py): storages, tensors as torch lays them out
(Meta), and the machine that runs a lowered program on them, reading operands through views,
copies and masks as torch does."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field

import sympy

from ..ir import ZERO
from .program import BATCH_SIZE, Operand, Plan, Step, Value, reads
from .strides import contiguous, elementwise_strides, view_strides

FLOAT, BOOL, LONG = 4, 1, 8  # bytes per entry, with float32 activations; int64 positions
CACHE_LINE = 64  # bytes a CPU reads to fetch one entry that shares no line with its neighbours


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
    kernel: str = ""  # for SDPA: "flash", or "math: " and why torch falls back to its math kernel
    math_kernel: bool = False  # for SDPA: it runs on the math kernel, which keeps the whole attention
    converted_mask: bool = False  # for SDPA: its boolean attn_mask converted to a float one
    looped: int = 0  # for a batched matmul: matrices torch multiplies one by one (footprint.py `_loops`)
    short_rows: int = 0  # for a sum over innermost axes of few entries: the entries a row (footprint.py `row_extent`)
    short_bytes: sympy.Expr = ZERO  # ... and the bytes that sum reads and writes
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


class AbstractMachine:
    """Runs a plan on Metas, recording storages, copies and saved tensors per step; the op
    rules are footprint._Interpreter's."""

    def __init__(self, plan: Plan, sizes: Mapping[str, int] | None = None):
        self.plan = plan
        self.sizes = {**plan.sizes, **(sizes or {})}  # torch's layout rules depend on the sizes run at
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

    def like(
        self, shape: tuple[int, ...], operands: Sequence[Meta], numel, grad: bool, what: str, itemsize: int = FLOAT
    ) -> Meta:
        """A new elementwise result laid out as torch lays it out."""
        return Meta(shape, elementwise_strides(shape, operands), self.allocate(numel, what, itemsize), grad, numel)

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
            meta = Meta(shape, contiguous(shape), None, self.needs_grad(v.var), self.numel(v.legs))
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

    def needs_grad(self, var: str) -> bool:
        """Parameters, and the design's inputs: the input convention (footprint.py's doc) is a
        layer inside a network, whose input needs a gradient."""
        tensor = self.g.tensors.get(var)
        return (var in self.plan.attributes and tensor is not None and tensor.kind == "param") or var in self.inputs

    @property
    def inputs(self) -> set[str]:
        return {self.plan.names[t.name] for t in self.g.inputs}

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
            m = self.like(m.shape, [m], m.numel, False, f"~{operand.value.var}", BOOL)
        if operand.permutation is not None:
            p = operand.permutation
            m = Meta(tuple(m.shape[k] for k in p), tuple(m.strides[k] for k in p), m.storage, m.grad, m.numel)
        if operand.shape is not None:
            shape = tuple(self.integer(s) for s in operand.shape)
            m = self.reshape(m, shape, operand.value.var)
        if operand.index is not None:
            m = unsqueezed(m, operand.index)
        return m

    def integer(self, expr: sympy.Expr) -> int:
        sizes = {k: v for k, v in self.sizes.items() if k in self.g.sizes}
        symbols = {s: sympy.Integer(self.chunk_count(str(s))) for s in expr.free_symbols if str(s).startswith("chunks")}
        value = self.g.evaluate(expr.xreplace(symbols), **sizes).xreplace({BATCH_SIZE: self.sizes.get("B", 1)})
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


def unsqueezed(m: Meta, index: tuple[bool, ...]) -> Meta:
    """`m[..., None, ...]`: a unit axis where `index` is False, with torch's stride for it (the
    next axis's extent, 1 at the end), the kept axes as they were."""
    shape, strides = list(m.shape), list(m.strides)
    for position, kept in enumerate(index):
        if not kept:
            stride = shape[position] * strides[position] if position < len(shape) else 1
            shape.insert(position, 1)
            strides.insert(position, stride)
    return Meta(tuple(shape), tuple(strides), m.storage, m.grad, m.numel)
