"""The helper functions every generated module carries (HELPERS) and those it carries where its
forward calls them (CALLED_HELPERS): seeded initializers, input checks, the scans, the
matrix-vector product and the convolutions the printers call. They are text, pasted verbatim."""

from __future__ import annotations

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
