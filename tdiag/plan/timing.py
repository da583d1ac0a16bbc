"""The `time` objective: a trial plan's training-step time estimated op by op on a roofline of
the planning device (device.py): each op takes the longer of its FLOPs at the device's peak and
the bytes it moves (copies included, from the footprint pass) at its bandwidth, plus a per-op
overhead; forward and backward together count three forward passes and two overheads.

A fused attention (SDPA, FlexAttention) is costed for the FLOPs its kernel does (a causal one
skips the blocks above the diagonal: program.py `causal_kernel_flops`) plus the softmax of the
score entries it computes, which it never stores but still exponentiates and normalizes forward
and again backward, at the device's measured softmax rate per entry (`softmax_seconds`); SDPA
on its math kernel (the footprint's `math_kernel`) is a matmul, a stored softmax and a matmul in turn,
so its arithmetic and its traffic add up instead of overlapping. Each op type has its rule in
TIME_RULES."""

from __future__ import annotations

from collections.abc import Callable

import sympy

from ..device import DeviceModel, planning_device
from .abstract import FLOAT, Footprint, StepFootprint
from .footprint import footprint
from .program import (
    BATCH_SIZE,
    Attention,
    BandBlocks,
    BandMask,
    BlockMask,
    BufferUpdate,
    ChunkCount,
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
    executed_flops,
)

FORWARD_AND_BACKWARD = 3  # a backward pass costs about twice the forward's arithmetic and traffic
KERNELS_PER_OP = 2  # one kernel forward, about one backward


def step_time(device: DeviceModel, flops: float, moved: float, kind: str | None = None) -> float:
    """Seconds of one op in a training step: its forward and backward on the roofline, times the
    device's measured factor for the op's kind (`op_kind`) at the bytes it moves."""
    seconds = device.estimate(FORWARD_AND_BACKWARD * flops, FORWARD_AND_BACKWARD * moved)
    return (seconds + (KERNELS_PER_OP - 1) * device.overhead) * device.factor(kind, moved)


# A matmul whose FLOPs per byte moved are below this fraction of the device's ridge is thin (a
# small inner size and a small outer one, such as a mixing of a few heads over a score tensor):
# bound by memory, and at the rate device.measure_kinds measures for one ("thin"), not the
# roofline's bandwidth.
THIN = 0.25

# A batched matmul that torch runs matrix by matrix (footprint's `bmm_loops`) pays a select and an
# addmm per matrix, forward and in each backward product: about two op overheads a matrix
# (measured on torch 2.13's CPU build, one thread: 1.9-2.1 µs a matrix over a BLAS-ready bmm of
# 4096 matrices of 64x2 by 2x4 or 8x8 by 8x8, with an op overhead of 1.0 µs).
LOOP_OVERHEADS = 2

# codegen's _matvec is an autograd.Function: its Python forward and backward and their views and
# casts cost about 28 op overheads more than a bmm's fwd+bwd (measured on torch 2.13's CPU build,
# one thread: 100 µs against 72 µs for 8 matrices of 16 x 16, with an op overhead of 1.0 µs)
MATVEC_OVERHEADS = 28

SOFTMAX_PASSES = 2  # a softmax reads and writes its entries once forward (device.PASSES)
# an SDPA given a boolean attn_mask converts it to a float one (footprint.py `kernel_mask`) and
# adds an entry of it to each score, forward and again backward: one more pass over the entries
# (measured on torch 2.13's CPU kernel at N=2048, one thread: a boolean triangle as attn_mask takes
# 1.08 of the time without a mask, this 1.12 on the nominal device), the cost that the
# repeated-query form (forms/sdpa_repeated.py) saves. A float attn_mask (padding, an additive
# bias) is left at the softmax's passes: its forms were measured a tie with the materialized box.
MASK_PASSES = 1


def softmax_seconds(device: DeviceModel, entries: float, passes: int = SOFTMAX_PASSES, stored: bool = False) -> float:
    """Seconds of a training step's softmax over `entries` score entries (exponentials and the
    normalization, forward and backward, `passes` over the entries each) at the device's measured
    softmax rate, no overhead. A fused kernel works on blocks in the caches; one that `stored` the
    scores (SDPA's math kernel) runs at the rate of a softmax over a score tensor of that size
    (`DeviceModel.factor` at its bytes), as the materialized box's softmax does."""
    size = passes * FLOAT * entries
    factor = device.factor("softmax", size if stored else None)
    return FORWARD_AND_BACKWARD * size / device.bandwidth * factor


