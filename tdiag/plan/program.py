"""The lowered program: typed ops over named values with explicit physical layouts.

The planner emits Steps; each Step holds one op (a dataclass below, no Python text), the value
it defines and its costs. `codegen` is the only reader that prints Python; `cost` reads the
costs. A Value's `legs` are its axes in memory order (BATCH first when it carries the batch);
an Operand says how an op reads a value: permuted, regrouped and broadcast, all views."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import sympy

from ..device import DeviceModel
from ..graph import DesignGraph
from ..ir import ONE, ZERO, Position

if TYPE_CHECKING:
    from .absorb_choice import FormChoice
    from .forms.base import BoxChoice

BATCH = "#b"
BATCH_SIZE = sympy.Symbol("B", positive=True)


@dataclass(frozen=True)
class Value:
    """A tensor of the forward: a variable whose axes are `legs`. `broadcast` legs are logical
    legs the value is constant along and so does not store."""

    var: str
    legs: tuple[str, ...]
    broadcast: frozenset[str] = frozenset()

    @property
    def is_batched(self) -> bool:
        return BATCH in self.legs


def show_legs(legs: Iterable[str]) -> list[str]:
    """Legs as the user wrote them: the batch is b, a renamed copy d'3 is shown as d."""
    return ["b" if leg == BATCH else leg.split("'")[0] for leg in legs]


@dataclass(frozen=True)
class Operand:
    """How an op reads `value`: axes permuted, then regrouped to `shape`, then unit axes
    inserted where `index` is False so that it broadcasts; `invert` negates a boolean mask."""

    value: Value
    permutation: tuple[int, ...] | None = None
    shape: tuple[sympy.Expr, ...] | None = None
    index: tuple[bool, ...] | None = None
    invert: bool = False


def align(value: Value, target: tuple[str, ...], invert: bool = False) -> Operand:
    """Read `value` so it broadcasts against axes `target` (permuted, unit axes inserted)."""
    legs = value.legs
    present = [leg for leg in target if leg in legs]
    permutation = None
    if list(legs) != present:
        permutation = tuple(legs.index(leg) for leg in present)
    if present == list(target):
        return Operand(value, permutation, invert=invert)
    return Operand(value, permutation, index=tuple(leg in legs for leg in target), invert=invert)


def read_groups(value: Value, groups: list[list[str]], group_size: Callable[[list[str]], sympy.Expr]) -> Operand:
    """`value` permuted to the legs of `groups` in order, one axis per group (of size
    `group_size(group)`); an empty group is a unit axis inserted by indexing."""
    order = [leg for g in groups for leg in g]
    permutation = None
    if list(value.legs) != order:
        permutation = tuple(value.legs.index(leg) for leg in order)
    kept = [g for g in groups if g]
    index = tuple(bool(g) for g in groups) if len(kept) < len(groups) else None
    if all(len(g) == 1 for g in kept):
        return Operand(value, permutation, index=index)
    return Operand(value, permutation, tuple(group_size(g) for g in kept), index)


@dataclass(frozen=True)
class Binary:
    """An elementwise `left op right` of aligned operands (a node of a sum or quotient tree)."""

    op: str  # "+", "-" or "/"
    left: Binary | Operand
    right: Binary | Operand


# ---- ops -------------------------------------------------------------------------------------


@dataclass(frozen=True)
class Reshape:
    """A stored tensor viewed with its axes split into pieces (Kronecker-structured legs)."""

    x: Value
    shape: tuple[sympy.Expr, ...]


@dataclass(frozen=True)
class Scale:
    """x · factor, a number or a formula in run-time sizes."""

    x: Value
    factor: sympy.Expr


@dataclass(frozen=True)
class SumAxes:
    """Σ of x over the axes `dims`."""

    x: Value
    dims: tuple[int, ...]


@dataclass(frozen=True)
class Matmul:
    """a @ b (batched), the result regrouped to `shape` when given. With `bias` (bias_fusion.py),
    a projection with a bias in one kernel: a is read as rows (its leading axes flattened), b is
    a matrix, bias a vector over b's columns: addmm(bias, a, b), then regrouped to `shape`."""

    a: Operand
    b: Operand
    shape: tuple[sympy.Expr, ...] | None = None
    bias: Operand | None = None

    @property
    def matvec(self) -> bool:
        """Whether b's matrices have one column (a unit axis inserted last) and there is no bias:
        a batch of matrix-vector products, which codegen runs through `_matvec` (torch's CPU bmm
        takes a column vector several times slower than a row vector) and the footprint and the
        time model read as such."""
        b = self.b
        if self.bias is not None:
            return False
        if b.index is not None:
            return not b.index[-1]
        return b.shape is not None and len(b.shape) > 1 and b.shape[-1] == 1


