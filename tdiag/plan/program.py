"""The lowered program: typed ops over named values with explicit physical layouts.

The planner emits Steps; each Step holds one op (ops.py, box_ops.py: dataclasses, no Python text),
the value it defines (ops.py) and its costs; a Plan is the steps of a design at some sizes.
`codegen` is the only reader that prints Python; `cost` reads the costs; footprint.py and
timing.py price the steps. This module and the ones it imports are the program IR: they import
only sympy and the standard library, so that every layer above can read a plan. The names of
ops.py (with the values) and box_ops.py are importable from here."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sympy

from .box_ops import (
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
    ScoreArgument,
    ScoreArith,
    ScoreIndex,
    ScoreMap,
    ScoreMask,
    ScoreNumber,
    ScoreRead,
    ScoreTerm,
    SplitChunks,
    Triangle,
    VisibleMask,
    score_reads,
)
from .ops import (
    BATCH,
    BATCH_SIZE,
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
    align,
    operands,
    read_groups,
    show_legs,
)

if TYPE_CHECKING:
    from ..device import DeviceModel
    from ..graph.model import DesignGraph


__all__ = [
    "BATCH",
    "BATCH_SIZE",
    "FLEX_BLOCK",
    "PLAN_VIEWS",
    "SDPA_KEY_BLOCK",
    "Attention",
    "BandBlocks",
    "BandMask",
    "Binary",
    "BlockMask",
    "BufferUpdate",
    "ChunkCount",
    "ChunkEdge",
    "Concat",
    "Convolve",
    "CumulativeScan",
    "DecayedPrefix",
    "Einsum",
    "Elementwise",
    "Expand",
    "Fill",
    "FlexAttention",
    "GatherAt",
    "JoinChunks",
    "LayerNorm",
    "LiteralCombination",
    "LiveRows",
    "Map",
    "MaskFill",
    "MaskNumbers",
    "Materialize",
    "Matmul",
    "Multiply",
    "Normalize",
    "OnesColumn",
    "Op",
    "Operand",
    "Permute",
    "Plan",
    "PositionTensor",
    "Positions",
    "PrefixSum",
    "Ratio",
    "Reduce",
    "Reshape",
    "Scale",
    "ScoreArgument",
    "ScoreArith",
    "ScoreIndex",
    "ScoreMap",
    "ScoreMask",
    "ScoreNumber",
    "ScoreRead",
    "ScoreTerm",
    "SegmentSums",
    "Slice",
    "Softmax",
    "SplitChunks",
    "SplitTable",
    "Step",
    "SumAxes",
    "Triangle",
    "Value",
    "VisibleMask",
    "align",
    "causal_kernel_flops",
    "executed_flops",
    "operands",
    "read_groups",
    "reads",
    "score_reads",
    "sdpa_causal_block",
    "show_legs",
    "window_kernel_flops",
]


Op = (
    Reshape
    | Scale
    | SumAxes
    | Matmul
    | Multiply
    | Einsum
    | MaskFill
    | Softmax
    | Normalize
    | Expand
    | Materialize
    | Map
    | LayerNorm
    | Reduce
    | CumulativeScan
    | Convolve
    | SegmentSums
    | Elementwise
    | Ratio
    | OnesColumn
    | PrefixSum
    | Triangle
    | SplitChunks
    | BandBlocks
    | BandMask
    | ChunkEdge
    | DecayedPrefix
    | JoinChunks
    | VisibleMask
    | ScoreMask
    | LiveRows
    | Attention
    | BlockMask
    | FlexAttention
    | Concat
    | Fill
    | MaskNumbers
    | Positions
    | PositionTensor
    | Slice
    | SplitTable
    | GatherAt
    | LiteralCombination
    | Permute
    | BufferUpdate
)


def reads(op: Op) -> list[Value]:
    """The values an op reads, in order."""
    found: list[Value] = []
    for name in op.__dataclass_fields__:
        item = getattr(op, name)
        if isinstance(item, Value):
            found.append(item)
        elif isinstance(item, Operand):
            found.append(item.value)
        elif isinstance(item, Binary):
            found += [o.value for o in operands(item)]
        elif isinstance(item, tuple) and item and isinstance(item[0], Value):
            found += list(item)
        elif isinstance(item, tuple) and item and isinstance(item[0], Operand):
            found += [o.value for o in item]
    return found


@dataclass
class Step:
    """One op of the forward pass, the value it defines and what it costs."""

    kind: str
    op: Op
    out: Value | None
    description: str = ""
    summed: tuple[str, ...] = ()
    flops: sympy.Expr = sympy.S.Zero
    exps: sympy.Expr = sympy.S.Zero
    divisions: sympy.Expr = sympy.S.Zero
    entries: sympy.Expr = sympy.S.Zero  # for box steps: the materialized box entries
    elementwise: sympy.Expr = sympy.S.Zero  # scalings, maps, sums: counted apart from contractions
    paper: sympy.Expr = sympy.S.Zero  # for fused steps: their contractions counted the papers' way
    in_box: bool = False  # computes a softmax box's argument (the papers' "attention scores")
    score_flops: sympy.Expr = sympy.S.Zero  # for fused steps: the FLOPs of their score part
    score_paper: sympy.Expr = sympy.S.Zero
    inputs: tuple[Value, ...] = ()
    training_only: bool = False  # zero in eval mode (a factor is train-mode noise): run in training only
    eval_op: Op | None = None  # a sum's op in eval mode, its train-mode noise terms left out
    wide: bool = False  # computed in float32 at least under autocast (a normalize box's content)
    kernel_flops: sympy.Expr | None = None  # FLOPs the kernel does when it skips masked blocks; None: `flops`


def executed_flops(step: Step) -> sympy.Expr:
    """The FLOPs a step's kernel does: fewer than the dense count where a causal attention
    kernel skips the key blocks above the diagonal (`causal_kernel_flops`)."""
    return step.flops if step.kernel_flops is None else step.kernel_flops


# The CPU flash kernel's tiles (ATen native/cpu/FlashAttentionKernel.cpp, torch 2.x): query blocks
# of 256 rows from 768 queries (64 from 192, else 32) and key blocks of 512 (kv_split_size) at every
# length. A query block lies within one key block, and under is_causal it visits each key block that
# starts at or before its last row, whole: the rows of key block j all visit (j + 1)·512 keys, so
# the kernel skips at the key block's grain (nothing at N ≤ 512). FlexAttention's block mask
# (create_block_mask's BLOCK_SIZE): 128. CUDA's flash kernels use blocks of 64 to 128.
SDPA_KEY_BLOCK = 512


def sdpa_causal_block(length: sympy.Expr) -> sympy.Expr:
    """The block at whose grain the CPU flash kernel skips the keys above the diagonal under
    is_causal over `length` keys (`causal_kernel_flops`'s `block`): its key block."""
    return sympy.Integer(SDPA_KEY_BLOCK)


FLEX_BLOCK = 128


def causal_kernel_flops(flops: sympy.Expr, length: sympy.Expr, block: sympy.Expr) -> sympy.Expr:
    """The FLOPs of a causal attention over `length` queries and keys whose kernel visits, for
    each block of `block` rows, only the keys up to the block's end: L(L + b)/2 of the L² score
    entries with b = min(block, L) (exact when b divides L; an empty triangle's N(N+1)/2 is the
    limit b = 1). For the CPU flash kernel b is its key block of 512 (`sdpa_causal_block`):
    measured on torch 2.13's CPU kernel, one thread, fwd+bwd, is_causal over no mask
    (docs/results/bench-cpu/time-model, section 9): 1.0 at N = 512, 0.75 at 1024, 0.63 at
    2048, 0.57 at 4096, as (N + 512)/(2N) gives; a boolean triangle given as attn_mask 1.08 (it
    skips nothing)."""
    b = sympy.Min(block, length)
    return flops * (length + b) / (2 * length)


def window_kernel_flops(
    flops: sympy.Expr, length: sympy.Expr, block: sympy.Expr, before: sympy.Expr, after: sympy.Expr
) -> sympy.Expr:
    """The FLOPs of an attention under a window (keys i − before < j < i + after) whose kernel
    visits, for each block of `block` query rows, only the key blocks the band reaches: the
    block's b + before + after − 2 keys start anywhere within a key block, so they touch at most
    ⌈(before + after − 2) / b⌉ + 1 key blocks of b, never more than the L keys there are."""
    reached = block * (sympy.ceiling((before + after - 2) / block) + 1)
    return flops * sympy.Min(1, reached / length)


@dataclass(frozen=True)
class ChunkCount:
    """A run-time chunk count ⌈extent / size⌉, bound at entry as `name`."""

    name: str
    extent: sympy.Expr
    size: int


@dataclass(repr=False)
class Plan:
    """The lowered program of a design at some sizes. Printed, and in Jupyter, it shows as the
    plan table (plan/report.py, through PLAN_VIEWS): one row per op with its FLOPs as a formula
    and a number. `choices` and `forms` hold the planner's records of its choices (forms.base's
    BoxChoice, absorb_choice's FormChoice), typed loosely so that the IR imports no planner pass."""

    graph: DesignGraph
    sizes: dict[str, int]  # the sizes planned for, run-time ones included
    leg_sizes: dict[str, sympy.Expr]
    steps: list[Step] = field(default_factory=list)
    update_steps: list[Step] = field(default_factory=list)
    outputs: list[tuple[str, Value]] = field(default_factory=list)
    lowered: list[str] = field(default_factory=list)  # rewrites taken, e.g. boxes lowered to SDPA
    refused: list[str] = field(default_factory=list)  # rewrites not taken, and why
    choices: list = field(default_factory=list)  # each box's candidate forms, costed (forms.base.BoxChoice)
    names: dict[str, str] = field(default_factory=dict)  # .td input/mask/noise name -> variable
    attributes: frozenset[str] = frozenset()  # variables that are the module's stored tensors
    # (N, M) -> a causal triangle, (N, M, before, after) -> a window's band: boolean, True = hidden
    causal: dict[tuple[sympy.Expr, ...], str] = field(default_factory=dict)
    stored: list[str] = field(default_factory=list)  # declared tensors the forward reads
    segments: list[tuple[int, int]] = field(default_factory=list)  # steps recomputed in backward
    chunks: list[ChunkCount] = field(default_factory=list)  # run-time chunk counts
    training_noise: frozenset[str] = frozenset()  # noise variables eval mode never reads (not drawn there)
    device: DeviceModel | None = None  # the planning device the `time` objective estimated on
    compared: dict[str, float] = field(default_factory=dict)  # objective -> its plan's predicted step time (s)
    forms: object | None = None  # the whole-graph form taken, where the design has two (absorb_choice.FormChoice)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        kinds = [step.kind for step in self.steps]
        ops = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
        return f"<tdiag.Plan {self.graph.name} at {sizes}: {len(self.steps)} ops ({ops})>"

    def __str__(self) -> str:
        view = PLAN_VIEWS.get("text")
        return view(self) if view else repr(self)

    def _repr_html_(self) -> str | None:
        view = PLAN_VIEWS.get("html")
        return view(self) if view else None

    def _repr_markdown_(self) -> str | None:
        view = PLAN_VIEWS.get("markdown")
        return view(self) if view else None


PLAN_VIEWS: dict[str, Callable[[Plan], str]] = {}
"""A plan's printers by format ("text", "html", "markdown"): the plan table, registered by
plan/report.py, which sits above the program IR (it reads the footprint and the forms' costs)."""