def short_rows_factor(device: DeviceModel, extent: int, moved: float) -> float:
    """How much longer than at the bandwidth a sum over innermost rows of `extent` entries takes:
    the device's measured factor for rows of 2 ("rows", device.measure_kinds), the per-row cost
    spread over `extent` entries (measured: the rate grows about linearly with the row up to 16
    entries), never below 1. A device without the figure (a data sheet: factor 1) pays nothing more."""
    return max(1.0, device.factor("rows", moved) * 2 / extent)


def op_time(device: DeviceModel, step: Step, record: StepFootprint, number: Callable[[sympy.Expr], float]) -> float:
    """Seconds of one step of the plan in a training step; `number` evaluates its formulas."""
    seconds = _op_time(device, step, record, number)
    if record.short_rows:  # the reduction's pass over what it sums, at its rate instead of the bandwidth
        moved = number(record.short_bytes)
        excess = short_rows_factor(device, record.short_rows, moved) - 1
        seconds += excess * FORWARD_AND_BACKWARD * moved / device.bandwidth
    return seconds


TimeRule = Callable[[DeviceModel, Step, StepFootprint, Callable[[sympy.Expr], float]], float]


def _op_time(device: DeviceModel, step: Step, record: StepFootprint, number: Callable[[sympy.Expr], float]) -> float:
    rule = TIME_RULES.get(type(step.op))
    if rule is None:
        raise TypeError(f"no time rule for {type(step.op).__name__}")
    return rule(device, step, record, number)


def _looping(device: DeviceModel, record: StepFootprint) -> float:
    """The overheads of a batched matmul that torch runs matrix by matrix (footprint's bmm_loops)."""
    return FORWARD_AND_BACKWARD * LOOP_OVERHEADS * record.looped * device.overhead


def roofline_time(
    device: DeviceModel, step: Step, record: StepFootprint, number: Callable[[sympy.Expr], float]
) -> float:
    """An op on the roofline, at the device's measured rate for its elementwise kind (`op_kind`)."""
    flops, moved = number(executed_flops(step)), number(record.moved)
    return step_time(device, flops, moved, op_kind(step.op)) + _looping(device, record)


def contraction_time(
    device: DeviceModel, step: Step, record: StepFootprint, number: Callable[[sympy.Expr], float]
) -> float:
    """A matmul or einsum: a batch of matrix-vector products at a map's rate (codegen's _matvec), a
    thin product (few FLOPs per byte) at the rate measured for one, else on the roofline."""
    flops, moved = number(executed_flops(step)), number(record.moved)
    looping = _looping(device, record)
    if isinstance(step.op, Matmul) and step.op.matvec:
        # codegen's _matvec: a pass over the matrices forward and one backward, and their
        # gradient written fresh, at the measured rate of a map over that many bytes
        return step_time(device, flops, moved, "map") + looping + MATVEC_OVERHEADS * device.overhead
    if flops < THIN * device.ridge * moved:
        return step_time(device, flops, moved, "thin") + looping
    return step_time(device, flops, moved, op_kind(step.op)) + looping


def fused_attention_time(
    device: DeviceModel, step: Step, record: StepFootprint, number: Callable[[sympy.Expr], float]
) -> float:
    """SDPA or FlexAttention: the FLOPs its kernel does plus the softmax of the score entries it
    computes (never stored, but exponentiated forward and backward); on SDPA's math kernel a
    matmul, a stored softmax and a matmul whose arithmetic and traffic add up."""
    flops, moved = number(executed_flops(step)), number(record.moved)
    dense = number(step.flops)
    math_kernel = record.math_kernel
    if math_kernel:  # it masks a causal product and skips no block
        flops = dense
    entries = number(step.entries) * (flops / dense if dense else 1.0)
    if math_kernel:  # its traffic is fresh score tensors written and read, at a map's rate for their size
        seconds = (
            step_time(device, flops, 0.0) + step_time(device, 0.0, moved, "map") - KERNELS_PER_OP * device.overhead
        )
    else:
        seconds = step_time(device, flops, moved)
    passes = SOFTMAX_PASSES + (MASK_PASSES if record.converted_mask else 0)
    return seconds + softmax_seconds(device, entries, passes, stored=math_kernel)