@dataclass(frozen=True)
class Multiply:
    """a * b of operands aligned by broadcasting (each read through a permutation and unit axes,
    views both): a pairwise contraction that sums nothing, such as Tuformer's C·Q or FiSH's σ·ε,
    done as one multiply per output element instead of a matmul with inner size 1. With
    `summed`, the product is then summed over those axes: a batched dot product with no free
    leg on either side, such as the key norm ‖k‖² (printed `x.square().sum(...)` when both
    operands read the same tensor alike). Autograd saves the operands (one, for a square); the
    result has the aligned axes less the summed ones and is never larger than the product."""

    a: Operand
    b: Operand
    summed: tuple[int, ...] = ()


@dataclass(frozen=True)
class Einsum:
    """The fallback contraction for what a matmul cannot say (a leg repeated in one operand)."""

    equation: str
    operands: tuple[Value, ...]


@dataclass(frozen=True)
class MaskFill:
    """x with the entries where `mask` holds set to `fill`: the dtype's lowest number before a
    softmax ("lowest"), zero before a normalize."""

    x: Value
    mask: Operand
    fill: str  # "lowest", "-inf" (a causal mask before a softmax) or "zero"


@dataclass(frozen=True)
class Softmax:
    """Softmax over the last `count` axes of x (flattened together when more than one). With
    `sink` (read over x's leading axes and one unit axis) each row's denominator has one more
    term exp(sink), the max taken over the row and its sink."""

    x: Operand
    count: int
    normalized: tuple[sympy.Expr, ...]
    sink: Operand | None = None


@dataclass(frozen=True)
class Normalize:
    """x / (Σ x + eps) over the last `count` axes (a normalize box, MGK's E-step)."""

    x: Operand
    count: int
    eps: sympy.Expr
    guard: bool = False  # a zero sum reads as 1: stabilized exp factors that all underflowed give 0


@dataclass(frozen=True)
class Expand:
    """x with new trailing axes of `sizes` (a broadcast leg an op needs as a real axis)."""

    x: Value
    sizes: tuple[sympy.Expr, ...]


@dataclass(frozen=True)
class Materialize:
    """x broadcast to `shape` and copied (an operand that must be dense)."""

    x: Operand
    shape: tuple[sympy.Expr, ...]


@dataclass(frozen=True)
class Map:
    """An elementwise map: exp, log, relu, elu1 (elu + 1), sigmoid, tanh, softplus, silu, gelu,
    sin, cos, sqrt, abs, clamp, maximum, minimum (max and min with a bound), pow."""

    x: Value
    name: str
    params: tuple[sympy.Expr, ...] = ()


@dataclass(frozen=True)
class LayerNorm:
    """torch.nn.functional.layer_norm of x over its trailing axes of `shape` (norms.py): x
    minus its mean, over the root of its mean square plus eps, times `weight`, plus `bias`
    (each over those axes, or None)."""

    x: Operand
    shape: tuple[sympy.Expr, ...]
    eps: sympy.Expr
    weight: Operand | None = None
    bias: Operand | None = None


@dataclass(frozen=True)
class Reduce:
    """A nonlinear reduction of x over `dims`: max, logsumexp, mean. A mean with `hidden`
    operands (x zeroed where they hold) divides by the count of visible entries, at least 1."""

    x: Value
    method: str  # "amax", "logsumexp", "mean"
    dims: tuple[int, ...]
    hidden: tuple[Operand, ...] = ()


@dataclass(frozen=True)
class CumulativeScan:
    """A prefix scan of x along axis `dim` (`method` cumsum, logcumsumexp or cummax, the running
    max that stabilizes a causal product's exponents, stabilize.py): inclusive, or `exclusive`
    (shifted by one, the empty sum first: 0, or −inf in log space); from the end when `reverse`
    (suffix sums). One pass over x, one operation per entry."""

    x: Value
    method: str  # "cumsum", "logcumsumexp", "cummax"
    dim: int
    exclusive: bool = False
    reverse: bool = False


