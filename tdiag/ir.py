"""The design graph's dataclasses: sizes, legs, tensors, statements and the expression nodes
(contraction, sum node, softmax box, elementwise map, reduction, scan, segment sum, convolution,
squared distance). Every node
knows its output legs and its Span, so later stages never look at text."""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import ClassVar

import sympy

from .errors import Span

ONE = sympy.Integer(1)
ZERO = sympy.Integer(0)


@dataclass(frozen=True)
class Size:
    """A size symbol (`F`, `H`, `D = F / H`); `definition` is None for a run-time size like N."""

    name: str
    symbol: sympy.Symbol
    definition: sympy.Expr | None
    span: Span

    @property
    def is_free(self) -> bool:
        return self.definition is None


@dataclass(frozen=True)
class Leg:
    """A leg (index) and the size symbol it is bound to, with where it was first bound."""

    name: str
    size: sympy.Expr
    span: Span
    bound_by: str


@dataclass(frozen=True)
class Axis:
    leg: str
    size: sympy.Expr


@dataclass(frozen=True)
class Init:
    """An initializer or constant fill: `normal(std=...)`, `identity(scale=...)`, `ones`, ..."""

    name: str
    params: tuple[tuple[str, sympy.Expr | str], ...] = ()
    span: Span | None = None
    values: tuple[sympy.Expr, ...] = ()  # `values(0, -1, 1, 0)`: the entries, row-major

    def param(self, key: str, default: sympy.Expr | str | None = None) -> sympy.Expr | str | None:
        return dict(self.params).get(key, default)

    def __str__(self) -> str:
        if self.values:
            return "values(" + ", ".join(str(v) for v in self.values) + ")"
        if not self.params:
            return self.name
        return f"{self.name}(" + ", ".join(f"{k}={v}" for k, v in self.params) + ")"


TENSOR_KINDS = ("input", "mask", "param", "const", "random", "buffer", "derived")


@dataclass
class Tensor:
    """A node of the diagram. Declared tensors have an `init`; derived ones a `statement`."""

    name: str
    kind: str
    axes: tuple[Axis, ...]
    span: Span
    init: Init | None = None
    statement: Statement | None = None
    is_constant: bool = False

    @property
    def legs(self) -> tuple[str, ...]:
        return tuple(a.leg for a in self.axes)

    @property
    def shape(self) -> tuple[sympy.Expr, ...]:
        return tuple(a.size for a in self.axes)

    @property
    def numel(self) -> sympy.Expr:
        return sympy.Mul(*self.shape)

    @property
    def is_trainable(self) -> bool:
        return self.kind == "param"

    @property
    def is_batched(self) -> bool:
        """Inputs, masks and random nodes carry the implicit leading batch dims."""
        return self.kind in ("input", "mask", "random")


# ---- expression nodes ----------------------------------------------------------------------


@dataclass(frozen=True)
class Expr:
    """An expression node. Its children are the fields holding an Expr or a tuple of Exprs, found
    from the dataclass's fields, so a new kind is walked and rewritten whatever its fields are
    called."""

    legs: tuple[str, ...]
    span: Span
    kind: ClassVar[str] = "expr"

    def children(self) -> tuple[Expr, ...]:
        """The sub-expressions, in field order (a tuple field's items in place)."""
        found: list[Expr] = []
        for name in _field_names(type(self)):
            value = getattr(self, name)
            if isinstance(value, Expr):
                found.append(value)
            elif _is_expr_tuple(value):
                found.extend(value)
        return tuple(found)


_CHILD_FIELDS: dict[type, tuple[str, ...]] = {}


def _field_names(kind: type) -> tuple[str, ...]:
    """An expression class's dataclass fields that may hold children (not its legs or span)."""
    names = _CHILD_FIELDS.get(kind)
    if names is None:
        names = _CHILD_FIELDS[kind] = tuple(f.name for f in dataclasses.fields(kind) if f.name not in ("legs", "span"))
    return names


def _is_expr_tuple(value: object) -> bool:
    return isinstance(value, tuple) and bool(value) and all(isinstance(item, Expr) for item in value)


