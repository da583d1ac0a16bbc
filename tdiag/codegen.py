"""Plan -> the source of a standalone PyTorch module: one class that imports only torch (and the
standard library), parameters named after the `.td` tensors with axes in declared order, one
line per step with its legs and cost as a comment. The in-process module runs this same text."""

from __future__ import annotations

import itertools
import keyword
import math
import re
from collections.abc import Callable, Mapping, Sequence
from contextvars import ContextVar
from functools import singledispatch
from typing import TYPE_CHECKING

import sympy
from sympy.printing.pycode import PythonCodePrinter

from .graph import DesignGraph
from .graph.causal import hides_the_future
from .ir import Tensor, TensorRef, walk
from .plan import BATCH_SIZE, Plan, Step, reads
from .plan.program import (
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
    Positions,
    PositionTensor,
    PrefixSum,
    Ratio,
    Reduce,
    Reshape,
    Scale,
    ScoreArgument,
    ScoreArith,
    ScoreIndex,
    ScoreMap,
    ScoreMask,
    ScoreNumber,
    ScoreRead,
    SegmentSums,
    Slice,
    Softmax,
    SplitChunks,
    SplitTable,
    SumAxes,
    Triangle,
    Value,
    VisibleMask,
    show_legs,
)

if TYPE_CHECKING:
    from .call_plans import CallPlans

HELPERS = '''

def _seed(seed: int, name: str) -> int:
    """Each tensor draws from its own generator, seeded from (seed, name)."""
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _generator(seed: int, name: str) -> torch.Generator:
    return torch.Generator().manual_seed(_seed(seed, name))


def _normal(shape, mean, std, seed, name):
    return torch.empty(shape, dtype=torch.float64).normal_(mean, std, generator=_generator(seed, name))


def _uniform(shape, low, high, seed, name):
    return torch.empty(shape, dtype=torch.float64).uniform_(low, high, generator=_generator(seed, name))


def _fill(shape, value):
    return torch.full(shape, float(value), dtype=torch.float64)


def _identity(shape, scale=1.0):
    value = torch.zeros(shape, dtype=torch.float64)
    value[(torch.arange(shape[0]),) * len(shape) if shape else ()] = scale
    return value
'''

# helpers printed only into a module whose forward calls them
CALLED_HELPERS = {
    "_extend": '''

def _extend(cache, x, module, **masks):
    """The outputs at the positions of x, placed after those the decoding cache holds (tdiag's
    DecodeCache, from module.new_cache()), which it then holds too."""
    if not callable(getattr(cache, "extend", None)):
        raise TypeError(f"cache must be the decoding cache module.new_cache() makes, got {type(cache).__name__}")
    return cache.extend(x, module=module, **masks)
''',
    "_nonzero": '''

def _nonzero(x):
    """x with its zeros read as 1: where a normalize box's shifted exp factors all underflowed,
    its numerator is 0 too, and the quotient 0 rather than 0 / 0."""
    return x.masked_fill(x == 0, 1)
''',
    "_sink_softmax": '''

def _sink_softmax(x, sink):
    """Softmax over the last axis of x with exp(sink) one more term of each row's denominator
    (attention sinks): each row and its sink softmaxed together (the max taken over both, so
    nothing overflows), the sink's column dropped, a view; autograd keeps that one softmax. No
    mask hides the sink, so a row whose logits are all hidden gives weights that sum to < 1."""
    return torch.cat([x, sink.to(x.dtype).expand(*x.shape[:-1], 1)], -1).softmax(-1)[..., :-1]
''',
    "_sink_attention": '''

def _sink_attention(q, k, v, sink, scale, is_causal=False, attn_mask=None, enable_gqa=False):
    """scaled_dot_product_attention with exp(sink) one more term of each row's denominator, in
    one call: each query gains the feature sink / scale and each key the feature 0, and one key
    [0, ..., 0, 1] with a zero value is put first, so that its logit is exactly the sink. No
    mask hides it. v is padded with zero features to q's width (one head width for the fused
    kernel). Causal: one query is put first as well, so that is_causal's top-left triangle lets
    query i see the sink key and keys 0..i; that query's output row is dropped."""
    sink = (sink / scale).to(q.dtype).unsqueeze(-1).expand(*q.shape[:-1], 1)
    q = torch.cat([q, sink], -1)
    first = torch.nn.functional.pad(torch.ones_like(k[..., :1, :1]), (k.shape[-1], 0))
    k = torch.cat([first, torch.nn.functional.pad(k, (0, 1))], -2)
    v = torch.nn.functional.pad(v, (0, max(q.shape[-1] - v.shape[-1], 0), 1, 0))
    if attn_mask is not None:
        visible = torch.ones_like(attn_mask[..., :1]) if attn_mask.dtype == torch.bool else torch.zeros_like(attn_mask[..., :1])
        attn_mask = torch.cat([visible.expand(*attn_mask.shape[:-1], 1), attn_mask], -1)
    if is_causal:
        q = torch.nn.functional.pad(q, (0, 0, 1, 0))
    out = torch.nn.functional.scaled_dot_product_attention(
        q, k, v, scale=scale, is_causal=is_causal, attn_mask=attn_mask, enable_gqa=enable_gqa
    )
    return out[..., 1:, :] if is_causal else out
''',
    "_input": '''

def _input(x, name, like, like_name):
    """Refuse an input that is not a floating-point tensor on the device and of the dtype of `like`
    (the module's first stored tensor, or its first input); autocast may mix the dtypes."""
    if not isinstance(x, torch.Tensor):
        raise TypeError(f"{name} must be a torch.Tensor, got {type(x).__name__}")
    if not x.is_floating_point():
        raise TypeError(f"{name} must be a floating-point tensor, got {x.dtype}")
    if like is None:
        return
    if x.device != like.device:
        raise ValueError(f"{name} is on {x.device} but {like_name} is on {like.device}; move them to one device")
    if x.dtype != like.dtype and not torch.is_autocast_enabled(x.device.type):
        raise TypeError(f"{name} is {x.dtype} but {like_name} is {like.dtype}; convert one to the other (or use autocast)")
''',
    "_batch": '''

def _batch(batch_shape, x, rank, name):
    """The batch axes of the inputs so far broadcast with those of `x` (all but its `rank` last)."""
    try:
        return torch.broadcast_shapes(batch_shape, x.shape[: x.dim() - rank])
    except RuntimeError:
        axes = tuple(x.shape[: x.dim() - rank])
        raise ValueError(f"{name}: batch axes {axes} do not broadcast with the inputs' {tuple(batch_shape)}") from None
''',
    "_earlier": '''

class _Earlier(torch.autograd.Function):
    """The exclusive prefix sum along an axis by one vector add per chunk, forward and backward
    (the suffix sum), each add written into its slice of one result: a CPU's cumsum along an outer
    axis, and its flipped backward, run several times slower than these adds, and stacking the
    sums afterwards would copy them all once more."""

    @staticmethod
    def forward(ctx, x, dim):
        ctx.dim = dim
        return _running(x, dim, reverse=False)

    @staticmethod
    def backward(ctx, grad):
        return _running(grad, ctx.dim, reverse=True), None


def _running(x, dim, reverse):
    """Each slice along `dim` the sum of the slices before it (after it, `reverse`), the first 0."""
    parts = x.unbind(dim)
    order = range(len(parts) - 1, -1, -1) if reverse else range(len(parts))
    if torch.compiler.is_compiling():  # Dynamo takes no out= into a strided slice: the sums stacked
        sums, total = [None] * len(parts), torch.zeros_like(parts[0])
        for k in order:
            sums[k] = total
            if k != order[-1]:
                total = total + parts[k]
        return torch.stack(sums, dim)
    out = torch.empty_like(x, memory_format=torch.contiguous_format)
    sums = out.unbind(dim)
    previous = None
    for k in order:
        if previous is None:
            sums[k].zero_()
        else:
            torch.add(sums[previous], parts[previous], out=sums[k])
        previous = k
    return out


def _earlier(x, dim):
    """The exclusive prefix sum of x along `dim`: the states of the chunks before each."""
    return _Earlier.apply(x, dim)
''',
    "_matvec": '''

class _MatVec(torch.autograd.Function):
    """a @ v for matrices a (..., n, m) and column vectors v (..., m, 1), taken as (vᵀ aᵀ)ᵀ forward
    and as gᵀ a and the outer product g vᵀ (in a's layout) backward: torch's CPU bmm runs a column
    vector 3-7x slower than a row vector, and a transposed one slower still (measured fwd+bwd,
    one thread, 4 heads of 4096 x 4096: 173 ms against 744 ms for a @ v)."""

    @staticmethod
    def forward(ctx, a, v):
        needs_a, needs_v = ctx.needs_input_grad
        ctx.save_for_backward(a if needs_v else None, v if needs_a else None)  # what @ would keep
        ctx.a_shape, ctx.a_dtype, ctx.v_shape, ctx.v_dtype = a.shape, a.dtype, v.shape, v.dtype
        ctx.wide = torch.promote_types(a.dtype, v.dtype)  # the backward's dtype under autocast
        return (v.mT @ a.mT).mT

    @staticmethod
    def backward(ctx, grad):
        a, v = ctx.saved_tensors
        needs_a, needs_v = ctx.needs_input_grad
        grad = grad.to(ctx.wide)
        grad_a = (grad * v.mT.to(ctx.wide)).sum_to_size(ctx.a_shape).to(ctx.a_dtype) if needs_a else None
        grad_v = (grad.mT @ a.to(ctx.wide)).mT.sum_to_size(ctx.v_shape).to(ctx.v_dtype) if needs_v else None
        return grad_a, grad_v


def _matvec(a, v):
    """The matrix-vector products a @ v, v a batch of column vectors."""
    return _MatVec.apply(a, v)
''',
    "_shifted": '''

def _shifted(x, dim, empty, reverse=False):
    """An inclusive scan made exclusive: x moved one entry along `dim` (towards the end, or the
    start when `reverse`), the empty sum `empty` (0, or -inf in log space) entering."""
    edge = torch.full_like(x.narrow(dim, 0, 1), empty)
    if reverse:
        return torch.cat([x.narrow(dim, 1, x.size(dim) - 1), edge], dim)
    return torch.cat([edge, x.narrow(dim, 0, x.size(dim) - 1)], dim)
''',
    "_convolve": '''

def _convolve(x, kernel, dims, channels, pads):
    """Σ_k kernel[c, k] x[..., c, p + k - before] along the axes `dims` of x, zero outside: one
    grouped convolution whose groups are x's axes `channels` (the kernel's leading axes), its
    batch x's other axes; `pads` are the (before, after) zeros of each dim (negative: cropped)."""
    rest = [d for d in range(x.dim()) if d not in dims and d not in channels]
    order = [*rest, *channels, *dims]
    y = x.permute(order)
    shape = y.shape
    groups = 1
    for d in channels:
        groups *= x.size(d)
    y = y.reshape(-1, groups, *shape[len(rest) + len(channels) :])
    y = torch.nn.functional.pad(y, [p for before, after in reversed(pads) for p in (before, after)])
    weight = kernel.reshape(groups, 1, *kernel.shape[len(channels) :])
    convolve = (torch.nn.functional.conv1d, torch.nn.functional.conv2d, torch.nn.functional.conv3d)[len(dims) - 1]
    y = convolve(y, weight, groups=groups).reshape(shape)
    return y.permute([order.index(d) for d in range(x.dim())])
''',
    "_segsum": '''

def _segsum(x):
    """S[..., n, m] = x[..., m+1] + ... + x[..., n] for m <= n, -inf for m > n, along x's last
    axis (Mamba-2's reference segsum): x repeated along m, zeroed where k <= m, summed
    cumulatively along k, so no entry is a difference of two long running sums."""
    index = torch.arange(x.size(-1), device=x.device)
    after = index.unsqueeze(-1) > index
    sums = x.unsqueeze(-1).expand(*x.shape, x.size(-1)).masked_fill(~after, 0).cumsum(-2)
    return sums.masked_fill(after.mT, -torch.inf)
''',
    "_decayed_earlier": '''

def _decayed_earlier(x, start, end, dim):
    """Σ_{c' < c} exp(start[c] - end[c']) x[c'] along `dim`: each chunk's state carried to the
    next with the decay across a chunk, exp(end[c] - end[c - 1]) <= 1, never an exp of a growth."""
    parts, starts, ends = x.unbind(dim), start.unbind(dim), end.unbind(dim)
    carried = torch.zeros_like(parts[0])
    earlier = [carried]
    for c in range(1, len(parts)):
        decay = torch.exp(ends[c - 1] - ends[c - 2]) if c > 1 else 1.0
        carried = decay * carried + parts[c - 1]
        earlier.append(torch.exp(starts[c] - ends[c - 1]) * carried)
    return torch.stack(earlier, dim)
''',
    "_wide": '''

def _wide(x, like):
    """x in the dtype of `like` (the module's first stored tensor, or its first input) where
    autocast left it narrower: float32 in a float32 module under autocast, and as it is in a
    module built in bfloat16 or float16."""
    narrow = (torch.float16, torch.bfloat16)
    return x.to(like.dtype) if x.dtype in narrow and like.dtype not in narrow else x
''',
}


