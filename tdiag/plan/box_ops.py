"""The ops of a softmax box's lowered forms beyond the tensor ops: chunks and their prefix states
(chunked causal products, decays), bands (windows), the masks and the fused kernels
(scaled_dot_product_attention, FlexAttention with its score_mod terms and block mask)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sympy

from .ops import Operand, Value

if TYPE_CHECKING:
    from ..ir import Position


@dataclass(frozen=True)
class PrefixSum:
    """The exclusive prefix sum of x along `axis` (the state of earlier chunks)."""

    x: Value
    axis: int


@dataclass(frozen=True)
class Triangle:
    """The C×C lower triangle of ones (causal mask within a chunk), in x's dtype and device."""

    size: int
    like: Value


@dataclass(frozen=True)
class SplitChunks:
    """x with axis `axis` zero-padded to `count`·`size` and split into (count, size); with
    `edge` padded with its last entry instead (a decay's log-gate: the padded positions decay no
    further, so no exp of them overflows)."""

    x: Value
    axis: int
    trailing: int  # axes after `axis`
    count: sympy.Expr
    size: int
    length: sympy.Expr
    edge: bool = False


@dataclass(frozen=True)
class ChunkEdge:
    """x read at the first (or, with `last`, the last) position within each chunk along `axis`:
    a view, the reference points of a decay's chunkwise form."""

    x: Value
    axis: int
    last: bool


@dataclass(frozen=True)
class DecayedPrefix:
    """Σ_{c' < c} exp(start[c] − end[c']) x[c'] along axis `axis` (chunks): the states of the
    earlier chunks, each decayed from the end of its chunk to the start of chunk c, carried
    chunk by chunk with one decay factor exp(end[c] − end[c − 1]) ≤ 1 per step (RetNet eq. 7's
    cross-chunk recurrence, Mamba-2's inter-chunk scan)."""

    x: Value
    start: Operand
    end: Operand
    axis: int


@dataclass(frozen=True)
class BandBlocks:
    """x's axis `axis` (of `length` positions) as `count` overlapping blocks of `width` positions,
    block c holding positions c·size − lead .. c·size − lead + width − 1 (zero, or False, outside
    0 .. length − 1): padded by `lead` before and to count·size + width − size − lead after, then
    unfolded and copied (forms/banded.py: the keys and values a block of queries may see)."""

    x: Value
    axis: int
    trailing: int  # axes after `axis`
    count: sympy.Expr
    size: int
    width: int
    lead: int
    length: sympy.Expr


@dataclass(frozen=True)
class BandMask:
    """The boolean (count, size, width) mask of a banded attention, True where hidden: query
    i = c·size + r sees key j = c·size − (before − 1) + t where i − before < j < i + after and
    0 ≤ j < length; a query past the length (padding of the last block) hides nothing, so that
    no row is empty."""

    count: sympy.Expr
    size: int
    width: int
    before: int
    after: int
    length: sympy.Expr
    like: str | None


@dataclass(frozen=True)
class JoinChunks:
    """(chunks, within) axes at `position` joined into one and cut to `length`."""

    x: Operand
    position: int
    length: sympy.Expr


@dataclass(frozen=True)
class VisibleMask:
    """SDPA's boolean attn_mask (True = attend) from a causal triangle over flattened keys."""

    causal: Operand
    sizes: tuple[sympy.Expr, ...]
    rows: sympy.Expr


@dataclass(frozen=True)
class ScoreMask:
    """SDPA's float attn_mask, read as (batch, heads, queries, keys) by broadcasting: the sum of
    the additive `bias` terms, plus the dtype's lowest number wherever one of the `hidden`
    boolean operands holds (a padding mask inverted, a causal triangle). The lowest number, not
    -inf and not a boolean attn_mask: it is the materialized box's masked_fill, so a row whose
    keys are all hidden averages the values as the box does (a boolean mask gives zeros), and
    lowest + a finite bias rounds back to lowest."""

    hidden: tuple[Operand, ...]
    bias: tuple[Operand, ...]
    like: Value  # the dtype and device of the scores
    future: Operand | None = None  # a causal triangle: -inf there, even over a padded row


@dataclass(frozen=True)
class LiveRows:
    """Which rows of the scores keep a visible key: not every one of the `hidden` boolean
    operands' keys hidden, reduced over the last (keys) axis and kept as a unit axis. A row whose
    keys are all hidden averages the values (the materialized box's masked_fill), independently
    of its scores."""

    hidden: tuple[Operand, ...]