@dataclass(frozen=True)
class TensorRef(Expr):
    """A tensor used in a statement; `groups[i]` are the legs naming its axis i (a reshape when
    more than one)."""

    name: str = ""
    groups: tuple[tuple[str, ...], ...] = ()
    slices: tuple[sympy.Expr | None, ...] = ()  # per axis: read only its first k entries (`P[n: N, f]`)
    offsets: tuple[sympy.Expr, ...] = ()  # per axis: the first entry a slice reads (`W[j: a..b]`); () = all 0
    kind: ClassVar[str] = "tensor"

    @property
    def is_reshaped(self) -> bool:
        return any(len(g) != 1 for g in self.groups)

    @property
    def is_sliced(self) -> bool:
        return any(k is not None for k in self.slices)

    def offset(self, axis: int) -> sympy.Expr:
        """The first entry that axis `axis` is read from (0 unless a range `a..b` starts it later)."""
        return self.offsets[axis] if self.offsets else sympy.Integer(0)


@dataclass(frozen=True)
class Scalar(Expr):
    value: sympy.Expr = ONE
    kind: ClassVar[str] = "scalar"


@dataclass(frozen=True)
class Contraction(Expr):
    """Einstein product: `summed` legs are contracted, `batch` legs are kept and shared."""

    factors: tuple[Expr, ...] = ()
    coefficient: sympy.Expr = ONE
    summed: tuple[str, ...] = ()
    batch: tuple[str, ...] = ()
    kind: ClassVar[str] = "contraction"


@dataclass(frozen=True)
class SumNode(Expr):
    """Elementwise sum of terms with broadcasting over legs a term lacks (biases, noise)."""

    terms: tuple[Expr, ...] = ()
    signs: tuple[int, ...] = ()
    kind: ClassVar[str] = "sum"


@dataclass(frozen=True)
class Quotient(Expr):
    numerator: Expr | None = None
    denominator: Expr | None = None
    kind: ClassVar[str] = "quotient"


@dataclass(frozen=True)
class CausalMask:
    """Key leg `key` may attend only where its index is <= that of query leg `query`."""

    query: str
    key: str
    span: Span


@dataclass(frozen=True)
class PaddingMask:
    tensor: TensorRef
    span: Span


@dataclass(frozen=True)
class WindowMask:
    """`window(n, m, W)` / `window(n, m, L, R)`: key leg `key` visible from query leg `query`
    where query − before < key < query + after. The one-sided window(n, m, W) is before = W,
    after = 1: the query and the W − 1 keys before it (HF Mistral's and Gemma2's
    sliding_window: masking_utils.sliding_window_overlay keeps kv_idx > q_idx − sliding_window,
    beside the causal kv_idx ≤ q_idx), so it is causal; with after > 1 it is a two-sided local
    window (an encoder's). Both widths are fixed positive sizes."""

    query: str
    key: str
    before: sympy.Expr
    after: sympy.Expr
    span: Span

    @property
    def is_causal(self) -> bool:
        """Whether it hides every key after the query (after = 1), as a causal mask does."""
        return self.after == 1

    def __str__(self) -> str:
        """As written: `window(n, m, W)`, or `window(n, m, L, R)` when two-sided."""
        widths = f"{self.before}" if self.is_causal else f"{self.before}, {self.after}"
        return f"window({self.query}, {self.key}, {widths})"


Mask = CausalMask | WindowMask | PaddingMask
POSITION_MASKS = (CausalMask, WindowMask)  # masks of a query and a key position: −inf where they hide


@dataclass(frozen=True)
class CausalFactor(Expr):
    """`causal(n, m)` used as a factor: 1 where key index m <= query index n, else 0. A map's
    causal mask and `with_causal_mask` on an un-normalized attention multiply by it (zeroing)."""

    query: str = ""
    key: str = ""
    kind: ClassVar[str] = "causal"