_ESCAPES = {"\\": "\\\\", '"': '\\"', "'": "\\'", "\n": "\\n", "\r": "\\r", "\t": "\\t"}


def python_text(text: object) -> str:
    """`text` made safe for the inside of a string literal or docstring of generated code: quotes,
    backslashes, line breaks and every non-ASCII or unprintable character become escapes, so the
    literal reads back as `text` and nothing in it (a design file's path, say) can end the literal
    and run as code."""
    return "".join(
        _ESCAPES.get(c) or (c if c.isascii() and c.isprintable() else c.encode("unicode_escape").decode("ascii"))
        for c in str(text)
    )


def source(value: object, context: str) -> str:
    """The one door from a design into generated source: every name, number and piece of text
    that a `.td` file, its path or its sizes put into the module's source passes here, written for
    the place it goes.

    - "name": a Python identifier (a `.td` name that check accepted, or a variable the plan made
      fresh); anything else is refused, so no name can become code. Names are not rewritten here:
      check refuses, per role, those the generated module uses for itself (tdiag/names.py) and the
      plan gives locals fresh names outside the generated ones, so a valid design never gets here
      with a bad name; an error here is a tdiag bug, not a user mistake.
    - "number": a finite int, float or sympy number, as a Python literal.
    - "text": the inside of a string literal or docstring (python_text).
    - "fstring": the literal part of an f-string: text with braces doubled.
    - "comment": the rest of a `#` line: line breaks and NUL escaped, nothing else touched."""
    if context == "name":
        if not (isinstance(value, str) and value.isascii() and value.isidentifier()) or keyword.iskeyword(value):
            raise ValueError(f"tdiag bug: {value!r} reached generated code as a name")
        return value
    if context == "number":
        if isinstance(value, sympy.Basic):
            if not value.is_number:
                raise ValueError(f"tdiag bug: {value} reached generated code as a number")
            value = int(value) if value.is_Integer else float(value)
        if isinstance(value, bool) or not isinstance(value, (int, float)) or not math.isfinite(value):
            raise ValueError(f"tdiag bug: {value!r} reached generated code as a number")
        return repr(value)
    if context == "text":
        return python_text(value)
    if context == "fstring":
        return python_text(value).replace("{", "{{").replace("}", "}}")
    if context == "comment":
        return str(value).replace("\r", "\\r").replace("\n", "\\n").replace("\0", "\\0")
    raise ValueError(f"unknown source context {context!r}")


def class_name(design: str) -> str:
    """The generated class: the design's name in CamelCase, prefixed where that is not a Python
    identifier (`design _3`, `design none`)."""
    name = "".join(part.capitalize() for part in re.split(r"[^A-Za-z0-9]+", design) if part)
    if not name.isidentifier() or keyword.iskeyword(name):
        name = "Design" + name
    return source(name, "name")


def _number(graph: DesignGraph, value: object, sizes: dict[str, int]) -> str:
    return source(float(graph.evaluate(sympy.sympify(value), **sizes)), "number")


def _quoted(text: str) -> str:
    return '"' + source(text, "text") + '"'


def _shape(tensor: Tensor, graph: DesignGraph, sizes: dict[str, int]) -> tuple[int, ...]:
    from .init import numeric_shape

    return numeric_shape(tensor, sizes, graph)


def _init_line(tensor: Tensor, graph: DesignGraph, sizes: dict[str, int] | None) -> str:
    """The initializer call; with `sizes` None, a const made in forward at run-time sizes."""
    init = tensor.init
    if sizes is None:
        dims = [_size(graph, a.size) for a in tensor.axes]
        shape: object = f"({', '.join(dims)}{',' if len(dims) == 1 else ''})"
        p = {k: _scalar(graph.expand(sympy.sympify(v)).xreplace(_known(graph))) for k, v in init.params}  # type: ignore[union-attr]
    else:
        shape = _shape(tensor, graph, sizes)
        p = {k: _number(graph, v, sizes) for k, v in init.params} if init else {}
    if init is None:
        return f"_normal({shape}, 0.0, {source(1 / (shape[0] if shape else 1) ** 0.5, 'number')}, seed, {_quoted(tensor.name)})"  # type: ignore[index]
    if init.name == "normal":
        return f"_normal({shape}, {p.get('mean', '0.0')}, {p.get('std', '1.0')}, seed, {_quoted(tensor.name)})"
    if init.name == "uniform":
        return f"_uniform({shape}, {p['low']}, {p['high']}, seed, {_quoted(tensor.name)})"
    if init.name == "identity":
        return f"_identity({shape}, {p.get('scale', '1.0')})"
    if init.name == "values":
        entries = ", ".join(_number(graph, v, sizes) for v in init.values)
        return f"torch.tensor([{entries}], dtype=torch.float64).reshape({shape})"
    value = {"zeros": "0.0", "ones": "1.0"}.get(init.name) or p["value"]
    return f"_fill({shape}, {value})"


_FLEX_IMPORT = ["from torch.nn.attention.flex_attention import create_block_mask, flex_attention"]


def generate(
    plan: Plan, *, source_name: str = "", calls: CallPlans | None = None, design: Mapping[str, object] | None = None
) -> str:
    """The module source for `plan`; with `calls`, forward takes the call-time masks and runs the
    plan of the variant they ask for (codegen_calls.py). `design` (Design.origin and the planning
    options) becomes the class attribute `tdiag_design`, the data a standalone file decodes from."""
    graph = plan.graph
    name = class_name(graph.name)
    origin = f" from {source(source_name, 'text')}" if source_name else ""
    sizes = ", ".join(f"{source(k, 'text')}={source(v, 'text')}" for k, v in plan.sizes.items() if k != "B")
    from .codegen_calls import CALL_HELPERS, call_forward, variant_plans

    printed = [plan] if calls is None else [p for p in variant_plans(plan, calls) if p is not None]
    tables, untabled = _tables(printed)
    token = _UNTABLED.set(untabled)
    try:
        forward, plans = (_forward(plan), [plan]) if calls is None else call_forward(plan, calls)
    finally:
        _UNTABLED.reset(token)
    helpers = {**CALLED_HELPERS, **CALL_HELPERS}
    called = "".join(text for helper, text in helpers.items() if f"{helper}(" in "\n".join(forward))
    lines = [
        f'"""{name}: the `{source(graph.name, "text")}` design compiled by tdiag{origin}.',
        "",
        f"Sizes: {sizes}.",
        'Generated code: edit the .td file and recompile rather than editing this file."""',
        "",
        "import hashlib",
        "import math",
        "",
        "import torch",
        "from torch import nn",
        *(_FLEX_IMPORT if any(isinstance(step.op, FlexAttention) for p in plans for step in p.steps) else []),
        HELPERS + called,
        "",
        f"class {name}(nn.Module):",
        f'    """{_docstring(graph)}"""',
        "",
        *_legs(plan),
        *_design_record(design),
        "",
        *_init(plan, bool(tables)),
        "",
        *_reset(plan),
        "",
        *_extra_repr(plan, bool(tables)),
        "",
        *tables,
        *forward,
    ]
    return "\n".join(lines).rstrip() + "\n"


def _tables(plans: list[Plan]) -> tuple[list[str], frozenset[int]]:
    """The method that makes the constant tables of every body (each distinct set of statements
    once) and the `_apply` that makes them again where the module moves or changes dtype (so a
    float32 module made float64 has the float64 tables forward would have computed); and the
    plans whose tables stay in forward, because another body's table of the same name differs."""
    blocks: list[list[str]] = []
    names: dict[str, str] = {}
    untabled: set[int] = set()
    for plan in plans:
        block = _forward_and_tables(plan)[1]
        if not block or block in blocks:
            continue
        text = "\n".join(block)
        made = re.findall(rf'register_buffer\("({TABLE_PREFIX}\w+)"', text)
        if any(names.get(name, text) != text for name in made):
            untabled.add(id(plan))
            continue
        names.update(dict.fromkeys(made, text))
        blocks.append(block)
    if not blocks:
        return [], frozenset(untabled)
    plan = plans[0]
    inputs = [source(plan.names[t.name], "name") for t in plan.graph.inputs]
    first = next(iter(names))
    lines = [
        "    @torch.no_grad()",
        "    def _tdiag_make_tables(self, dtype: torch.dtype, device=None) -> None:",
        '        """The constant tables forward reads, fixed by the sizes built for: made once, not on every',
        '        call, as buffers outside the state_dict (old checkpoints load, new ones hold no more)."""',
        *(
            f"        {x} = torch.empty(0, dtype=dtype, device=device)  # the tables take the module's dtype"
            for x in inputs
        ),
        *(line for block in blocks for line in block),
        "",
        "    def _apply(self, fn, recurse=True):",
        '        """Move or convert the module, then make the tables again in their new dtype and on their',
        '        new device (computed there, never rounded from another dtype)."""',
        "        super()._apply(fn, recurse)",
        f"        like = self.{first}",
        "        self._tdiag_make_tables(like.dtype, like.device)",
        "        return self",
        "",
    ]
    return lines, frozenset(untabled)