@dataclass(frozen=True)
class Convolve:
    """Σ_k kernel[c, k] · x[..., c, p + k − before] along the axes `dims` of x (zero outside):
    one grouped torch convolution (conv1d/2d/3d by the number of dims), x's axes `channels` (in
    the kernel's order) its groups, its other axes the batch. `kernel` is read as (channels,
    taps); `pads` are the (before, after) zeros of each dim; the taps of axes `flips` (counted
    among the taps) are reversed first (a shift that counts backwards)."""

    x: Value
    kernel: Operand
    dims: tuple[int, ...]
    channels: tuple[int, ...]
    pads: tuple[tuple[sympy.Expr, sympy.Expr], ...]
    flips: tuple[int, ...] = ()


@dataclass(frozen=True)
class SegmentSums:
    """The segment sums of x along axis `dim`: a result with x's other axes, then (n, m), entry
    Σ_{k=m+1..n} x_k for m ≤ n and −inf for m > n, computed as Mamba-2's reference `segsum`
    does: x repeated along m, zeroed where k ≤ m, summed cumulatively along k (no difference of
    two long running sums, whose rounding error grows with the length), −inf above the diagonal."""

    x: Value
    dim: int


@dataclass(frozen=True)
class Elementwise:
    """A sum or quotient tree of aligned operands, negated as a whole when `negate`."""

    tree: Binary | Operand
    negate: bool = False


@dataclass(frozen=True)
class Ratio:
    """numerator / (denominator + eps): the linear-time order of a normalize box."""

    numerator: Value
    denominator: Operand
    eps: sympy.Expr
    guard: bool = False  # a zero denominator reads as 1 (as Normalize's guard)
    column: int | None = None  # the numerator's axis holding [values, denominator]: its last entry divides the others


@dataclass(frozen=True)
class OnesColumn:
    """x with one entry of ones appended along axis `axis` (`trailing` axes after it): values
    [v, 1], whose contraction with a normalize box's content gives its numerator and, in the
    last column, its denominator in one pass (Katharopoulos et al. §3.2)."""

    x: Value
    axis: int
    trailing: int


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
    group: sympy.Expr = ONE
    live: Value | None = None
    future: Operand | None = None
    repeat: sympy.Expr = ONE
    sink: Operand | None = None  # a logit per query row in the denominator (forms/sdpa_sink.py)


@dataclass(frozen=True)
class Concat:
    """The operands joined along their last axis (the query or key sides of several query·key
    products made one product for SDPA); the other axes agree."""

    parts: tuple[Operand, ...]


@dataclass(frozen=True)
class Fill:
    """A constant term (a number or a formula in run-time sizes such as log N) as a 0-dim tensor
    in the dtype and on the device of the variable `like`; it broadcasts against any operand."""

    value: sympy.Expr
    like: str | None


@dataclass(frozen=True)
class MaskNumbers:
    """A boolean mask read as the numbers 1 (attend) and 0 (hidden) in the dtype of `like`: a
    mask used as a factor zeroes the entries it hides."""

    mask: Operand
    like: str | None


@dataclass(frozen=True)
class Positions:
    """`index(n)`: 0, 1, ..., size − 1 in the dtype and on the device of the variable `like`,
    made from the run-time size (viewed as `shape` when the leg is split into pieces)."""

    shape: tuple[sympy.Expr, ...]
    like: str | None


@dataclass(frozen=True)
class PositionTensor:
    """An integer position of legs (a gather's address, e.g. clamp(m − n, −K, K) + K) over axes
    `legs` of run-time `sizes`, on the device of `like`."""

    position: Position
    legs: tuple[str, ...]
    sizes: tuple[sympy.Expr, ...]
    like: str | None


@dataclass(frozen=True)
class Slice:
    """A stored table read at `extent` entries from entry `start` along axis `dim` (of `size`
    entries), for each (dim, extent, size) in `dims` and start in `starts` (all 0 when empty): a
    view; the forward checks start + extent <= size where the planner could not."""

    x: Value
    dims: tuple[tuple[int, sympy.Expr, sympy.Expr], ...]
    name: str = ""
    labels: tuple[tuple[str, str, str], ...] = ()  # per dim: (leg, extent or range, size) as the .td writes them
    starts: tuple[sympy.Expr, ...] = ()
    piece: int | None = None  # x is a SplitTable's pieces and this slice is piece `piece` of them

    def start(self, k: int) -> sympy.Expr:
        """The first entry read along the k-th sliced dim."""
        return self.starts[k] if self.starts else sympy.Integer(0)


@dataclass(frozen=True)
class SplitTable:
    """A stored table cut along axis `dim` into consecutive pieces of `sizes` entries, once per
    program (torch's split: views, whose backward joins the pieces' gradients in one tensor, where
    separate slices would each fill a table-sized gradient with zeros and add them up). Its
    result is the pieces, read by Slice steps with `piece` set."""

    x: Value
    dim: int
    sizes: tuple[sympy.Expr, ...]


