"""The tensor ops of the lowered program: contractions (matmul, multiply, einsum), maps and
reductions, scans and convolutions, masks and softmax/normalize boxes as torch runs them, tables
and positions. Each is a frozen dataclass over Values and Operands holding no Python text; the
footprint (footprint_*.py), the time model (timing.py) and codegen each keep one rule per op.

Values of the lowered program and how an op reads them. A Value is a tensor of the forward
whose `legs` are its axes in memory order (BATCH first when it carries the batch); an Operand
reads a value permuted, regrouped and broadcast, all views; a Binary tree adds or divides aligned
operands. Everything above the program IR (ops, steps, the footprint, codegen) names tensors
through these."""

from __future__ import annotations

from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

import sympy

if TYPE_CHECKING:
    from ..ir import Position

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


def operands(tree: Binary | Operand) -> Iterator[Operand]:
    """The leaves of a sum or quotient tree, left to right."""
    if isinstance(tree, Operand):
        yield tree
    else:
        yield from operands(tree.left)
        yield from operands(tree.right)


# ---- ops ----------------------------------------------------------------------------------


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
    max that stabilizes a causal product's exponents, quotient_shift.py): inclusive, or `exclusive`
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