def _docstring(graph: DesignGraph) -> str:
    inputs = ", ".join(f"{t.name}[..., {', '.join(t.legs)}]" for t in graph.inputs)
    outputs = ", ".join(f"{o}[..., {', '.join(graph.tensors[o].legs)}]" for o in graph.outputs)
    return source(f"{inputs} -> {outputs}.", "text")


def _stored(plan: Plan) -> list[Tensor]:
    graph = plan.graph
    return [
        t
        for t in graph.tensors.values()
        if t.kind in ("param", "buffer") or (t.kind == "const" and t.name in plan.stored and t.name in plan.attributes)
    ]


def _init(plan: Plan, tables: bool = False) -> list[str]:
    lines = [
        "    def __init__(self, seed: int = 0, dtype: torch.dtype = torch.float32, device=None):",
        "        super().__init__()",
    ]
    for t in _stored(plan):
        shape = _shape(t, plan.graph, plan.sizes)
        empty = f"torch.empty({shape}, dtype=dtype, device=device)"
        legs = source(" ".join(t.legs), "comment")
        if t.kind == "param":
            lines.append(f"        self.{source(t.name, 'name')} = nn.Parameter({empty})  # legs {legs}")
        else:
            persistent = "True" if t.kind == "buffer" else "False"
            lines.append(
                f"        self.register_buffer({_quoted(source(t.name, 'name'))}, {empty}, persistent={persistent})  # legs {legs}"
            )
    lines.append("        self.reset_parameters(seed)")
    if tables:
        lines.append("        self._tdiag_make_tables(dtype, device)")
    return lines


def _reset(plan: Plan) -> list[str]:
    lines = [
        "    @torch.no_grad()",
        "    def reset_parameters(self, seed: int = 0) -> None:",
        '        """Initialize every stored tensor from its .td initializer; deterministic for a seed."""',
    ]
    for t in _stored(plan):
        lines.append(f"        self.{source(t.name, 'name')}.copy_({_init_line(t, plan.graph, plan.sizes)})")
    if len(lines) == 3:
        lines.append("        pass")
    return lines


def _legs(plan: Plan) -> list[str]:
    """Each stored tensor's legs in axis order, as data: `repr` shows them and tdiag.weights reads
    them to lay nn.Linear matrices onto leg-shaped tensors."""
    legs = ", ".join(f"{_quoted(t.name)}: {_tuple([_quoted(leg) for leg in t.legs])}" for t in _stored(plan))
    return [f"    tdiag_legs = {{{legs}}}"]


def _design_record(design: Mapping[str, object] | None) -> list[str]:
    """`tdiag_design`: the design's texts, sizes and planning options as a literal of strings,
    numbers and tuples (each text a repr, never code), one line per entry."""
    if design is None:
        return []
    entries = [f"        {data_literal(key)}: {data_literal(value)}," for key, value in design.items()]
    return ["    tdiag_design = {", *entries, "    }"]


def data_literal(value: object) -> str:
    """A Python literal of `value`, built only of str, int, bool, None, tuples (or lists) and
    dicts with str keys (exactly these types: a subclass could repr itself as code); anything else
    is refused, so nothing but data reaches the text."""
    if value is None or type(value) in (bool, int, str):
        return repr(value)
    if isinstance(value, tuple | list):
        return _tuple([data_literal(v) for v in value]) if value else "()"
    if isinstance(value, Mapping) and all(isinstance(k, str) for k in value):
        return "{" + ", ".join(f"{data_literal(k)}: {data_literal(v)}" for k, v in value.items()) + "}"
    raise TypeError(f"a design record holds data only, got {type(value).__name__}")


def _tuple(items: list[str]) -> str:
    return f"({items[0]},)" if len(items) == 1 else f"({', '.join(items)})"


def _extra_repr(plan: Plan, tables: bool = False) -> list[str]:
    """`repr(module)` shows the sizes built for, then each stored tensor with its legs and shape."""
    graph = plan.graph
    fixed = ", ".join(
        f"{python_text(k)}={v}" for k, v in plan.sizes.items() if k in graph.sizes and not graph.sizes[k].is_free
    )
    runtime = [
        f"{python_text(k)} (planned at {v})"
        for k, v in plan.sizes.items()
        if k in graph.sizes and graph.sizes[k].is_free
    ]
    sizes = f"sizes: {fixed or 'none'}" + (f"; bound at run time: {', '.join(runtime)}" if runtime else "")
    return [
        "    def extra_repr(self) -> str:",
        '        """The sizes built for, then each parameter and buffer with its legs and shape."""',
        f'        lines = ["{sizes}"]',
        "        for name, tensor in [*self.named_parameters(recurse=False), *self.named_buffers(recurse=False)]:",
        *(
            [
                "            if name not in self.tdiag_legs:  # a constant table (_tdiag_make_tables), not a .td tensor",
                "                continue",
            ]
            if tables
            else []
        ),
        '            kind = "param" if isinstance(tensor, nn.Parameter) else "buffer"',
        "            lines.append(f\"{kind} {name}[{' '.join(self.tdiag_legs[name])}]: {tuple(tensor.shape)}\")",
        '        return "\\n".join(lines)',
    ]


def _forward(plan: Plan) -> list[str]:
    """forward: read and check the inputs, run the steps, return the outputs."""
    return _forward_and_tables(plan)[0]


def _forward_and_tables(plan: Plan) -> tuple[list[str], list[str]]:
    """forward's lines and the lines that make its constant tables (TABLE_PREFIX buffers), the two
    renumbered together so that the names forward reads are the names the tables define."""
    token = _TABLED.set(frozenset(id(step) for step in _table_steps(plan)))
    try:
        forward = _forward_lines(plan)
    finally:
        _TABLED.reset(token)
    tables = _table_lines(plan)
    lines = _renumbered([*tables, _TABLES_END, *forward], plan)
    end = lines.index(_TABLES_END)
    return lines[end + 1 :], lines[:end]


_TABLES_END = "# tables end"
_TABLED: ContextVar[frozenset[int]] = ContextVar("tabled", default=frozenset())  # steps made as tables
_UNTABLED: ContextVar[frozenset[int]] = ContextVar("untabled", default=frozenset())  # plans that make none
TABLE_PREFIX = "_tdiag_table_"


def _table_steps(plan: Plan) -> list[Step]:
    """Steps whose values depend on sizes fixed at build time alone: positions over a fixed size
    (RoPE's index(p) over half a head) and what is computed from them only (its frequencies
    Θ^(−2p/D)). Computed once when the module is built, not on every call; positions over the
    call's length N, and anything reading an input, parameter, mask or noise, stay in forward."""
    graph = plan.graph
    inputs = {source(plan.names[t.name], "name") for t in graph.inputs}
    boxed = {k for start, end in plan.segments for k in range(start, end + 1)}
    forbidden = {*(k for k, size in graph.sizes.items() if size.is_free), "B", "batch_shape", "self"}
    forbidden |= {source(c.name, "name") for c in plan.chunks} | set(plan.causal.values())
    forbidden |= {v for t in graph.tensors.values() if t.name in plan.names for v in [plan.names[t.name]]} - inputs
    others = {step.out.var for step in [*plan.steps, *plan.update_steps] if step.out is not None}
    table: dict[str, Step] = {}
    if id(plan) in _UNTABLED.get():
        return []
    for k, step in enumerate(plan.steps):
        if step.out is None or step.wide or step.training_only or step.eval_op is not None or k in boxed:
            continue
        read = {value.var for value in reads(step.op)}
        root = isinstance(step.op, Positions) and not read
        if not (root or (read and read <= set(table))):
            continue
        code = _op(step.op, plan.attributes)
        names = set(_IDENTIFIER.findall(re.sub(r"\b\w+\.(dtype|device)\b", "", code)))
        if names & (forbidden | inputs) or "rand" in code:
            continue
        if names & (others - set(table)):
            continue
        table[step.out.var] = step
    return list(table.values())


def _table_reads(plan: Plan) -> list[str]:
    """The table values that forward reads (a later step, an update or an output)."""
    steps = _table_steps(plan)
    defined = {step.out.var for step in steps if step.out is not None}
    tabled = {id(step) for step in steps}
    rest = [step for step in [*plan.steps, *plan.update_steps] if id(step) not in tabled]
    read = {v.var for step in rest for v in reads(step.op)} | {v.var for _, v in plan.outputs}
    return [
        var for var in dict.fromkeys(step.out.var for step in steps if step.out is not None) if var in read & defined
    ]


def _table_lines(plan: Plan) -> list[str]:
    """The statements that make the tables, at the dtype and device of the empty inputs they see."""
    steps = _table_steps(plan)
    if not steps:
        return []
    lines: list[str] = []
    for step in steps:
        lines += _step_lines(step, plan)
    stored = _table_reads(plan)
    lines += [f'        self.register_buffer("{TABLE_PREFIX}{var}", {var}, persistent=False)' for var in stored]
    return lines


def _forward_lines(plan: Plan) -> list[str]:
    graph = plan.graph
    inputs = [source(plan.names[t.name], "name") for t in graph.inputs]
    masks = [source(plan.names[t.name], "name") for t in graph.tensors_of_kind("mask")]
    signature = ", ".join(
        ["self", *(f"{v}: torch.Tensor" for v in inputs)]
        + (["*", *(f"{m}: torch.Tensor | None = None" for m in masks)] if masks else [])
        + _cache_parameter(plan, keywords=bool(masks))
    )
    returns = "torch.Tensor" if len(graph.outputs) == 1 else "tuple[torch.Tensor, ...]"
    lines = [f"    def forward({signature}) -> {returns}:"]
    lines += ["        " + line for line in _cache_entry(plan, inputs, masks)]
    lines += ["        " + line for line in _entry(plan)]
    lines += _body(plan)
    if plan.update_steps:
        lines.append("        if self.training:  # state updates, never by gradient")
        lines.append("            with torch.no_grad():")
        for step in plan.update_steps:
            lines += ["        " + line for line in _step_lines(step, plan)]
    outs = []
    for name, value in plan.outputs:
        tensor = graph.tensors[name]
        shape = ", ".join(_size(graph, a.size) for a in tensor.axes)
        batch = "*batch_shape" if value.is_batched else ""
        outs.append(f"{source(value.var, 'name')}.reshape({_shape_args(batch, shape)})")
    lines.append(f"        return {', '.join(outs)}")
    return _renumbered(lines, plan)