@dataclass(frozen=True)
class WindowFactor(Expr):
    """`window(n, m, W)` (or `window(n, m, L, R)`) used as a factor: 1 where the key is inside the
    query's window (WindowMask), else 0; what a map's window mask multiplies by."""

    query: str = ""
    key: str = ""
    before: sympy.Expr = ONE
    after: sympy.Expr = ONE
    kind: ClassVar[str] = "window"

    @property
    def mask(self) -> WindowMask:
        return WindowMask(self.query, self.key, self.before, self.after, self.span)


@dataclass(frozen=True)
class PositionIndex(Expr):
    """`index(n)`: the constant rank-1 tensor over leg n whose entry i is i (a float in the
    compute dtype), made in the forward from the run-time size of n, never stored at a maximum
    length. RoPE's angles index(n)·θ[p] and ALiBi's slope[h]·(index(m) − index(n)) use it."""

    leg: str = ""
    kind: ClassVar[str] = "index"


@dataclass(frozen=True)
class Position:
    """An integer position expression of legs, numbers and sizes (the address of a gather):
    `op` is "leg" (name), "number" (value), "+", "-", "*", "/" (operands), "neg", "abs",
    "floor", "log" (one operand), "min", "max" (two) or "clamp" (operand, low, high as further
    operands). "/" is real division and "log" the natural logarithm: a node with either below it
    is real (computed in float32, as T5's relative buckets are) until `floor` makes it whole;
    `floor(a / b)` of two whole operands is integer floor division."""

    op: str
    name: str = ""
    value: sympy.Expr = ZERO
    operands: tuple[Position, ...] = ()

    def legs(self) -> tuple[str, ...]:
        if self.op == "leg":
            return (self.name,)
        return tuple(dict.fromkeys(leg for o in self.operands for leg in o.legs()))

    def is_real(self) -> bool:
        """Whether the value is real rather than whole (a quotient or log not yet floored)."""
        if self.op in ("/", "log"):
            return True
        if self.op == "number":
            return self.value.is_integer is False  # a size is a whole number
        if self.op in ("leg", "floor"):
            return False
        return any(o.is_real() for o in self.operands)

    def __str__(self) -> str:
        """As a .td writes it, with parentheses only where precedence needs them."""
        if self.op == "leg":
            return self.name
        if self.op == "number":
            text = str(self.value)
            return text if self.value.is_Atom else f"({text})"
        if self.op == "neg":
            return f"-{self._side(self.operands[0], 3, False)}"
        if self.op in ("clamp", "abs", "floor", "log", "min", "max"):
            return f"{self.op}(" + ", ".join(str(o) for o in self.operands) + ")"
        level = _PRECEDENCE[self.op]
        left, right = self.operands
        return f"{self._side(left, level, False)} {self.op} {self._side(right, level, True)}"

    @staticmethod
    def _side(operand: Position, level: int, right: bool) -> str:
        inner = _PRECEDENCE.get(operand.op, 4)
        needs = inner < level or (right and inner == level)
        return f"({operand})" if needs else str(operand)


_PRECEDENCE = {"+": 1, "-": 1, "*": 2, "/": 2, "neg": 3}


@dataclass(frozen=True)
class Gather(Expr):
    """`Rel[h, r = clamp(m - n, -K, K) + K]`: the tensor `source` (used with its own legs) read
    along its leg `axis` at the integer position `position` of other legs: the result has the
    source's other legs and the position's legs (Shaw et al. 2018 / T5 relative position bias).
    A gather, never a one-hot N·N·R contraction. Where the axis has a run-time length, `checked`
    is the largest position (proved by check), compared with the length when the module runs."""

    source: TensorRef | None = None
    axis: str = ""
    position: Position | None = None
    checked: int | None = None  # the largest position, checked against a run-time axis length
    kind: ClassVar[str] = "gather"