# Each op of the program IR and how its time is estimated; a new op needs its entry here
# (tests/test_program_ops.py checks that every op has one).
TIME_RULES: dict[type, TimeRule] = {
    Matmul: contraction_time,
    Einsum: contraction_time,
    Attention: fused_attention_time,
    FlexAttention: fused_attention_time,
    **dict.fromkeys(
        (
            BandBlocks,
            BandMask,
            BlockMask,
            BufferUpdate,
            ChunkEdge,
            Concat,
            Convolve,
            CumulativeScan,
            DecayedPrefix,
            Elementwise,
            Expand,
            Fill,
            GatherAt,
            JoinChunks,
            LayerNorm,
            LiteralCombination,
            LiveRows,
            Map,
            MaskFill,
            MaskNumbers,
            Materialize,
            Multiply,
            Normalize,
            OnesColumn,
            Permute,
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
            SumAxes,
            Triangle,
            VisibleMask,
        ),
        roofline_time,
    ),
}

# The elementwise kind the device model calibrates for an op (device.measure_kinds); others none.
OP_KINDS: dict[type, str] = {
    Normalize: "normalize",
    Ratio: "normalize",
    Softmax: "softmax",
    MaskFill: "mask",
    Map: "map",
    LayerNorm: "map",
    Scale: "scale",
    Elementwise: "sum",
    CumulativeScan: "sum",
    SegmentSums: "sum",
}


def op_kind(op: object) -> str | None:
    """The elementwise kind the device model calibrates (device.measure_kinds), or None."""
    return OP_KINDS.get(type(op))


def plan_time(plan: Plan, device: DeviceModel, **sizes: int) -> float:
    """The estimated seconds of a training step (forward and backward) of the whole plan at its
    planned sizes, or at `sizes` (B included)."""
    at = plan.sizes | sizes
    graph = plan.graph

    def number(expr: sympy.Expr) -> float:
        value = graph.evaluate(sympy.sympify(expr), **{k: v for k, v in at.items() if k in graph.sizes})
        return float(value.xreplace({BATCH_SIZE: at.get("B", 1)}))

    records = footprint(plan).steps
    return sum(
        op_time(device, step, record, number)
        for step, record in zip([*plan.steps, *plan.update_steps], records, strict=True)
    )


class TimeModel:
    """Estimates a lowering's training-step time on the planning device."""

    _device: DeviceModel | None = None
    estimates = 0  # trial estimates made: none means no choice the objective could change
    fusion_estimates = 0  # those of a fused attention: the only choices `memory` makes otherwise than `flops`

    @property
    def device(self) -> DeviceModel:
        if self._device is None:
            self._device = planning_device()
        return self._device

    def context(self, steps: list[Step]) -> Plan:
        """The program so far with `steps` after it, for the footprint pass."""
        chunks = [ChunkCount(str(symbol), extent, size) for (extent, size), symbol in self.chunk_counts.items()]
        return Plan(
            self.g,
            dict(self.sizes),
            dict(self.leg_sizes),
            steps=[*self.steps, *steps],
            names=dict(self.input_vars),
            attributes=frozenset(self.attributes),
            causal=dict(self.causal_masks),
            chunks=chunks,
        )

    def estimated_time(self, steps: list[Step], fp: Footprint | None = None) -> float:
        """Seconds a training step spends in `steps`, appended to the program so far (`fp`: the
        footprint of that program, when the caller has it already)."""
        self.estimates += 1
        self.fusion_estimates += any(isinstance(step.op, Attention | FlexAttention) for step in steps)
        records = (fp or footprint(self.context(steps))).steps[len(self.steps) :]
        return sum(
            op_time(self.device, step, record, self.at_planned_sizes)
            for step, record in zip(steps, records, strict=True)
        )

    def rival_objectives(self) -> tuple[str, ...]:
        """The objectives whose plans may differ from this lowering's (made for `time`): none
        where no choice was estimated, `flops` where no fused attention was (`memory` then
        chooses as `flops` does: by FLOPs, trial() in base.py), else both."""
        if not self.estimates:
            return ()
        return ("flops", "memory") if self.fusion_estimates else ("flops",)

    def at_planned_sizes(self, expr: sympy.Expr) -> float:
        return float(self.at_sizes(sympy.sympify(expr)))