_IDENTIFIER = re.compile(r"[A-Za-z_]\w*")


def _renumbered(lines: list[str], plan: Plan) -> list[str]:
    """forward with the planner's fresh names (t_2871, causal_2880, and X_chunks_2869 made from
    them) numbered again from 1 per stem in the order they first appear, so that a reader sees
    t_1, t_2, ... and two plans that print the same steps print the same text (codegen_calls.py
    shares one body between them). Names of the .td file, sizes and stored tensors stay."""
    graph = plan.graph
    counts = {c.name for c in plan.chunks if not re.fullmatch(r".+_[0-9]+_[0-9]+", c.name)}  # chunks_8: 8 a size
    kept = {*graph.tensors, *graph.sizes, *plan.names.values(), *plan.attributes, *counts}
    fresh = {step.out.var for step in [*plan.steps, *plan.update_steps] if step.out is not None}
    fresh |= set(plan.causal.values()) | {c.name for c in plan.chunks}
    fresh = {var for var in fresh if var not in kept and _NUMBERED.fullmatch(var)}
    if not fresh:
        return lines
    text = "\n".join(lines)
    pattern = re.compile(
        r"(?<![\w.])(" + "|".join(sorted(map(re.escape, fresh), key=len, reverse=True)) + r")(?![0-9A-Za-z])"
    )
    before = set(_IDENTIFIER.findall(text))
    taken = before - fresh
    new: dict[str, str] = {}
    counts: dict[str, int] = {}
    for found in pattern.finditer(text):
        var = found.group(1)
        if var in new:
            continue
        stem = _NUMBERED.fullmatch(var).group(1)  # type: ignore[union-attr]
        while True:
            counts[stem] = counts.get(stem, 0) + 1
            name = f"{stem}_{counts[stem]}"
            if name not in taken:
                break
        new[var] = name
        taken.add(name)
    renamed = pattern.sub(lambda found: new[found.group(1)], text)
    if len(set(_IDENTIFIER.findall(renamed))) != len(before):  # a derived name met another: keep the plan's
        return lines
    return renamed.split("\n")


_NUMBERED = re.compile(r"(.+)_([0-9]+)")


def _decodes(plan: Plan) -> bool:
    """Whether the module takes a decoding cache: a causal design of one input (tdiag/decode.py)."""
    return len(plan.graph.inputs) == 1 and hides_the_future(plan.graph)


def _cache_parameter(plan: Plan, *, keywords: bool) -> list[str]:
    """`cache=None` among the keyword arguments of a module that decodes."""
    if not _decodes(plan):
        return []
    return ["cache=None"] if keywords else ["*", "cache=None"]


def _cache_entry(plan: Plan, inputs: list[str], masks: list[str]) -> list[str]:
    """With a cache (tdiag.DecodeCache, from module.new_cache()), the positions of the input come
    after those the cache holds: the cache computes them from what it holds and extends itself."""
    if not _decodes(plan):
        return []
    given = "".join(f", {m}={m}" for m in masks)
    return ["if cache is not None:", f"    return _extend(cache, {inputs[0]}, self{given})"]


def _body(plan: Plan) -> list[str]:
    """The steps; a checkpointed segment becomes a nested function run by torch's checkpoint."""
    lines: list[str] = []
    starts = {start: end for start, end in plan.segments}
    k = 0
    while k < len(plan.steps):
        if k not in starts:
            end = min([start for start in starts if start > k], default=len(plan.steps))
            lines += _steps_lines(plan.steps[k:end], plan)
            k = end
            continue
        end = starts[k]
        inner = _steps_lines(plan.steps[k : end + 1], plan)
        results = _escaping(plan, k, end)
        name = _fresh(f"_box_{k}", plan)
        lines.append(f"        def {name}():  # recomputed in the backward pass instead of kept")
        lines += ["    " + line for line in inner]
        lines.append(f"            return {', '.join(results)}{',' if len(results) == 1 else ''}")
        lines.append(f"        {', '.join(results)}, = torch.utils.checkpoint.checkpoint({name}, use_reentrant=False)")
        k = end + 1
    return lines


def _fresh(stem: str, plan: Plan) -> str:
    """A name for a generated helper that no variable of the plan and no size uses."""
    taken = {*plan.graph.sizes, *plan.names.values(), *plan.attributes, *(c.name for c in plan.chunks)}
    taken |= {step.out.var for step in [*plan.steps, *plan.update_steps] if step.out is not None}
    name = stem
    while name in taken:
        name += "_"
    return source(name, "name")


def _escaping(plan: Plan, start: int, end: int) -> list[str]:
    """Variables that steps start..end define and later steps, the outputs or updates read."""
    later = [*plan.steps[end + 1 :], *plan.update_steps]
    read = {v.var for step in later for v in reads(step.op)} | {v.var for _, v in plan.outputs}
    defined = [step.out.var for step in plan.steps[start : end + 1] if step.out is not None]
    return [var for var in dict.fromkeys(defined) if var in read]


def _reference_tensor(plan: Plan) -> tuple[str, str]:
    """The stored tensor whose dtype and device the inputs must have (its code and its name as a
    string literal), or ("None", "None") for a design that stores none."""
    stored = _stored(plan)
    if not stored:
        return "None", "None"
    name = source(stored[0].name, "name")
    return f"self.{name}", _quoted(f"{stored[0].kind} {stored[0].name}")


def _dtype_reference(plan: Plan) -> str:
    """The tensor whose dtype is the module's: its first stored tensor, else its first input."""
    like, _ = _reference_tensor(plan)
    return like if like != "None" else source(plan.names[plan.graph.inputs[0].name], "name")


def _entry(plan: Plan) -> list[str]:
    """Read the inputs: bind run-time sizes from their shapes, check them, flatten the batch. With
    several inputs their leading batch dims broadcast (an input over (n, m) without batch dims
    serves every sequence), as do a mask's."""
    graph = plan.graph
    lines: list[str] = []
    first = True
    bound: set[str] = set()
    several = len(graph.inputs) > 1
    like, like_name = _reference_tensor(plan)
    for t in graph.inputs:
        var = source(plan.names[t.name], "name")
        rank = len(t.axes)
        what = _quoted(f"input {t.name}")
        lines.append(f"_input({var}, {what}, {like}, {like_name})")
        if like == "None":  # a design without stored tensors: the first input sets dtype and device
            like, like_name = var, what
        lines.append(f"if {var}.dim() < {rank}:")
        needs = source(f"input {t.name} needs {rank} trailing axes ({' '.join(t.legs)}), got shape ", "fstring")
        lines.append(f'    raise ValueError(f"{needs}{{tuple({var}.shape)}}")')
        if first:
            lines.append(f"batch_shape = {_batch_dims(var, rank)}")
            first = False
        elif several:
            lines.append(f"batch_shape = _batch(batch_shape, {var}, {rank}, {what})")
        for k, axis in enumerate(t.axes):
            position = k - rank
            size = axis.size
            if size.is_Symbol and graph.sizes[str(size)].is_free and str(size) not in bound:
                name = source(str(size), "name")
                lines.append(f"{name} = {var}.shape[{position}]")
                lines.append(f"if {name} == 0:")
                empty = source(f"input {t.name}: leg {axis.leg} (size {size}) has no entries", "text")
                lines.append(f'    raise ValueError("{empty}")')
                bound.add(str(size))
                continue
            expected = _size(graph, size)
            lines.append(f"if {var}.shape[{position}] != {expected}:")
            leg = source(f"input {t.name}: leg {axis.leg} has size {axis.size} = ", "fstring")
            lines.append(f'    raise ValueError(f"{leg}{{{expected}}}, got {{{var}.shape[{position}]}}")')
    lines += _split_checks(graph)
    masks = graph.tensors_of_kind("mask") if graph.inputs else []
    for t in masks:
        lines += _mask_checks(plan, t, bound)
    for t in graph.inputs:
        var = source(plan.names[t.name], "name")
        shape = ", ".join(_size(graph, a.size) for a in t.axes)
        if several or masks:
            lines.append(
                f"{var} = {var}.expand({_shape_args('*batch_shape', shape)}).reshape({_shape_args('-1', shape)})"
            )
        else:
            lines.append(f"{var} = {var}.reshape({_shape_args('-1', shape)})")
    first_input = source(plan.names[graph.inputs[0].name], "name") if graph.inputs else None
    lines.append(f"B = {first_input}.shape[0]" if first_input else "B = 1")
    for t in graph.tensors_of_kind("mask"):
        var = source(plan.names[t.name], "name")
        shape = ", ".join(_size(graph, a.size) for a in t.axes)
        lines.append(
            f"{var} = torch.ones({_shape_args('B', shape)}, dtype=torch.bool, device={first_input}.device) if {var} is None"
            f" else {var}.expand({_shape_args('*batch_shape', shape)}).reshape({_shape_args('B', shape)})"
        )
    device = first_input or "None"
    for t in graph.tensors_of_kind("buffer"):  # read as it was: the update below must not touch saved tensors
        if t.name in plan.names:
            lines.append(f"{source(plan.names[t.name], 'name')} = self.{source(t.name, 'name')}.clone()")
    for t in graph.tensors_of_kind("const"):  # over a run-time size: made at the size of this call
        if t.name in plan.stored and t.name not in plan.attributes:
            like = f"dtype={device}.dtype, device={device}.device"
            lines.append(f"{source(plan.names[t.name], 'name')} = {_init_line(t, graph, None)}.to({like})")
    lines += [f"{source(c.name, 'name')} = -(-{_expr(c.extent)} // {source(c.size, 'number')})" for c in plan.chunks]
    for key, var in plan.causal.items():
        ones = f"torch.ones({_size(graph, key[0])}, {_size(graph, key[1])}, dtype=torch.bool, device={device}.device)"
        if len(key) == 4:  # a window's band: hidden where key - query >= after or <= -before
            before, after = (_size(graph, w) for w in key[2:])
            lines.append(f"{source(var, 'name')} = {ones}.triu({after}) | {ones}.tril(-{before})")
        else:
            lines.append(f"{source(var, 'name')} = {ones}.triu(1)")
    for var in _table_reads(plan) if _TABLED.get() else []:
        dtype = f".to({first_input}.dtype)" if first_input else ""
        lines.append(f"{source(var, 'name')} = self.{TABLE_PREFIX}{source(var, 'name')}{dtype}  # made with the module")
    for t in graph.tensors_of_kind("random"):
        var = source(plan.names[t.name], "name")
        shape = ", ".join(_size(graph, a.size) for a in t.axes)
        mode = t.init.param("mode", "train") if t.init else "train"
        like = f"dtype={device}.dtype, device={device}.device"
        noise = f"torch.randn({_shape_args('B', shape)}, {like})"
        zeros = "None" if var in plan.training_noise else f"torch.zeros({_shape_args('B', shape)}, {like})"
        lines.append(
            f"{var} = "
            + {"always": noise, "never": zeros}.get(str(mode), f"{noise} if self.training else {zeros}")
            + f"  # noise, mode {source(mode, 'comment')}"
        )
    return lines