@dataclass(frozen=True)
class SoftmaxBox(Expr):
    """Tuformer's dotted box with a filled ball on the `normalized` legs, labelled `scale` (α).
    With `is_exp=False` it is the normalize box (x / Σ x) of linear attention. A softmax box may
    have a `sink`: a logit over legs the box keeps (per head, possibly per query) added to the
    denominator, exp(α·x_m) / (exp(sink) + Σ_m' exp(α·x_m')) (gpt-oss's attention sinks); it is
    not scaled by α and no mask hides it."""

    content: Expr | None = None
    normalized: tuple[str, ...] = ()
    scale: sympy.Expr = ONE
    masks: tuple[Mask, ...] = ()
    is_exp: bool = True
    eps: sympy.Expr = ZERO
    sink: Expr | None = None
    kind: ClassVar[str] = "softmax"

    @property
    def box_name(self) -> str:
        return "softmax" if self.is_exp else "normalize"


@dataclass(frozen=True)
class ElementwiseMap(Expr):
    """Shape-preserving maps: exp, log, relu, elu1 (elu + 1), sigmoid, tanh, softplus, silu, gelu
    (exact, with erf), sin, cos, sqrt, abs, clamp(lo, hi), maximum(c) and minimum(c) (`max(x, c)`,
    `min(x, c)`), pow(p)."""

    name: str = ""
    operand: Expr | None = None
    params: tuple[sympy.Expr, ...] = ()
    kind: ClassVar[str] = "map"


@dataclass(frozen=True)
class Reduction(Expr):
    """max, logsumexp or mean over `over` legs (MGK hard/soft E-step and M-step). `masks` hide
    entries of the operand: max and logsumexp see them as the dtype's lowest number (as a softmax
    box does), mean averages the visible entries only (0 where none is visible)."""

    name: str = ""
    over: tuple[str, ...] = ()
    operand: Expr | None = None
    masks: tuple[Mask, ...] = ()
    kind: ClassVar[str] = "reduction"


@dataclass(frozen=True)
class Scan(Expr):
    """A prefix scan along the position leg `along`, which stays in the result: `cumsum` (the
    running sum Σ_{k ≤ i} x_k) or `logcumsumexp` (log Σ_{k ≤ i} exp x_k, the running sum of
    exponentials kept in log space). `exclusive` shifts by one (Σ_{k < i}; the first entry is the
    empty sum, 0 or −inf), `reverse` runs from the end (suffix sums Σ_{k ≥ i}). `masks` hide
    entries of the operand: a hidden entry adds nothing (0 to a cumsum, −inf to a logcumsumexp),
    so a scan along the key leg of an (n, m) score sees only the keys a query may see."""

    name: str = "cumsum"
    along: str = ""
    operand: Expr | None = None
    exclusive: bool = False
    reverse: bool = False
    masks: tuple[Mask, ...] = ()
    kind: ClassVar[str] = "scan"


@dataclass(frozen=True)
class Shift:
    """One shifted leg of a convolution: the operand is read along position leg `leg` at
    `leg + sign·offset + start`, `offset` a leg of the kernel (a fixed width), `sign` ±1 and
    `start` a whole number or size; a read before the first or past the last entry is 0."""

    leg: str
    offset: str
    sign: int
    start: sympy.Expr = ZERO

    def source(self) -> str:
        """The read position as a .td writes it: `n - i`, `m - j + P`."""
        text = sympy.sstr(sympy.factor(self.start))
        start = "" if self.start == 0 else (f" - {text[1:]}" if text.startswith("-") else f" + {text}")
        return f"{self.leg} {'+' if self.sign > 0 else '-'} {self.offset}{start}"


@dataclass(frozen=True)
class Convolution(Expr):
    """`conv[n = n - i, m = m - j + P](S[h n m], theta[h i j])`: Σ over the offset legs of
    theta[h i j] · S[h, n − i, m − j + P], S read as 0 outside its positions (a zero-padded
    convolution along position legs, Multi-Token Attention's key-query convolution). The result
    has the operand's legs; the kernel's other legs are legs of the operand (a kernel per head:
    a grouped convolution). `masks` zero the operand's hidden entries before it is shifted
    (MTA's Mask_0: a causal mask over (n, m) zeroes the future keys of each query)."""

    operand: Expr | None = None
    kernel: Expr | None = None
    shifts: tuple[Shift, ...] = ()
    masks: tuple[Mask, ...] = ()
    kind: ClassVar[str] = "conv"

    @property
    def taps(self) -> tuple[str, ...]:
        """The kernel's offset legs, one per shifted leg, summed inside the convolution."""
        return tuple(s.offset for s in self.shifts)


