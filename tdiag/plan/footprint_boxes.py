"""The footprint rules of a softmax box's lowered forms (box_ops.py): chunks and their prefix
states, bands, SDPA's masks, scaled_dot_product_attention (the CPU flash kernel keeps q, k, v, its
output and the log-sum-exp; the math fallback the whole attention, with a boolean attn_mask
converted to a float one) and FlexAttention (q, k, v, output, log-sum-exp and what its score_mod
reads). Each SDPA step records which kernel runs and why (StepFootprint.kernel)."""

from __future__ import annotations

import math

import sympy

from .abstract import BOOL, AbstractMachine, Meta
from .footprint_rules import rule
from .program import (
    Attention,
    BandBlocks,
    BandMask,
    BlockMask,
    ChunkEdge,
    DecayedPrefix,
    FlexAttention,
    JoinChunks,
    LiveRows,
    PrefixSum,
    ScoreMask,
    SplitChunks,
    Step,
    Triangle,
    VisibleMask,
)
from .strides import contiguous, padded

# the loop of DecayedPrefix runs about seven small ops a chunk (two exps, two differences, two
# products and a sum) forward and as many backward: about twice a matmul loop's two per matrix
# (timing.LOOP_OVERHEADS), so many small chunks are priced by their ops, not only their bytes
DECAYED_PREFIX_LOOP = 4


@rule(PrefixSum)
def _prefix_sum(machine: AbstractMachine, op: PrefixSum, step: Step) -> Meta:
    x = machine.value(op.x)  # codegen's _earlier adds each chunk's state into its slice of the result
    return machine.fresh(x.shape, x.numel, x.grad, step.out.var)  # type: ignore[union-attr]


@rule(Triangle)
def _triangle(machine: AbstractMachine, op: Triangle, step: Step) -> Meta:
    return machine.fresh((op.size, op.size), sympy.Integer(op.size**2), False, "triangle")


@rule(SplitChunks)
def _split_chunks(machine: AbstractMachine, op: SplitChunks, step: Step) -> Meta:
    x = machine.value(op.x)
    shape, numel = machine.output(step)
    return machine.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]


@rule(BandBlocks)
def _band_blocks(machine: AbstractMachine, op: BandBlocks, step: Step) -> Meta:
    """The padded copy, then the unfolded blocks copied contiguous."""
    x = machine.value(op.x)
    shape, numel = machine.output(step)
    machine.fresh(x.shape, x.numel, x.grad, f"{op.x.var} padded")
    return machine.fresh(shape, numel, x.grad, step.out.var)  # type: ignore[union-attr]


@rule(BandMask)
def _band_mask(machine: AbstractMachine, op: BandMask, step: Step) -> Meta:
    shape, numel = machine.output(step)
    return machine.fresh(shape, numel, False, step.out.var, BOOL)  # type: ignore[union-attr]


@rule(ChunkEdge)
def _chunk_edge(machine: AbstractMachine, op: ChunkEdge, step: Step) -> Meta:
    x = machine.value(op.x)
    shape = x.shape[: op.axis] + x.shape[op.axis + 1 :]
    strides = x.strides[: op.axis] + x.strides[op.axis + 1 :]
    return Meta(shape, strides, x.storage, x.grad, machine.output(step)[1])


@rule(DecayedPrefix)
def _decayed_prefix(machine: AbstractMachine, op: DecayedPrefix, step: Step) -> Meta:
    """One carried state per chunk and its decayed copy, then the stack of them; the carried
    states are kept for backward where the decay needs a gradient (a product keeps a factor
    for the other's gradient), a decay of constants (RetNet's γ) keeps none of them."""
    x, start, end = machine.value(op.x), machine.read(op.start), machine.read(op.end)
    grad = x.grad or start.grad or end.grad
    machine.record.looped += DECAYED_PREFIX_LOOP * x.shape[op.axis]
    carried = machine.fresh(x.shape, x.numel, grad, "carried states")
    machine.fresh(x.shape, x.numel, grad, "decayed states")
    if start.grad or end.grad:
        machine.save(carried)
    return machine.fresh(x.shape, x.numel, grad, step.out.var)  # type: ignore[union-attr]