def _split_checks(graph: DesignGraph) -> list[str]:
    """A leg sized by a division of a run-time length (the N/C blocks of `X[(b i) f]` with i of
    size C) is whole only where the call's length is a multiple of the block: checked at entry,
    a ValueError naming the reshape, the leg, its size, the length and the block, where a
    failed reshape would say none of them."""
    lines, seen = [], set()
    for leg in graph.legs.values():
        size = graph.expand(leg.size)
        numerator, denominator = sympy.fraction(sympy.together(size.xreplace(_known(graph))))
        if denominator == 1 or (numerator, denominator) in seen:
            continue
        seen.add((numerator, denominator))
        length, block = _operand(numerator), _operand(denominator)
        written, divisor = sympy.fraction(sympy.together(size))
        shown = f"{divisor} = {denominator}" if divisor != denominator else f"{denominator}"
        text = f"{_split_site(graph, leg.name)}leg {leg.name} has size {leg.size}, whole only where {written} is a"
        text += f" multiple of {shown}; got {numerator} = "
        lines.append(f"if {length} % {block} != 0:")
        lines.append(f'    raise ValueError(f"{source(text, "fstring")}{{{length}}}")')
    return lines


def _split_site(graph: DesignGraph, leg: str) -> str:
    """Where `leg` is a piece of a split axis: its first reshaped use, as `X[(b i) f] on line 10: `."""
    for statement in graph.statements:
        for node in walk(statement.expr):
            if isinstance(node, TensorRef) and any(leg in g and len(g) > 1 for g in node.groups):
                legs = " ".join(f"({' '.join(g)})" if len(g) > 1 else g[0] for g in node.groups)
                return f"{node.name}[{legs}] on line {node.span.line}: "
    return ""


def _mask_checks(plan: Plan, t: Tensor, bound: set[str]) -> list[str]:
    """Check a mask given at run time as the reference evaluator does (bool, its trailing axes
    at their sizes) and broadcast its batch dims with the inputs': an int mask's `~` would flip
    bits, not hide entries, and a mask with batch dims of its own serves the inputs' sequences."""
    graph = plan.graph
    var = source(plan.names[t.name], "name")
    rank = len(t.axes)
    what = _quoted(f"mask {t.name}")
    lines = [f"if {var} is not None:"]
    lines.append(f"    if not isinstance({var}, torch.Tensor):")
    tensor = source(f"mask {t.name} must be a torch.Tensor of booleans (True = attend), got ", "fstring")
    lines.append(f'        raise TypeError(f"{tensor}{{type({var}).__name__}}")')
    lines.append(f"    if {var}.dtype != torch.bool:")
    boolean = source(f"mask {t.name} must be a bool tensor (True = attend), got ", "fstring")
    lines.append(f'        raise ValueError(f"{boolean}{{{var}.dtype}}")')
    lines.append(f"    if {var}.dim() < {rank}:")
    needs = source(f"mask {t.name} needs {rank} trailing axes ({' '.join(t.legs)}), got shape ", "fstring")
    lines.append(f'        raise ValueError(f"{needs}{{tuple({var}.shape)}}")')
    for k, axis in enumerate(t.axes):
        position = k - rank
        if axis.size.is_Symbol and graph.sizes[str(axis.size)].is_free and str(axis.size) not in bound:
            lines.append(f"    {source(str(axis.size), 'name')} = {var}.shape[{position}]")
            bound.add(str(axis.size))
            continue
        expected = _size(graph, axis.size)
        lines.append(f"    if {var}.shape[{position}] != {expected}:")
        leg = source(f"mask {t.name}: leg {axis.leg} has size {axis.size} = ", "fstring")
        lines.append(f'        raise ValueError(f"{leg}{{{expected}}}, got {{{var}.shape[{position}]}}")')
    first = source(plan.names[plan.graph.inputs[0].name], "name")
    lines.append(f"    if {var}.device != {first}.device:")
    device = source(f"mask {t.name} is on ", "fstring")
    lines.append(f'        raise ValueError(f"{device}{{{var}.device}} but the inputs are on {{{first}.device}}")')
    lines.append(f"    batch_shape = _batch(batch_shape, {var}, {rank}, {what})")
    return lines


def _batch_dims(var: str, rank: int) -> str:
    """The leading batch dims of a tensor with `rank` trailing axes (all of them for a scalar:
    `shape[:-0]` would be empty)."""
    return f"{var}.shape[:-{rank}]" if rank else f"{var}.shape"


def _shape_args(first: str, shape: str) -> str:
    """Arguments of reshape, expand, ones or randn: `first` (B, -1 or *batch_shape) and the
    trailing sizes; a scalar's batch shape alone is passed as the tuple it is."""
    if not shape:
        return "batch_shape" if first == "*batch_shape" else first or "()"
    return f"{first}, {shape}" if first else shape


def _size(graph: DesignGraph, expr: sympy.Expr) -> str:
    """A size as Python in forward: known sizes are numbers, run-time ones locals."""
    return _expr(graph.expand(expr).xreplace(_known(graph)))


def _known(graph: DesignGraph) -> dict:
    return {graph.sizes[k].symbol: v for k, v in graph.size_values().items()}


def _steps_lines(steps: Sequence[Step], plan: Plan) -> list[str]:
    """The lines of consecutive steps; a run of steps computed in float32 (a normalize box's, a
    scan's, a decayed causal sum's) goes under one `torch.autocast(..., enabled=False)`, its
    operands from outside widened."""
    lines: list[str] = []
    k = 0
    steps = [step for step in steps if id(step) not in _TABLED.get()]
    while k < len(steps):
        if not steps[k].wide:
            lines += _step_lines(steps[k], plan)
            k += 1
            continue
        inputs = [source(plan.names[t.name], "name") for t in plan.graph.inputs]
        device = f"{inputs[0]}.device.type" if inputs else '"cpu"'
        run = list(itertools.takewhile(lambda step: step.wide, steps[k:]))
        what = _wide_run(run, plan)
        lines.append(f"        with torch.autocast({device}, enabled=False):  # {what}, in float32 under autocast")
        for step in run:
            lines += ["    " + line for line in _step_lines(step, plan)]
        k += len(run)
    return lines


def _wide_run(run: Sequence[Step], plan: Plan) -> str:
    """What a run of float32 steps computes, in the design's words: a normalize box only where the
    run divides by a sum and the design has one (a decayed causal sum or a scan is widened too)."""
    kinds = {step.kind for step in run}
    if kinds <= {"scan", "segsum"}:
        return "a scan"
    if kinds == {"sdpa"}:
        return "an attention with a key bias"
    if kinds & {"normalize", "quotient"} and any(not box.is_exp for _, box in plan.graph.boxes()):
        return "a normalize box"
    if "prefix" in kinds:
        return "a causal sum in chunks"
    if kinds & {"scan", "segsum"}:
        return "a decayed causal sum"
    return "a sum over positions"


def _step_lines(step: Step, plan: Plan) -> list[str]:
    legs = " ".join(show_legs(step.out.legs)) if step.out else ""
    cost = ""
    if step.flops != 0:
        cost = f"; {sympy.sstr(sympy.factor(step.flops.subs(BATCH_SIZE, 1)))} flops"
    comment = "  # " + source(f"{step.description} [{legs}]{cost}", "comment") if step.description else ""
    wide = {s.out.var for s in plan.steps if s.wide and s.out is not None} | set(plan.causal.values())
    widened = _WIDENED.set(frozenset(v.var for v in reads(step.op) if v.var not in wide) if step.wide else frozenset())
    like = _LIKE.set(_dtype_reference(plan) if step.wide else "None")
    try:
        code = _op(step.op, plan.attributes)
        if step.training_only:  # zero in eval mode: neither computed nor allocated there
            code = f"{code} if self.training else None"
        elif step.eval_op is not None:  # the same sum without its train-mode noise terms
            code = f"{code} if self.training else {_op(step.eval_op, plan.attributes)}"
    finally:
        _WIDENED.reset(widened)
        _LIKE.reset(like)
    if step.out is not None:
        code = f"{source(step.out.var, 'name')} = {code}"
    return [*_slice_checks(step), *_gather_checks(step), f"        {code}{comment}"]


def _gather_checks(step: Step) -> list[str]:
    """A read at a position into an axis of run-time length needs the largest position (proved
    by check) inside it: checked when the module runs, a ValueError naming the table."""
    if not isinstance(step.op, GatherAt) or step.op.checked is None:
        return []
    length = f"{_read(step.op.x, frozenset())}.shape[{step.op.dim}]"
    text = source(f"{step.op.name}: reads position {step.op.checked} of axis {step.op.axis}, which has ", "fstring")
    hint = source(" entries; clamp the position into the axis", "fstring")
    return [
        f"        if {length} <= {step.op.checked}:",
        f'            raise ValueError(f"{text}{{{length}}}{hint}")',
    ]


def _slice_checks(step: Step) -> list[str]:
    """A table read at its first N entries needs N <= its length, a range a..b needs
    0 <= a < b <= its length: checked when the module runs, where planning could not."""
    if not isinstance(step.op, Slice):
        return []
    lines = []
    for k, ((_, extent, size), (leg, shown_extent, shown_size)) in enumerate(
        zip(step.op.dims, step.op.labels, strict=True)
    ):
        start = step.op.start(k)
        if start == 0:
            if (extent - size).is_number:
                continue  # both known when planning: graph/positions.py refused a slice longer than its axis
            more = source(f" entries of axis {leg} of {shown_size} = ", "fstring")
            hint = source("; declare the table over a longer maximum length", "fstring")
            text = source(f"{step.op.name}: reads the first {shown_extent} = ", "fstring")
            lines.append(f"        if {_expr(extent)} > {_expr(size)}:")
            lines.append(f'            raise ValueError(f"{text}{{{_expr(extent)}}}{more}{{{_expr(size)}}}{hint}")')
            continue
        tests = [(start, f"{_expr(start)} < 0"), (extent - 1, f"{_expr(extent)} < 1")]
        tests.append((size - start - extent, f"{_expr(start + extent)} > {_expr(size)}"))
        failing = [test for margin, test in tests if not margin.is_number]
        if not failing:
            continue  # all known when planning: graph/positions.py refused a range outside its axis
        text = source(f"{step.op.name}[{leg}: {shown_extent}] is ", "fstring")
        within = source(f" here: a range must hold at least one entry and lie within axis {leg}'s ", "fstring")
        here = f"{{{_expr(start)}}}..{{{_expr(start + extent)}}}{within}{{{_expr(size)}}} entries"
        lines.append(f"        if {' or '.join(failing)}:")
        lines.append(f'            raise ValueError(f"{text}{here}")')
    return lines


