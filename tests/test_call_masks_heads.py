"""A bool mask per head, `attn_mask` of shape (*batch, H, N, M), where the attention is not softmax
boxes: maps summed over the keys (sigmoid attention), normalize boxes (linear attention),
contractions of a scan's decay (Mamba-2's SSD) and reverse scans (stick-breaking attention). The
mask's heads axis is laid over the head legs of each node it reaches (graph/call_masks.py
`node_heads`), as for softmax boxes; checked in float64 against the attention written out with
einsum and against one call per head, with gradients and torch.compile; a design whose nodes have
no head legs, or head legs of other sizes, refuses it naming the node. Then nn.MultiheadAttention's
(batch * heads, queries, keys) layout."""

from __future__ import annotations

import pytest
import torch

import tdiag

TOL = 1e-10
F, H, N, B = 8, 2, 6, 3


def _bool_mask(*shape, seed=2) -> torch.Tensor:
    """A random bool mask with every query seeing its own key."""
    mask = torch.rand(*shape, generator=torch.Generator().manual_seed(seed)) > 0.4
    return mask | torch.eye(shape[-2], shape[-1], dtype=torch.bool)


@pytest.fixture(scope="module")
def x() -> torch.Tensor:
    return torch.randn(B, N, F, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


@pytest.fixture(scope="module")
def mask() -> torch.Tensor:
    return _bool_mask(B, H, N, N)


@pytest.fixture(scope="module")
def modules() -> dict[str, torch.nn.Module]:
    sizes = {
        "sigmoid_attention": {"F": F, "H": H},
        "mlk": {"F": F, "H": H, "D": 4},
        "mamba2_ssd": {"F": F, "H": H},
        "stick_breaking": {"F": F, "H": H},  # a reverse scan over the keys
    }
    return {
        name: tdiag.load(name, **s).module(seed=0, dtype=torch.float64, N=N, plan_calls=True)
        for name, s in sizes.items()
    }


def _sigmoid_reference(m, x, mask):
    """Sigmoid attention (Ramapuram et al., Sec. 3): σ(q·k/√D − log N), hidden entries 0, per head."""
    q, k, v = (torch.einsum("bnf,fhd->bhnd", x, w) for w in (m.WQ, m.WK, m.WV))
    scores = torch.sigmoid(q @ k.mT / (F // H) ** 0.5 - torch.log(torch.tensor(float(N), dtype=x.dtype)))
    return torch.einsum("bhnm,bhme,heg->bng", scores * mask, v, m.WO)


def _elu1(t):
    return torch.nn.functional.elu(t) + 1


def _mlk_reference(m, x, mask):
    """MLK's linear attention (eq. 13) as the masked N × M product: A = φ(q)·k̄ where attended,
    0 where hidden, normalized over the keys with eps 1e-6."""
    q = torch.einsum("bnf,fhd->bhnd", x, m.WQ)
    k = torch.einsum("bmf,fhrd->bhmrd", x, m.WK)
    v = torch.einsum("bmf,fhe->bhme", x, m.WV)
    kbar = torch.einsum("hr,bhmrd->bhmd", m.pi.clamp(0, 1), _elu1(k))
    scores = (_elu1(q) @ kbar.mT) * mask
    attention = scores / (scores.sum(-1, keepdim=True) + 1e-6)
    return torch.einsum("bhnm,bhme,heg->bng", attention, v, m.WO)


@pytest.mark.parametrize(("name", "reference"), [("sigmoid_attention", _sigmoid_reference), ("mlk", _mlk_reference)])
def test_a_bool_mask_per_head_equals_the_attention_written_out(modules, x, mask, name, reference):
    module = modules[name]
    assert torch.allclose(module(x, attn_mask=mask), reference(module, x, mask), atol=TOL, rtol=0)


@pytest.mark.parametrize("name", ["sigmoid_attention", "mlk", "mamba2_ssd", "stick_breaking"])
def test_a_bool_mask_per_head_equals_one_call_per_head(modules, x, mask, name):
    """Y is linear in WO[h ...]: head k's part is the module with the other heads' WO rows zeroed,
    called with head k's mask for all heads."""
    module = modules[name]
    weight = module.WO.detach().clone()
    parts = []
    try:
        for k in range(H):
            with torch.no_grad():
                module.WO.copy_(weight * (torch.arange(H) == k).reshape(H, *[1] * (weight.dim() - 1)))
            parts.append(module(x, attn_mask=mask[:, k]))
    finally:
        with torch.no_grad():
            module.WO.copy_(weight)
    assert torch.allclose(module(x, attn_mask=mask), sum(parts), atol=TOL, rtol=0)


def test_a_bool_mask_per_head_combines_with_key_padding_and_is_causal(modules, x, mask):
    module = modules["sigmoid_attention"]
    ignore = torch.zeros(B, N, dtype=torch.bool)
    ignore[1, 2:4] = True
    lower = torch.ones(N, N, dtype=torch.bool).tril()
    visible = mask & lower & ~ignore[:, None, None, :]
    got = module(x, attn_mask=mask, key_padding_mask=ignore, is_causal=True)
    assert torch.allclose(got, _sigmoid_reference(module, x, visible), atol=TOL, rtol=0)


@pytest.mark.parametrize(("name", "reference"), [("sigmoid_attention", _sigmoid_reference), ("mlk", _mlk_reference)])
def test_a_bool_mask_per_head_has_the_gradients_of_the_attention_written_out(modules, x, mask, name, reference):
    module = modules[name]
    weights = torch.randn(B, N, F, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    grads = []
    for run in (lambda t: module(t, attn_mask=mask), lambda t: reference(module, t, mask)):
        xg = x.clone().requires_grad_(True)
        module.zero_grad()
        (run(xg) * weights).sum().backward()
        grads.append((xg.grad, module.WQ.grad.clone()))
    for got, expected in zip(*grads, strict=True):
        assert torch.allclose(got, expected, atol=TOL, rtol=0)


def test_torch_compile_fullgraph_with_a_bool_mask_per_head(modules, x, mask):
    module = modules["sigmoid_attention"]
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    expected = _sigmoid_reference(module, x, mask & torch.ones(N, N, dtype=torch.bool).tril())
    assert torch.allclose(compiled(x, attn_mask=mask, is_causal=True), expected, atol=TOL, rtol=0)


def test_a_mask_per_head_reaches_heads_a_region_splits(x, mask):
    """Multi-Token Attention reads its heads h as groups and heads within them (h.0 k) around the
    convolution: the mask per head is viewed so, before the convolution (Mask_0) and the softmax."""
    module = tdiag.load("multi_token_attention", F=F, H=H).module(seed=0, dtype=torch.float64, N=N)
    one = mask[:, 0]
    assert torch.allclose(module(x, attn_mask=one[:, None].expand(B, H, N, N)), module(x, attn_mask=one), atol=TOL)
    assert not torch.allclose(module(x, attn_mask=mask), module(x, attn_mask=one), atol=1e-6)


def test_a_float_mask_per_head_is_refused_where_no_softmax_takes_it(modules, x):
    with pytest.raises(TypeError, match=r"attn_mask is torch.float64: design 'sigmoid_attention' .* not a softmax"):
        modules["sigmoid_attention"](x, attn_mask=torch.zeros(B, H, N, N, dtype=torch.float64))


HEADLESS = """design headless
size N, F = 8
input X[n: N, f: F]
param WV[f: F, g: F]
A[n m] = sigmoid(X[n f] X[m f])
Y[n g] = A[n m] X[m e] WV[e g]
output Y
"""

UNEQUAL = """design unequal
size N, F = 8, H = 2, K = 3
input X[n: N, f: F]
param WQ[f: F, h: H, d: F]
param WR[f: F, k: K, d: F]
param WV[f: F, g: F]
A[h n m] = sigmoid(X[n f] WQ[f h d] X[m d])
C[k n m] = relu(X[n f] WR[f k d] X[m d])
Y[n g] = A[h n m] X[m e] WV[e g] + C[k n m] X[m e] WV[e g]
output Y
"""

GROUPED = """design grouped
size N, F = 8, G = 2, R = 2, D = 2
input X[n: N, f: F]
param WQ[f: F, g: G, r: R, d: D]
param WK[f: F, g: G, d: D]
param WV[f: F, g: G, e: D]
Q[n g r d] = X[n f] WQ[f g r d]
K[m g d] = X[m f] WK[f g d]
V[m g e] = X[m f] WV[f g e]
Y[n g r e] = Q[n g r d] K[m g d] V[m g e]
output Y
"""


@pytest.mark.parametrize(
    ("text", "heads", "message"),
    [
        (HEADLESS, 2, r"takes one mask for all heads: a sum over the keys .* line 6\) has no head legs"),
        (
            UNEQUAL,
            2,
            r"for all heads: a sum over the keys .* line 9\) has head legs \(k\) of other sizes than those \(h\)",
        ),
        (
            GROUPED,
            4,
            r"for all heads: a sum over the keys .* line 10\) keeps legs \(r\) that only its query side holds",
        ),
    ],
    ids=["no head legs", "head legs of other sizes", "heads on the query side alone"],
)
def test_a_mask_per_head_is_refused_naming_the_node_without_heads_alike(x, text, heads, message):
    module = tdiag.loads(text).module(seed=0, dtype=torch.float64, N=N)
    module(x, attn_mask=_bool_mask(B, N, N))
    with pytest.raises(ValueError, match=message):
        module(x, attn_mask=_bool_mask(B, heads, N, N))


# ---- nn.MultiheadAttention's (batch * heads, queries, keys) layout ----------------------------


@pytest.fixture(scope="module")
def mhsa() -> torch.nn.Module:
    return tdiag.load("mhsa", F=F, H=H).module(seed=0, dtype=torch.float64, plan_calls=True)


@pytest.fixture(scope="module")
def mha(mhsa) -> torch.nn.MultiheadAttention:
    """nn.MultiheadAttention with mhsa's weights: in_proj rows are (h d) per projection."""
    module = torch.nn.MultiheadAttention(F, H, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        module.in_proj_weight.copy_(torch.cat([w.reshape(F, F).T for w in (mhsa.WQ, mhsa.WK, mhsa.WV)]))
        module.out_proj.weight.copy_(mhsa.WO.reshape(F, F).T)
    return module


def test_a_float_mask_in_multihead_attentions_layout_equals_multihead_attention(mhsa, mha, x):
    bias = torch.randn(B * H, N, N, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    expected, _ = mha(x, x, x, attn_mask=bias, need_weights=False)
    assert torch.allclose(mhsa(x, attn_mask=bias), expected, atol=TOL, rtol=0)
    assert torch.allclose(mhsa(x, attn_mask=bias), mhsa(x, attn_mask=bias.reshape(B, H, N, N)), atol=TOL, rtol=0)


def test_a_bool_mask_in_multihead_attentions_layout_keeps_true_meaning_attend(mhsa, mha, x):
    """nn.MultiheadAttention's bool mask is True = ignore; the module's is SDPA's True = attend."""
    attend = _bool_mask(B * H, N, N)
    expected, _ = mha(x, x, x, attn_mask=~attend, need_weights=False)
    assert torch.allclose(mhsa(x, attn_mask=attend), expected, atol=TOL, rtol=0)


def test_a_mask_in_multihead_attentions_layout_is_read_per_head_on_a_map(modules, x, mask):
    module = modules["sigmoid_attention"]
    flat = mask.reshape(B * H, N, N)
    assert torch.allclose(module(x, attn_mask=flat), _sigmoid_reference(module, x, mask), atol=TOL, rtol=0)


def test_a_first_axis_neither_batch_nor_batch_times_heads_is_named(mhsa, x):
    with pytest.raises(ValueError, match=r"leading axes \(4,\) do not broadcast .* nor .* \(batch \* heads\) = 3 \* 2"):
        mhsa(x, attn_mask=torch.ones(B + 1, N, N, dtype=torch.bool))


def test_multihead_attentions_layout_is_refused_where_one_mask_serves_all_heads(x):
    module = tdiag.loads(HEADLESS).module(seed=0, dtype=torch.float64, N=N)
    with pytest.raises(ValueError, match=r"nn.MultiheadAttention's .* one mask for all heads: a sum over the keys"):
        module(x, attn_mask=_bool_mask(B * 2, N, N))