@dataclass(frozen=True)
class Attention:
    """scaled_dot_product_attention(q, k, v). With `bias`, q gains a feature of ones and k the
    bias, so that [q, 1]·[k, bias] = q·k + bias/scale (MGK P17); `pad_value`/`pad_query_key`
    zero-pad to one head width and `width` slices the output back. `grouped`: q has more heads
    than k and v, each key head serving a run of consecutive query heads (enable_gqa: multi-query
    and grouped-query attention), `group` query heads per key head. With `live` (LiveRows) a
    row whose keys are all hidden is the mean of the values, taken apart from the kernel: its
    backward, from a log-sum-exp of lowest numbers, weighs every value 1 instead of 1/M, and the
    row's output must pass no gradient to q, k or a bias (they do not change it). Under a causal
    mask (`future`, True above the diagonal) the mean is over the keys the row may see. With
    `repeat` R > 1 each query row is repeated R times (rows n·R .. n·R + R − 1), the call is
    causal over the square of N·R rows and keys (key j = m·R + r) and the output keeps the rows
    n·R + R − 1, which see exactly the keys of the positions m ≤ n (forms/sdpa_repeated.py).
    With `sink` (over q's axes but its features) each row's denominator has exp(sink) more: one
    call through the generated `_sink_attention` (forms/sdpa_sink.py)."""

    q: Operand
    k: Operand
    v: Operand
    scale: sympy.Expr
    causal: bool = False
    mask: Value | None = None
    bias: Operand | None = None
    pad_value: int = 0
    pad_query_key: int = 0
    width: int | None = None
    shape: tuple[sympy.Expr, ...] | None = None
    grouped: bool = False
    group: sympy.Expr = sympy.S.One
    live: Value | None = None
    future: Operand | None = None
    repeat: sympy.Expr = sympy.S.One
    sink: Operand | None = None  # a logit per query row in the denominator (forms/sdpa_sink.py)


@dataclass(frozen=True)
class ScoreRead:
    """A score_mod term: `value` read at one index per axis, each an integer position of the
    kernel's index arguments (batch, head, query, key), e.g. Rel[h, clamp(kv − q, −C, C) + C]."""

    value: Value
    index: tuple[Position, ...]


@dataclass(frozen=True)
class ScoreIndex:
    """A score_mod term: an integer position of the index arguments as a number in the
    scores' dtype (`index(n)` inside a box: the query index q)."""

    position: Position


@dataclass(frozen=True)
class ScoreNumber:
    """A score_mod term: a number or a formula in run-time sizes."""

    value: sympy.Expr


@dataclass(frozen=True)
class ScoreMap:
    """A score_mod term: an elementwise map (the names of `Map`) of another term."""

    name: str
    x: ScoreTerm
    params: tuple[sympy.Expr, ...] = ()


@dataclass(frozen=True)
class ScoreArith:
    """A score_mod term: `left op right`, op one of + - * /."""

    op: str
    left: ScoreTerm
    right: ScoreTerm


@dataclass(frozen=True)
class ScoreArgument:
    """A score_mod term: the kernel's score argument, scale · q·k (in a map of the scores)."""


ScoreTerm = ScoreRead | ScoreIndex | ScoreNumber | ScoreMap | ScoreArith | ScoreArgument


def score_reads(term: ScoreTerm | None) -> Iterator[ScoreRead]:
    """The tensors a score_mod or mask_mod term reads, left to right."""
    if isinstance(term, ScoreRead):
        yield term
    elif isinstance(term, ScoreMap):
        yield from score_reads(term.x)
    elif isinstance(term, ScoreArith):
        yield from score_reads(term.left)
        yield from score_reads(term.right)


@dataclass(frozen=True)
class BlockMask:
    """FlexAttention's block mask of a causal mask: key j visible from query i where i ≥ j, so
    that the kernel skips the blocks above the diagonal. `arguments` names mask_mod's (batch,
    head, query, key) parameters."""

    queries: sympy.Expr
    keys: sympy.Expr
    arguments: tuple[str, str, str, str]
    like: str | None
    # a window's (before, after): key j visible from query i where i − before < j < i + after
    window: tuple[sympy.Expr, sympy.Expr] | None = None


@dataclass(frozen=True)
class FlexAttention:
    """torch's flex_attention over q, k, v laid out (batch, heads, positions, features):
    softmax(scale · q·k + score) v, the additive `score` a score_mod evaluated per (batch, head,
    query, key) from the tensors in `tensors` (none of them over both positions unless the design
    stores one). A causal mask alone is `block_mask`; with padding masks (`visible`, True =
    attend) the score_mod sets masked scores to the dtype's lowest number (`causal` adds i ≥ j),
    so that a row whose keys are all masked averages the values as the materialized box does;
    such a row is taken apart with `live` as in Attention.
    `arguments` names score_mod's (score, batch, head, query, key) parameters; `shape` regroups
    the 4-D output to the result's legs."""

    q: Operand
    k: Operand
    v: Operand
    scale: sympy.Expr
    score: ScoreTerm | None
    block_mask: Value | None
    arguments: tuple[str, str, str, str, str]
    tensors: tuple[Value, ...] = ()
    grouped: bool = False
    shape: tuple[sympy.Expr, ...] | None = None
    visible: tuple[ScoreRead, ...] = ()
    causal: bool = False
    group: sympy.Expr = sympy.S.One
    live: Value | None = None
    future: Operand | None = None
    window: tuple[sympy.Expr, sympy.Expr] | None = None  # with `causal`: the window's band instead of i ≥ j
    mapped: bool = False  # `score` is score_mod's whole value (a map of the scores), not added to it