# ---- ops as Python -----------------------------------------------------------------------------


def _expr(expr: sympy.Expr) -> str:
    """A size as Python: numbers stay numbers, run-time sizes are locals of forward. A size with a
    denominator (the N/C blocks of a split position leg) is floor-divided, so that it stays an
    int; the entry checks that the division is exact (_split_checks)."""
    if expr.is_Integer:
        return source(expr, "number")
    for symbol in expr.free_symbols:
        source(symbol.name, "name")
    numerator, denominator = sympy.fraction(sympy.together(expr))
    if denominator == 1:
        return str(expr)
    return f"{_operand(numerator)} // {_operand(denominator)}"


def _operand(expr: sympy.Expr) -> str:
    """A size as an operand of `//` or `%`: a symbol or a number bare, anything else parenthesized."""
    return str(expr) if expr.is_Symbol or expr.is_Integer else f"({expr})"


class _ScalarPrinter(PythonCodePrinter):
    """Formulas in run-time sizes with Python operators only (`N**(-1/2)`, not `math.sqrt`), so the
    generated module needs no import for them."""

    def _print_Pow(self, expr, rational=False):
        return self._hprint_Pow(expr, rational=True)


def _scalar(value: sympy.Expr) -> str:
    """A coefficient as Python: an int, a float, or a parenthesized formula in run-time sizes."""
    if value.is_Integer or value.is_number:
        return source(value, "number")
    for symbol in value.free_symbols:
        source(symbol.name, "name")
    return "(" + _ScalarPrinter().doprint(value) + ")"


def _sizes(sizes: Sequence[sympy.Expr]) -> str:
    return ", ".join(_expr(s) for s in sizes)


def _dims(dims: Sequence[int]) -> str:
    return str(dims[0]) if len(dims) == 1 else "(" + ", ".join(map(str, dims)) + ")"


# while a step computed in float32 under autocast is printed: the variables it reads through _wide
_WIDENED: ContextVar[frozenset[str]] = ContextVar("widened", default=frozenset())
_LIKE: ContextVar[str] = ContextVar("like", default="None")  # ... and the tensor whose dtype it takes ("None" outside)


def _var(value: Value, attributes: frozenset[str]) -> str:
    name = source(value.var, "name")
    if name in attributes:
        return f"self.{name}"  # stored in the module's dtype
    return f"_wide({name}, {_LIKE.get()})" if value.var in _WIDENED.get() else name


def _read(operand: Operand, attributes: frozenset[str]) -> str:
    code = _var(operand.value, attributes)
    if operand.invert:
        code = f"(~{code})"
    if operand.permutation is not None:
        code = f"{code}.permute({tuple(operand.permutation)})"
    if operand.shape is not None:
        code = f"{code}.reshape({', '.join(_expr(s) for s in operand.shape)})"
    if operand.index is not None:
        code = f"{code}[{', '.join(':' if kept else 'None' for kept in operand.index)}]"
    return code


def _tree(tree: Binary | Operand, attributes: frozenset[str]) -> str:
    if isinstance(tree, Operand):
        return _read(tree, attributes)
    return f"({_tree(tree.left, attributes)} {tree.op} {_tree(tree.right, attributes)})"


@singledispatch
def _op(op: object, attributes: frozenset[str]) -> str:
    raise TypeError(f"no Python for {type(op).__name__}")


@_op.register
def _(op: Reshape, attributes: frozenset[str]) -> str:
    return f"{_var(op.x, attributes)}.reshape({_sizes(op.shape)})"


@_op.register
def _(op: Scale, attributes: frozenset[str]) -> str:
    return f"{_var(op.x, attributes)} * {_scalar(op.factor)}"


@_op.register
def _(op: SumAxes, attributes: frozenset[str]) -> str:
    return f"{_var(op.x, attributes)}.sum({_dims(op.dims)})"


@_op.register
def _(op: Matmul, attributes: frozenset[str]) -> str:
    if op.bias is not None:
        return _addmm(op, attributes)
    a, b = _read(op.a, attributes), _read(op.b, attributes)
    product = f"_matvec({a}, {b})" if op.matvec else f"{a} @ {b}"
    if op.shape is None:
        return product
    return f"({product}).reshape({_sizes(op.shape) or '()'})"


def _addmm(op: Matmul, attributes: frozenset[str]) -> str:
    """A projection with a bias as nn.Linear runs it: one addmm over the rows of a (measured on
    CPU, fwd+bwd, one thread: a tie with F.linear, both faster than a matmul then an add)."""
    rows = _read(op.a, attributes)
    rows = f"{rows}.flatten(0, -2)" if len(op.a.shape or op.a.value.legs) > 2 else rows
    product = f"torch.addmm({_read(op.bias, attributes)}, {rows}, {_read(op.b, attributes)})"  # type: ignore[arg-type]
    return f"{product}.reshape({_sizes(op.shape)})"  # type: ignore[arg-type]


@_op.register
def _(op: Multiply, attributes: frozenset[str]) -> str:
    a = _read(op.a, attributes)
    product = f"{a}.square()" if op.a == op.b else f"{a} * {_read(op.b, attributes)}"
    if not op.summed:
        return product
    if op.a != op.b:
        product = f"({product})"
    return f"{product}.sum({_dims(op.summed)})"


@_op.register
def _(op: Einsum, attributes: frozenset[str]) -> str:
    return f'torch.einsum("{op.equation}", {", ".join(_var(v, attributes) for v in op.operands)})'


@_op.register
def _(op: MaskFill, attributes: frozenset[str]) -> str:
    fill = {"lowest": f"torch.finfo({_var(op.x, attributes)}.dtype).min", "-inf": 'float("-inf")', "zero": "0.0"}[
        op.fill
    ]
    return f"{_var(op.x, attributes)}.masked_fill({_read(op.mask, attributes)}, {fill})"


@_op.register
def _(op: Softmax, attributes: frozenset[str]) -> str:
    code = _read(op.x, attributes)
    if op.sink is not None:
        sink = _read(op.sink, attributes)
        if op.count == 1:
            return f"_sink_softmax({code}, {sink})"
        return f"_sink_softmax({code}.flatten(-{op.count}), {sink}).unflatten(-1, ({_sizes(op.normalized)}))"
    if op.count == 1:
        return f"{code}.softmax(-1)"
    return f"{code}.flatten(-{op.count}).softmax(-1).unflatten(-1, ({_sizes(op.normalized)}))"


@_op.register
def _(op: Normalize, attributes: frozenset[str]) -> str:
    code = _read(op.x, attributes)
    dims = ", ".join(str(-1 - k) for k in range(op.count))
    if op.guard:
        return f"{code} / _nonzero({code}.sum(dim=({dims},), keepdim=True))"
    return f"{code} / ({code}.sum(dim=({dims},), keepdim=True) + {_scalar(op.eps)})"


@_op.register
def _(op: Expand, attributes: frozenset[str]) -> str:
    kept = len(op.x.legs)
    index = ", ".join([":"] * kept + ["None"] * len(op.sizes))
    shape = ", ".join(["-1"] * kept + [_expr(size) for size in op.sizes])
    return f"{_var(op.x, attributes)}[{index}].expand({shape})"


@_op.register
def _(op: Materialize, attributes: frozenset[str]) -> str:
    return f"{_read(op.x, attributes)}.expand({_sizes(op.shape)}).contiguous()"


@_op.register
def _(op: Map, attributes: frozenset[str]) -> str:
    return _map(op.name, _var(op.x, attributes), op.params)


def _map(name: str, x: str, parameters: Sequence[sympy.Expr]) -> str:
    """Elementwise map `name` of the Python expression `x` (a variable or parenthesized)."""
    params = [_bound(p, x) if name in ("clamp", "maximum", "minimum") else _scalar(p) for p in parameters]
    return {
        "exp": lambda: f"{x}.exp()",
        "log": lambda: f"{x}.log()",
        "relu": lambda: f"torch.relu({x})",
        "elu1": lambda: f"torch.nn.functional.elu({x}) + 1",
        "sigmoid": lambda: f"torch.sigmoid({x})",
        "tanh": lambda: f"torch.tanh({x})",
        "softplus": lambda: f"torch.nn.functional.softplus({x})",
        "silu": lambda: f"torch.nn.functional.silu({x})",
        "gelu": lambda: f"torch.nn.functional.gelu({x})",
        "sin": lambda: f"torch.sin({x})",
        "cos": lambda: f"torch.cos({x})",
        "sqrt": lambda: f"torch.sqrt({x})",
        "abs": lambda: f"torch.abs({x})",
        "clamp": lambda: f"{x}.clamp({', '.join(params)})",
        "maximum": lambda: f"{x}.clamp(min={params[0]})",
        "minimum": lambda: f"{x}.clamp(max={params[0]})",
        "pow": lambda: f"{x} ** {params[0] if params else 1}",
    }[name]()


HALF_MAX = 65504.0  # float16's largest finite number: a bound beyond it overflows a half tensor


def _bound(value: sympy.Expr, x: str) -> str:
    """A clamp bound as Python, taken into the dtype of `x` where float16 cannot hold it (mLSTM's
    clamp(|n·q|, 1, 1e15)): a finite x lies within its dtype's range, so the clamp is the same, and
    torch refuses a bound a half tensor cannot convert to."""
    code = _scalar(value)
    if not value.is_number or abs(float(value)) <= HALF_MAX:
        return code
    return f"max({code}, torch.finfo({x}.dtype).min)" if value < 0 else f"min({code}, torch.finfo({x}.dtype).max)"


@_op.register
def _(op: LayerNorm, attributes: frozenset[str]) -> str:
    shape = f"({_sizes(op.shape)},)"
    affine = "".join(
        f", {name}={_read(t, attributes)}" for name, t in (("weight", op.weight), ("bias", op.bias)) if t is not None
    )
    return f"torch.nn.functional.layer_norm({_read(op.x, attributes)}, {shape}{affine}, eps={_scalar(op.eps)})"