@dataclass(frozen=True)
class GatherAt:
    """x read along its axis `dim` at the integer positions `index`: the result has x's other
    axes, then index's axes (advanced indexing, x[..., index] with dim moved last). Where the
    axis has a run-time length, the forward first checks that `checked` is inside it."""

    x: Operand
    dim: int
    index: Value
    checked: int | None = None  # the largest position, compared with the axis's run-time length
    name: str = ""  # the table and its axis, as the .td writes them (for that error)
    axis: str = ""


@dataclass(frozen=True)
class LiteralCombination:
    """A small constant C of known entries applied to x, unrolled (RoPE's rotation generator
    R = [[0, −1], [1, 0]] becomes the signed pair swap (−x₂, x₁), RoFormer eq. 34): result
    slice i, for i running row-major over the new trailing axes of `sizes`, is the sum over
    `rows[i]` of coefficient · x[..., index, ...], x read at the integer positions `index` along
    its axes `dims` (views); the slices are stacked. C's zero entries have no term. No matmul, no
    expanded copy, and autograd saves nothing."""

    x: Value
    dims: tuple[int, ...]
    sizes: tuple[int, ...]
    rows: tuple[tuple[tuple[sympy.Expr, tuple[int, ...]], ...], ...]


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
    group: sympy.Expr = ONE
    live: Value | None = None
    future: Operand | None = None
    window: tuple[sympy.Expr, sympy.Expr] | None = None  # with `causal`: the window's band instead of i ≥ j
    mapped: bool = False  # `score` is score_mod's whole value (a map of the scores), not added to it


@dataclass(frozen=True)
class Permute:
    """x with its axes reordered (an output laid out in its declared order)."""

    x: Value
    permutation: tuple[int, ...]


@dataclass(frozen=True)
class BufferUpdate:
    """A state update: buffer `target` ← x (averaged over the batch when batched), no gradient."""

    target: str
    x: Value
    shape: tuple[sympy.Expr, ...]


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


def operands(tree: Binary | Operand) -> Iterator[Operand]:
    """The leaves of a sum or quotient tree, left to right."""
    if isinstance(tree, Operand):
        yield tree
    else:
        yield from operands(tree.left)
        yield from operands(tree.right)


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
    flops: sympy.Expr = ZERO
    exps: sympy.Expr = ZERO
    divisions: sympy.Expr = ZERO
    entries: sympy.Expr = ZERO  # for box steps: the materialized box entries
    elementwise: sympy.Expr = ZERO  # scalings, maps, sums: counted apart from contractions
    paper: sympy.Expr = ZERO  # for fused steps: their contractions counted the papers' way
    in_box: bool = False  # computes a softmax box's argument (the papers' "attention scores")
    score_flops: sympy.Expr = ZERO  # for fused steps: the FLOPs of their score part
    score_paper: sympy.Expr = ZERO
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
    """The lowered program of a design at some sizes. In Jupyter it shows as the plan table
    (plan/report.py): one row per op with its FLOPs as a formula and a number."""

    graph: DesignGraph
    sizes: dict[str, int]  # the sizes planned for, run-time ones included
    leg_sizes: dict[str, sympy.Expr]
    steps: list[Step] = field(default_factory=list)
    update_steps: list[Step] = field(default_factory=list)
    outputs: list[tuple[str, Value]] = field(default_factory=list)
    lowered: list[str] = field(default_factory=list)  # rewrites taken, e.g. boxes lowered to SDPA
    refused: list[str] = field(default_factory=list)  # rewrites not taken, and why
    choices: list[BoxChoice] = field(default_factory=list)  # each box's candidate forms, costed (forms/)
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
    forms: FormChoice | None = None  # the whole-graph form taken, where the design has two (absorb_choice.py)

    def __repr__(self) -> str:
        sizes = ", ".join(f"{k}={v}" for k, v in self.sizes.items())
        kinds = [step.kind for step in self.steps]
        ops = ", ".join(f"{kinds.count(k)} {k}" for k in dict.fromkeys(kinds))
        return f"<tdiag.Plan {self.graph.name} at {sizes}: {len(self.steps)} ops ({ops})>"

    def __str__(self) -> str:
        from .report import plan_table

        return plan_table(self)

    def _repr_html_(self) -> str:
        from .report import plan_html

        return plan_html(self)

    def _repr_markdown_(self) -> str:
        from .report import plan_markdown

        return plan_markdown(self)