@rule(JoinChunks)
def _join_chunks(machine: AbstractMachine, op: JoinChunks, step: Step) -> Meta:
    x = machine.read(op.x)
    p = op.position
    flat = (*x.shape[:p], x.shape[p] * x.shape[p + 1], *x.shape[p + 2 :])
    joined = machine.reshape(x, flat, op.x.value.var)
    shape, _ = machine.output(step)
    return Meta(shape, joined.strides, joined.storage, joined.grad, joined.numel)


@rule(VisibleMask)
def _visible_mask(machine: AbstractMachine, op: VisibleMask, step: Step) -> Meta:
    causal = machine.read(op.causal)
    shape = tuple(machine.integer(s) for s in op.sizes)
    numel = sympy.Mul(*op.sizes)
    machine.record.copies += numel
    rows = machine.integer(op.rows)
    return machine.fresh((rows, math.prod(shape) // rows), numel, causal.grad, step.out.var, BOOL)  # type: ignore[union-attr]


@rule(ScoreMask)
def _score_mask(machine: AbstractMachine, op: ScoreMask, step: Step) -> Meta:
    hidden, bias = [machine.read(h) for h in op.hidden], [machine.read(b) for b in op.bias]
    future = machine.read(op.future) if op.future is not None else None
    metas = [*hidden, *bias, *([future] if future is not None else [])]
    rank = max(len(m.shape) for m in metas)
    shape = tuple(max(d) for d in zip(*(padded(m.shape, (1,) * rank) for m in metas), strict=True))
    grad = any(b.grad for b in bias)
    if hidden and grad:  # torch.where(hidden, lowest, bias) keeps its condition
        rank = max(len(m.shape) for m in hidden)
        where = tuple(max(d) for d in zip(*(padded(m.shape, (1,) * rank) for m in hidden), strict=True))
        machine.save(machine.fresh(where, sympy.Integer(math.prod(where)), False, "hidden scores", BOOL))
    if future is not None and grad:  # torch.where(future, -inf, ...) keeps the triangle itself
        machine.save(future)
    return machine.fresh(shape, machine.numel(step.out.legs), grad, step.out.var)  # type: ignore[union-attr]


@rule(LiveRows)
def _live_rows(machine: AbstractMachine, op: LiveRows, step: Step) -> Meta:
    hidden = [machine.read(h) for h in op.hidden]
    rank = max(len(m.shape) for m in hidden)
    shape = tuple(max(d) for d in zip(*(padded(m.shape, (1,) * rank) for m in hidden), strict=True))
    shape = (*shape[:-1], 1)
    return machine.fresh(shape, sympy.Integer(math.prod(shape)), False, step.out.var, BOOL)  # type: ignore[union-attr]


@rule(Attention)
def _attention(machine: AbstractMachine, op: Attention, step: Step) -> Meta:
    q, k, v = machine.read(op.q), machine.read(op.k), machine.read(op.v)
    q_legs, k_legs, out_legs = op.q.value.legs, op.k.value.legs, step.out.legs  # type: ignore[union-attr]
    rows = machine.numel(leg for leg in out_legs if leg in q_legs)  # heads and queries
    keys = machine.numel(leg for leg in k_legs if leg in out_legs or leg not in q_legs)  # heads and keys
    latent = machine.numel(leg for leg in q_legs if leg not in out_legs)
    features = machine.numel(leg for leg in out_legs if leg not in q_legs)
    if op.bias is not None:
        latent += 1
        q = widened(machine, q, 1, rows * latent, "q with a feature of ones")
        k = widened(machine, k, 1, keys * latent, "k with the key bias")
    if op.pad_value and op.sink is None:  # beside a sink, padded with the sink key's row
        v = widened(machine, v, op.pad_value, keys * (features + op.pad_value), "v padded")
    features += op.pad_value
    if op.pad_query_key:
        latent += op.pad_query_key
        q = widened(machine, q, op.pad_query_key, rows * latent, "q padded")
        k = widened(machine, k, op.pad_query_key, keys * latent, "k padded")
    if op.sink is not None:  # _sink_attention: a sink feature, a first key, a first query if causal
        latent += 1
        q = grown(machine, q, 1 if op.causal else 0, 1, q.grad, "q with the sink feature")
        k = grown(machine, k, 1, 1, k.grad, "k with the sink key")
        v = grown(machine, v, 1, op.pad_value, v.grad, "v with the sink key's zero value")
    repeat = machine.integer(op.repeat)
    if repeat != 1:  # q.repeat_interleave(R, dim=-2): a new q of R times the rows
        rows *= op.repeat
        q = machine.fresh((*q.shape[:-2], q.shape[-2] * repeat, q.shape[-1]), rows * latent, q.grad, "q repeated")
    grad = q.grad or k.grad or v.grad
    shape = (*q.shape[:-1], v.shape[-1])
    mask = kernel_mask(machine, machine.value(op.mask)) if op.mask is not None else None
    flash = (
        len(q.shape) == len(k.shape) == len(v.shape) == 4
        and q.shape[-1] == k.shape[-1] == v.shape[-1]
        and all(m.strides[-1] == 1 for m in (q, k, v))
        and (mask is None or (not mask.grad and len(mask.shape) in (2, 4)))
    )
    machine.record.kernel = "flash" if flash else "math: " + _math_reason(q, k, v, mask)
    machine.record.math_kernel = not flash
    if flash:  # the CPU flash kernel lays its output out as q is laid out (measured, torch 2.13)
        physical = (*sorted(range(3), key=lambda d: (-q.strides[d], d)), 3)
        out = machine.fresh(tuple(shape[d] for d in physical), rows * features, grad, step.out.var)  # type: ignore[union-attr]
        out = Meta(shape, tuple(out.strides[physical.index(d)] for d in range(4)), out.storage, grad, out.numel)
        lse = machine.fresh(shape[:-1], rows, False, "log-sum-exp")
        if grad:
            machine.save(q, k, v, out, lse, *([mask] if mask is not None else []))
    else:
        entries = rows * machine.numel(leg for leg in k_legs if leg not in q_legs)
        if op.grouped and k.shape[-3] != q.shape[-3]:  # the math kernel repeats k and v per query head
            repeats = q.shape[-3] // k.shape[-3]
            k = machine.fresh((*k.shape[:-3], q.shape[-3], *k.shape[-2:]), k.numel * repeats, k.grad, "k repeated")
            v = machine.fresh((*v.shape[:-3], q.shape[-3], *v.shape[-2:]), v.numel * repeats, v.grad, "v repeated")
        scaled_q = machine.fresh(q.shape, q.numel, q.grad, "q scaled (math SDPA)")
        scaled_k = machine.fresh(k.shape, k.numel, k.grad, "k scaled (math SDPA)")
        scores = q.grad or k.grad
        attention = machine.fresh((*q.shape[:-1], k.shape[-2]), entries, scores, "attention (math SDPA)")
        out = machine.fresh(shape, rows * features, grad, step.out.var)  # type: ignore[union-attr]
        if q.grad:
            machine.save(scaled_k)
        if k.grad:
            machine.save(scaled_q)
        if scores or v.grad:
            machine.save(attention)
        if scores:  # attention @ v folds v's batch axes: a copy of its own where that is no view
            machine.save(machine.reshape(v, (math.prod(v.shape[:-2]), *v.shape[-2:]), "v (math SDPA)"))
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
        out = live_rows(machine, op, q, v, out)
    if op.width is not None:
        out = Meta((*out.shape[:-1], op.width), out.strides, out.storage, out.grad, rows * op.width)
    if op.shape is not None:
        out = machine.reshape(out, machine.output(step)[0], step.out.var)  # type: ignore[union-attr]
    return out


def kernel_mask(machine: AbstractMachine, mask: Meta) -> Meta:
    """The attn_mask as SDPA's kernels use it: a boolean mask is first converted to a float one
    of its shape (0 where visible, -inf where hidden; torch's convert_boolean_attn_mask), which
    the CPU flash kernel then keeps for backward: 4 bytes an entry, not 1."""
    if mask.storage is None or machine.storages[mask.storage].itemsize != BOOL:
        return mask
    machine.record.converted_mask = True
    return machine.fresh(mask.shape, mask.numel, mask.grad, "attn_mask as float")


@rule(FlexAttention)
def _flex_attention(machine: AbstractMachine, op: FlexAttention, step: Step) -> Meta:
    """The fused kernel keeps q, k, v, its output, the log-sum-exp and the tensors its score_mod
    reads (torch's flex_attention backward); never the scores."""
    q, k, v = (dense(machine, machine.read(x), f"{x.value.var} dense") for x in (op.q, op.k, op.v))
    tensors = [machine.value(t) for t in op.tensors]
    grad = q.grad or k.grad or v.grad or any(t.grad for t in tensors)
    shape = (*q.shape[:-1], v.shape[-1])
    out = machine.fresh(shape, sympy.Mul(*shape), grad, step.out.var)  # type: ignore[union-attr]
    lse = machine.fresh(shape[:-1], sympy.Mul(*shape[:-1]), False, "log-sum-exp")
    if grad:
        machine.save(q, k, v, out, lse, *tensors)
    if op.live is not None:
        out = live_rows(machine, op, q, v, out)
    if op.shape is not None:
        out = machine.reshape(out, machine.output(step)[0], step.out.var)  # type: ignore[union-attr]
    return out


@rule(BlockMask)
def _block_mask(machine: AbstractMachine, op: BlockMask, step: Step) -> Meta:
    """A few int32 tensors of (query blocks, key blocks) of 128 entries: small, never saved."""
    blocks = sympy.ceiling(op.queries / 128) * sympy.ceiling(op.keys / 128)
    return machine.fresh((), blocks, False, step.out.var, BOOL)  # type: ignore[union-attr]


def dense(machine: AbstractMachine, m: Meta, what: str) -> Meta:
    """`m.contiguous()`: the same tensor when it is dense in its order, else a copy."""
    if m.strides == contiguous(m.shape):
        return m
    machine.record.copies += m.numel
    return machine.fresh(m.shape, m.numel, m.grad, what)


def live_rows(machine: AbstractMachine, op: Attention | FlexAttention, q: Meta, v: Meta, out: Meta) -> Meta:
    """torch.where(live, attention, mean of the values): the mean (repeated per query head when
    grouped) and a new output; the where keeps its boolean condition."""
    if op.future is not None:  # (visible @ v) / count over the rows: the visible triangle is kept
        future = machine.read(op.future)
        seen = machine.fresh(future.shape, sympy.Integer(math.prod(future.shape)), False, "visible keys")
        if v.grad:
            machine.save(seen)
        rows = q.shape[-2]
        count = machine.fresh((*future.shape[:-1], 1), sympy.Integer(math.prod(future.shape[:-1])), False, "count")
        machine.fresh(
            (*v.shape[:-2], rows, v.shape[-1]), v.numel / v.shape[-2] * rows, v.grad, "sum of the seen values"
        )
        if v.grad:
            machine.save(count)
        mean = machine.fresh((*v.shape[:-2], rows, v.shape[-1]), v.numel / v.shape[-2] * rows, v.grad, "mean")
    else:
        mean = machine.fresh((*v.shape[:-2], 1, v.shape[-1]), v.numel / v.shape[-2], v.grad, "mean of the values")
    if op.group != 1:
        machine.fresh((*q.shape[:-2], 1, v.shape[-1]), mean.numel * op.group, v.grad, "mean of the values repeated")
    if out.grad:
        machine.save(machine.value(op.live))  # type: ignore[arg-type]
    return machine.fresh(out.shape, out.numel, out.grad, "attention of the live rows")


def grown(machine: AbstractMachine, m: Meta, rows: int, features: int, grad: bool, what: str) -> Meta:
    """A new tensor of `m`'s shape with `rows` more rows and `features` more features."""
    shape = (*m.shape[:-2], m.shape[-2] + rows, m.shape[-1] + features)
    return machine.fresh(shape, sympy.Mul(*shape), grad, what)


def widened(machine: AbstractMachine, m: Meta, extra: int, numel: sympy.Expr, what: str) -> Meta:
    return machine.fresh((*m.shape[:-1], m.shape[-1] + extra), numel, m.grad, what)


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