@_op.register
def _(op: Reduce, attributes: frozenset[str]) -> str:
    x = _var(op.x, attributes)
    if op.hidden:
        visible = f"torch.broadcast_to(~{_hidden(op.hidden, attributes)}, {x}.shape)"
        return f"{x}.sum(dim={_dims(op.dims)}) / {visible}.sum(dim={_dims(op.dims)}).clamp(min=1)"
    return f"{x}.{op.method}(dim={_dims(op.dims)})"


@_op.register
def _(op: CumulativeScan, attributes: frozenset[str]) -> str:
    x, dim = _var(op.x, attributes), op.dim
    values = ".values" if op.method == "cummax" else ""  # torch.cummax returns (values, indices)
    if op.reverse:
        code = f"{x}.flip({dim}).{op.method}({dim}){values}.flip({dim})"
    else:
        code = f"{x}.{op.method}({dim}){values}"
    if not op.exclusive:
        return code
    empty = "0.0" if op.method == "cumsum" else "-torch.inf"
    return f"_shifted({code}, {dim}, {empty}{', reverse=True' if op.reverse else ''})"


@_op.register
def _(op: Convolve, attributes: frozenset[str]) -> str:
    kernel = _read(op.kernel, attributes)
    if op.flips:
        first = len(op.channels)
        kernel = f"{kernel}.flip({tuple(first + k for k in op.flips)})"
    pads = ", ".join(f"({_expr(before)}, {_expr(after)})" for before, after in op.pads)
    return f"_convolve({_var(op.x, attributes)}, {kernel}, {op.dims}, {op.channels}, ({pads},))"


@_op.register
def _(op: SegmentSums, attributes: frozenset[str]) -> str:
    x = _var(op.x, attributes)
    last = len(op.x.legs) - 1
    return f"_segsum({x})" if op.dim == last else f"_segsum({x}.movedim({op.dim}, -1))"


@_op.register
def _(op: Elementwise, attributes: frozenset[str]) -> str:
    code = _tree(op.tree, attributes)
    if isinstance(op.tree, Binary):
        code = code[1:-1]
    return f"-({code})" if op.negate else code


@_op.register
def _(op: Ratio, attributes: frozenset[str]) -> str:
    numerator, denominator = _var(op.numerator, attributes), _read(op.denominator, attributes)
    if op.column is not None:
        stored = [leg for leg in op.numerator.legs if leg not in op.numerator.broadcast]
        lead = "..., " if op.column == len(stored) - 1 else ":, " * op.column
        numerator, denominator = f"{numerator}[{lead}:-1]", f"{numerator}[{lead}-1:]"
    if op.guard:
        return f"{numerator} / _nonzero({denominator})"
    return f"{numerator} / ({denominator} + {_scalar(op.eps)})"


@_op.register
def _(op: OnesColumn, attributes: frozenset[str]) -> str:
    pads = "0, 0, " * op.trailing + "0, 1"
    return f"torch.nn.functional.pad({_var(op.x, attributes)}, ({pads}), value=1.0)"


@_op.register
def _(op: PrefixSum, attributes: frozenset[str]) -> str:
    return f"_earlier({_var(op.x, attributes)}, {op.axis})"


@_op.register
def _(op: Triangle, attributes: frozenset[str]) -> str:
    like = _var(op.like, attributes)
    return f"torch.ones({op.size}, {op.size}, dtype={like}.dtype, device={like}.device).tril()"


@_op.register
def _(op: SplitChunks, attributes: frozenset[str]) -> str:
    count = _expr(op.count)
    if op.edge:
        x = _var(op.x, attributes)
        positions = f"torch.arange({count} * {op.size}, device={x}.device).clamp(max={_expr(op.length)} - 1)"
        return f"{x}.index_select({op.axis}, {positions}).unflatten({op.axis}, ({count}, {op.size}))"
    pads = "0, 0, " * op.trailing + f"0, {count} * {op.size} - {_expr(op.length)}"
    return f"torch.nn.functional.pad({_var(op.x, attributes)}, ({pads})).unflatten({op.axis}, ({count}, {op.size}))"


@_op.register
def _(op: BandBlocks, attributes: frozenset[str]) -> str:
    count, length = _expr(op.count), _expr(op.length)
    tail = op.width - op.size - op.lead
    pads = "0, 0, " * op.trailing + f"{op.lead}, {count} * {op.size}{f' + {tail}' if tail else ''} - {length}"
    padded = f"torch.nn.functional.pad({_var(op.x, attributes)}, ({pads}))"
    return f"{padded}.unfold({op.axis}, {op.width}, {op.size}).movedim(-1, {op.axis + 1}).contiguous()"


@_op.register
def _(op: BandMask, attributes: frozenset[str]) -> str:
    device = f"device={source(op.like, 'name')}.device" if op.like else "device=None"
    count, length = _expr(op.count), _expr(op.length)
    query = f"torch.arange({count} * {op.size}, {device}).view({count}, {op.size}, 1)"
    key = (
        f"(torch.arange({count}, {device}).view({count}, 1, 1) * {op.size}"
        f" + torch.arange({op.width}, {device}) - {op.before - 1})"
    )
    return (
        f"(lambda i, j: ((j - i <= -{op.before}) | (j - i >= {op.after}) | (j < 0) | (j >= {length}))"
        f" & (i < {length}))({query}, {key})"
    )


@_op.register
def _(op: ChunkEdge, attributes: frozenset[str]) -> str:
    return f"{_var(op.x, attributes)}.select({op.axis}, {-1 if op.last else 0})"


@_op.register
def _(op: DecayedPrefix, attributes: frozenset[str]) -> str:
    start, end = _read(op.start, attributes), _read(op.end, attributes)
    return f"_decayed_earlier({_var(op.x, attributes)}, {start}, {end}, {op.axis})"


@_op.register
def _(op: JoinChunks, attributes: frozenset[str]) -> str:
    p = op.position
    return f"{_read(op.x, attributes)}.flatten({p}, {p + 1}).narrow({p}, 0, {_expr(op.length)})"


@_op.register
def _(op: VisibleMask, attributes: frozenset[str]) -> str:
    return f"{_read(op.causal, attributes)}.expand({_sizes(op.sizes)}).reshape({_expr(op.rows)}, -1)"


@_op.register
def _(op: ScoreMask, attributes: frozenset[str]) -> str:
    like = _var(op.like, attributes)
    terms = [_read(b, attributes) for b in op.bias]
    if not op.hidden:
        code = " + ".join(terms)
    elif terms:  # where, not a sum: a hidden score passes no gradient to the bias
        code = f"torch.where({_hidden(op.hidden, attributes)}, torch.finfo({like}.dtype).min, {' + '.join(terms)})"
    else:
        code = f"{_hidden(op.hidden, attributes)}.to({like}.dtype) * torch.finfo({like}.dtype).min"
    if op.future is not None:
        future = _read(op.future, attributes)
        base = code or f"torch.zeros((), dtype={like}.dtype, device={like}.device)"
        code = f'torch.where({future}, float("-inf"), {base})'
    return code


def _hidden(hidden: tuple[Operand, ...], attributes: frozenset[str]) -> str:
    code = " | ".join(_read(h, attributes) for h in hidden)
    return f"({code})" if len(hidden) > 1 else code


@_op.register
def _(op: LiveRows, attributes: frozenset[str]) -> str:
    return f"~{_hidden(op.hidden, attributes)}.all(-1, keepdim=True)"


@_op.register
def _(op: Attention, attributes: frozenset[str]) -> str:
    q, k, v = (_read(x, attributes) for x in (op.q, op.k, op.v))
    if op.bias is not None:
        q = f"torch.nn.functional.pad({q}, (0, 1), value=1.0)"
        k = f"torch.cat([{k}, {_read(op.bias, attributes)}.unsqueeze(-1)], -1)"
    if op.pad_value and op.sink is None:  # beside a sink, _sink_attention pads v once
        v = f"torch.nn.functional.pad({v}, (0, {op.pad_value}))"
    if op.pad_query_key:
        q = f"torch.nn.functional.pad({q}, (0, {op.pad_query_key}))"
        k = f"torch.nn.functional.pad({k}, (0, {op.pad_query_key}))"
    if op.repeat != 1:
        q = f"{q}.repeat_interleave({_expr(op.repeat)}, dim=-2)"
    mask = ", is_causal=True" if op.causal else ""
    if op.mask is not None:
        mask = f", attn_mask={_var(op.mask, attributes)}"
    if op.grouped:
        mask += ", enable_gqa=True"
    call = f"torch.nn.functional.scaled_dot_product_attention({q}, {k}, {v}, scale={_scalar(op.scale)}{mask})"
    if op.sink is not None:
        call = f"_sink_attention({q}, {k}, {v}, {_read(op.sink, attributes)}, scale={_scalar(op.scale)}{mask})"
    if op.repeat != 1:
        call += f"[..., {_expr(op.repeat - 1)}::{_expr(op.repeat)}, :]"
    call = _live_rows(op, call, v, attributes)
    if op.width is not None:
        call += f"[..., :{op.width}]"
    if op.shape is not None:
        call = f"({call}).reshape({_sizes(op.shape)})"
    return call


@_op.register
def _(op: FlexAttention, attributes: frozenset[str]) -> str:
    # dense (batch, heads, positions, features): torch 2.13's CPU kernel under torch.compile has
    # no choice for the permuted views of a projection's output (NoValidChoicesError)
    arguments = [f"{_read(x, attributes)}.contiguous()" for x in (op.q, op.k, op.v)]
    score, b, h, q, kv = (source(name, "name") for name in op.arguments)
    body = score if op.score is None else f"{score} + {_score_term(op.score, score, attributes)}"
    if op.mapped:  # a map of the scores: score_mod's value is the term, which reads the score
        body = _score_term(op.score, score, attributes)
    visible = [_score_read(r, attributes) for r in op.visible]
    if visible:  # padded scores at the lowest number, as the materialized box: never an empty row
        body = f"torch.where({' & '.join(visible)}, {body}, torch.finfo({score}.dtype).min)"
    if op.causal:  # the future (outside a window) at -inf, even in a row whose past is all padding
        body = f'torch.where({_band(q, kv, op.window)}, {body}, float("-inf"))'
    if body != score:
        arguments.append(f"score_mod=lambda {score}, {b}, {h}, {q}, {kv}: {body}")
    if op.block_mask is not None:
        arguments.append(f"block_mask={_var(op.block_mask, attributes)}")
    arguments.append(f"scale={_scalar(op.scale)}")
    if op.grouped:
        arguments.append("enable_gqa=True")
    call = _live_rows(op, f"flex_attention({', '.join(arguments)})", arguments[2], attributes)
    return call if op.shape is None else f"{call}.reshape({_sizes(op.shape)})"