@dataclass(frozen=True)
class SegmentSum(Expr):
    """`segsum[n, m](a)`: the segment sums S[.., n, m] = Σ_{k=m+1..n} a_k of the operand along its
    position leg `along` (n), over n and a new key leg `key` (m) of the same size, with causal
    semantics: 0 on the diagonal, −inf where m > n. exp(S) is Mamba-2's 1-semiseparable decay
    mask L (Dao & Gu 2024, eq. 4, the SSD reference's `segsum`): a decay factor of the scores,
    typed so that a planner recognises `exp(segsum(...))` by its node, not by its arithmetic."""

    along: str = ""
    key: str = ""
    operand: Expr | None = None
    kind: ClassVar[str] = "segsum"


@dataclass(frozen=True)
class SquaredDistance(Expr):
    """Σ_over (left − right)², the Gaussian-kernel distance between a query and a key side."""

    over: tuple[str, ...] = ()
    left: Expr | None = None
    right: Expr | None = None
    kind: ClassVar[str] = "sqdist"


@dataclass(frozen=True)
class Statement:
    """`target[groups] = expr`; an update statement rewrites a buffer after the forward pass."""

    target: str
    groups: tuple[tuple[str, ...], ...]
    expr: Expr
    span: Span
    target_span: Span
    is_update: bool = False

    @property
    def legs(self) -> tuple[str, ...]:
        return tuple(leg for g in self.groups for leg in g)


def walk(expr: Expr):
    """Every node of an expression tree, parents before children."""
    yield expr
    for child in expr.children():
        if child is not None:
            yield from walk(child)


def map_children(expr: Expr, rebuild: Callable[[Expr], Expr]) -> Expr:
    """`expr` with `rebuild` applied to every sub-expression (each field holding an Expr or a
    tuple of Exprs, whatever it is called); `expr` itself where every one comes back unchanged."""
    changes: dict[str, object] = {}
    for name in _field_names(type(expr)):
        value = getattr(expr, name)
        if isinstance(value, Expr):
            rebuilt = rebuild(value)
            if rebuilt is not value:
                changes[name] = rebuilt
        elif _is_expr_tuple(value):
            items = tuple(rebuild(item) for item in value)
            if any(new is not old for new, old in zip(items, value, strict=True)):
                changes[name] = items
    return dataclasses.replace(expr, **changes) if changes else expr


_LEG_FIELDS = ("query", "key", "along", "leg", "axis", "offset")  # fields that name one leg
_LEGS_FIELDS = ("legs", "summed", "batch", "normalized", "over")  # ... a tuple of legs


def renamed(node, names: Mapping[str, str]):
    """An expression (or a mask, position or shift in it) with its legs renamed by `names`, the
    others kept: a statement's subexpression read under another statement's leg names."""
    if isinstance(node, tuple):
        return tuple(renamed(item, names) for item in node)
    if not isinstance(node, (Expr, Position, Shift, PaddingMask, *POSITION_MASKS)):
        return node
    changes = {}
    for f in dataclasses.fields(node):
        value = getattr(node, f.name)
        if f.name in _LEG_FIELDS and isinstance(value, str):
            changes[f.name] = names.get(value, value)
        elif f.name in _LEGS_FIELDS and isinstance(value, tuple):
            changes[f.name] = tuple(names.get(leg, leg) for leg in value)
        elif f.name == "groups":
            changes[f.name] = tuple(tuple(names.get(leg, leg) for leg in g) for g in value)
        elif f.name == "name" and isinstance(node, Position) and node.op == "leg":
            changes[f.name] = names.get(value, value)
        elif isinstance(value, Expr | Position | Shift) or (
            isinstance(value, tuple) and any(dataclasses.is_dataclass(v) for v in value)
        ):
            changes[f.name] = renamed(value, names)
    return dataclasses.replace(node, **changes)