def _live_rows(op: Attention | FlexAttention, call: str, v: str, attributes: frozenset[str]) -> str:
    """The fused call where a row keeps a visible key, else the mean of the values (LiveRows)."""
    if op.live is None:
        return call
    mean = f"{v}.mean(-2, keepdim=True)"
    if op.future is not None:  # the values the row may see: its past and itself
        seen = f"(~{_read(op.future, attributes)}).to({v}.dtype)"
        # (vᵀ seenᵀ)ᵀ with v's batch folded into one matrix: the product keeps only the
        # [queries, keys] matrix for backward, not a copy of it per head
        seen_sum = f"({v}.mT.flatten(0, -2) @ {seen}.mT).unflatten(0, {v}.mT.shape[:-1]).mT"
        if op.future.index is not None or len(op.future.value.legs) != 2:  # read over every group
            seen_sum = f"({seen} @ {v})"
        mean = f"({seen_sum} / {seen}.sum(-1, keepdim=True))"
    if op.group != 1:
        mean += f".repeat_interleave({_expr(op.group)}, dim=-3)"
    return f"torch.where({_var(op.live, attributes)}, {call}, {mean})"


@_op.register
def _(op: BlockMask, attributes: frozenset[str]) -> str:
    b, h, q, kv = (source(name, "name") for name in op.arguments)
    device = f"{source(op.like, 'name')}.device" if op.like else "None"
    mask = f"lambda {b}, {h}, {q}, {kv}: {_band(q, kv, op.window)}"
    return f"create_block_mask({mask}, None, None, {_expr(op.queries)}, {_expr(op.keys)}, device={device})"


def _band(q: str, kv: str, window: tuple[sympy.Expr, sympy.Expr] | None) -> str:
    """Python for "key kv visible from query q": kv ≤ q, or inside a window q − before < kv < q + after."""
    if window is None:
        return f"{q} >= {kv}"
    before, after = (_expr(w) for w in window)
    return f"({q} - {kv} < {before}) & ({kv} - {q} < {after})"


def _score_term(term, score: str, attributes: frozenset[str]) -> str:
    """A score_mod term as Python over the kernel's index arguments, in the dtype of `score`."""
    if isinstance(term, ScoreRead):
        return _score_read(term, attributes)
    if isinstance(term, ScoreIndex):
        return f"{_score_position(term.position)}.to({score}.dtype)"
    if isinstance(term, ScoreNumber):
        return _scalar(term.value)
    if isinstance(term, ScoreArgument):
        return score
    if isinstance(term, ScoreMap):
        return f"({_map(term.name, f'({_score_term(term.x, score, attributes)})', term.params)})"
    if isinstance(term, ScoreArith):
        left, right = _score_term(term.left, score, attributes), _score_term(term.right, score, attributes)
        return f"({left} {term.op} {right})"
    raise TypeError(f"no Python for {type(term).__name__}")


def _score_read(read: ScoreRead, attributes: frozenset[str]) -> str:
    index = ", ".join(_score_position(p) for p in read.index)
    return f"{_var(read.value, attributes)}[{index}]" if index else _var(read.value, attributes)


def _score_position(position) -> str:
    """An integer position of the kernel's index arguments (their names are the position's legs)."""
    return _integer_position(position, lambda leg: source(leg, "name"))


@_op.register
def _(op: Concat, attributes: frozenset[str]) -> str:
    return f"torch.cat([{', '.join(_read(part, attributes) for part in op.parts)}], -1)"


@_op.register
def _(op: Fill, attributes: frozenset[str]) -> str:
    like = f", dtype={op.like}.dtype, device={op.like}.device" if op.like else ""
    return f"torch.full((), {_scalar(op.value)}{like})"


@_op.register
def _(op: MaskNumbers, attributes: frozenset[str]) -> str:
    like = f"{op.like}.dtype" if op.like else "torch.get_default_dtype()"
    return f"{_read(op.mask, attributes)}.to({like})"


@_op.register
def _(op: Positions, attributes: frozenset[str]) -> str:
    # in a step run in float32 under autocast, the positions too: bfloat16 holds no whole number
    # above 256 exactly, so a bfloat16 input's index(n) would put Lightning's decays at wrong distances
    dtype = f"_wide({op.like}, {_LIKE.get()}).dtype" if op.like and _LIKE.get() != "None" else f"{op.like}.dtype"
    like = f", dtype={dtype}, device={op.like}.device" if op.like else ""
    total = _expr(sympy.Mul(*op.shape))
    code = f"torch.arange({total}{like})"
    return code if len(op.shape) == 1 else f"{code}.reshape({_sizes(op.shape)})"


def _position(position, legs: tuple[str, ...], sizes: tuple[sympy.Expr, ...], device: str) -> str:
    """An integer position as a torch expression broadcast over axes `legs`."""

    def axis(leg: str) -> str:
        k = legs.index(leg)
        shape = ", ".join("-1" if j == k else "1" for j in range(len(legs)))
        return f"torch.arange({_expr(sizes[k])}, device={device}).reshape({shape}{',' if len(legs) == 1 else ''})"

    return _integer_position(position, axis)


def _integer_position(position, leg: Callable[[str], str]) -> str:
    """A Position (ir.py) as Python, each leg printed by `leg`: numbers, + - * /, negation,
    clamp, min, max, abs, floor, log. A part without legs is Python arithmetic on numbers and
    sizes (in double); a part with legs is int64, or float32 where real (an int64 part is
    converted with .float() first, as T5's `relative_position.float()`); floor(a / b) of whole
    parts is floor division."""
    return _position_code(position, leg)[0]


def _position_code(position, leg: Callable[[str], str]) -> tuple[str, bool]:
    """(Python, whether it is a tensor) for a position part."""
    op = position.op
    if op == "leg":
        return leg(position.name), True
    if op == "number":
        return _scalar(position.value), False
    inner = position.operands[0]
    if op == "floor" and inner.op == "/" and not inner.is_real():
        a, b = (_position_code(o, leg)[0] for o in inner.operands)
        return f"({a} // {b})", bool(position.legs())
    parts = [_position_code(o, leg) for o in position.operands]
    codes = [code for code, _ in parts]
    if not position.legs():
        functions = {"log": "math.log", "floor": "math.floor", "abs": "abs", "min": "min", "max": "max"}
        if op in functions:
            return f"{functions[op]}({', '.join(codes)})", False
        if op == "clamp":
            return f"min(max({codes[0]}, {codes[1]}), {codes[2]})", False
        if op == "neg":
            return f"(-{codes[0]})", False
        return f"({codes[0]} {op} {codes[1]})", False
    if position.is_real():
        codes = [
            f"{code}.float()" if tensor and not o.is_real() else code
            for (code, tensor), o in zip(parts, position.operands, strict=True)
        ]
    if op == "neg":
        return f"(-{codes[0]})", True
    if op in ("abs", "log"):
        return f"torch.{op}({codes[0]})", True
    if op == "floor":
        return (f"torch.floor({codes[0]}).long()" if inner.is_real() else codes[0]), True
    if op == "clamp":
        return f"torch.clamp({', '.join(codes)})", True
    if op in ("min", "max"):
        if parts[0][1] and parts[1][1]:
            return f"torch.{'minimum' if op == 'min' else 'maximum'}({codes[0]}, {codes[1]})", True
        x, bound = (codes[0], codes[1]) if parts[0][1] else (codes[1], codes[0])
        return f"torch.clamp({x}, {'max' if op == 'min' else 'min'}={bound})", True
    return f"({codes[0]} {op} {codes[1]})", True


@_op.register
def _(op: PositionTensor, attributes: frozenset[str]) -> str:
    device = f"{op.like}.device" if op.like else "None"
    return _position(op.position, op.legs, op.sizes, device)


@_op.register
def _(op: Slice, attributes: frozenset[str]) -> str:
    if op.piece is not None:
        return f"{_var(op.x, attributes)}[{op.piece}]"
    cuts = {k: (op.start(i), extent) for i, (k, extent, _) in enumerate(op.dims)}
    last = max(cuts)
    index = ", ".join(_cut(*cuts[k]) if k in cuts else ":" for k in range(last + 1))
    return f"{_var(op.x, attributes)}[{index}]"


def _cut(start: sympy.Expr, extent: sympy.Expr) -> str:
    """`:N` for the first N entries, `a:a + N` from entry a: basic indexing, a view."""
    return f":{_expr(extent)}" if start == 0 else f"{_expr(start)}:{_expr(start + extent)}"


@_op.register
def _(op: SplitTable, attributes: frozenset[str]) -> str:
    sizes = ", ".join(_expr(size) for size in op.sizes)
    return f"{_var(op.x, attributes)}.split([{sizes}], {op.dim})"


@_op.register
def _(op: GatherAt, attributes: frozenset[str]) -> str:
    return f"{_read(op.x, attributes)}.movedim({op.dim}, -1)[..., {_var(op.index, attributes)}]"


@_op.register
def _(op: LiteralCombination, attributes: frozenset[str]) -> str:
    x = _var(op.x, attributes)
    last = max(op.dims)

    def at(index: tuple[int, ...]) -> str:
        where = dict(zip(op.dims, index, strict=True))
        return f"{x}[{', '.join(str(where[k]) if k in where else ':' for k in range(last + 1))}]"

    slices = []
    for row in op.rows:
        code = ""
        for coefficient, index in row:
            sign, size = ("-", -coefficient) if coefficient < 0 else ("+", coefficient)
            term = at(index) if size == 1 else f"{_scalar(size)} * {at(index)}"
            code = f"{sign}{term}" if not code and sign == "-" else term if not code else f"{code} {sign} {term}"
        slices.append(code or f"torch.zeros_like({at(tuple(0 for _ in op.dims))})")
    if not op.sizes:  # the constant keeps no leg (a selector E[t] = values(0, 1, 0)): one slice
        return slices[0]
    stacked = f"torch.stack([{', '.join(slices)}], -1)"
    return stacked if len(op.sizes) == 1 else f"{stacked}.unflatten(-1, {tuple(op.sizes)})"


@_op.register
def _(op: Permute, attributes: frozenset[str]) -> str:
    return f"{_var(op.x, attributes)}.permute({tuple(op.permutation)})"  # a tuple, empty for a scalar


@_op.register
def _(op: BufferUpdate, attributes: frozenset[str]) -> str:
    x = _var(op.x, attributes)
    mean = f"{x}.mean(0)" if op.x.is_batched else x
    return f"self.{source(op.target, 'name')}.copy_({mean}.reshape({_sizes(op.shape)}))"
