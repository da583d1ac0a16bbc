"""The production designs (designs/llama.td, qwen3, gpt2, falcon, bloom, bert) equal Hugging Face
transformers' attention modules in float64: each HF module is built from a small config with random
weights, its weights are copied into the compiled module's leg-shaped parameters, and the outputs
and gradients agree to 1e-10 relative, plain and, for the decoders, causal (HF's causal mask).
Where HF computes a part in float32 even in a float64 module (its RoPE tables, Qwen3's RMSNorm,
BLOOM's softmax), the test builds that part in float64, as the same formula, rather than loosening
the tolerance."""

from __future__ import annotations

import copy
import functools
import subprocess
import sys
from collections.abc import Callable
from dataclasses import dataclass
from unittest import mock

import pytest
import torch
from conftest import DESIGNS, ROOT
from hf_support import (
    F64,
    assert_equal64,
    default_rope,
    gqa_weights,
    load_into,
    plain_or_causal_mask,
    random_input,
    randomized,
    rope_cos_sin,
    sdpa_config,
)

import tdiag

transformers = pytest.importorskip("transformers")

F, H, G, D = 64, 4, 2, 16
N, BATCH = 12, 2
QWEN3_D = 24  # Qwen3's head_dim is its own size (not F / H)


@functools.cache
def compiled(name: str, causal: bool, sizes: tuple[tuple[str, int], ...]) -> torch.nn.Module:
    """The design's compiled float64 module at the test's sizes, built once per file."""
    design = tdiag.load(DESIGNS / f"{name}.td", **dict(sizes))
    return (design.with_causal_mask() if causal else design).module(dtype=F64)


def x_input(n: int = N, seed: int = 1) -> torch.Tensor:
    return random_input(BATCH, n, F, seed)


# The HF modules ------------------------------------------------------------------------------------


def projections(attn: torch.nn.Module, d: int = D) -> dict[str, torch.Tensor]:
    """The grouped-query projections (hf_support.gqa_weights) at this file's sizes and head width d."""
    return gqa_weights(attn, F, G, H // G, d)


@functools.cache
def llama(theta: int = 10000) -> torch.nn.Module:
    from transformers import LlamaConfig
    from transformers.models.llama.modeling_llama import LlamaAttention

    config = sdpa_config(LlamaConfig, F, H, G, attention_bias=False, rope_parameters=default_rope(theta))
    return randomized(LlamaAttention(config, 0))


class RMSNorm64(torch.nn.Module):
    """Qwen3RMSNorm's formula, weight · x · rsqrt(mean(x²) + eps) over the last axis, without its
    float32 upcast; holds the HF norm's own weight."""

    def __init__(self, norm: torch.nn.Module):
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * (x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + self.eps))


@functools.cache
def qwen3() -> torch.nn.Module:
    from transformers import Qwen3Config
    from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention

    config = sdpa_config(
        Qwen3Config, F, H, G, head_dim=QWEN3_D, rms_norm_eps=1e-6, rope_parameters=default_rope(1000000)
    )
    attn = randomized(Qwen3Attention(config, 0))
    attn.q_norm, attn.k_norm = RMSNorm64(attn.q_norm), RMSNorm64(attn.k_norm)
    return attn


def qwen3_weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    return {**projections(attn, d=QWEN3_D), "nq": attn.q_norm.weight, "nk": attn.k_norm.weight}


@functools.cache
def gpt2() -> torch.nn.Module:
    from transformers import GPT2Config
    from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

    return randomized(GPT2Attention(GPT2Config(n_embd=F, n_head=H, attn_implementation="sdpa"), layer_idx=0))


def gpt2_weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    """Conv1D weights are stored [in, out]: c_attn [F, 3F] is Wattn[f j] as it is."""
    return {
        "Wattn": attn.c_attn.weight,
        "battn": attn.c_attn.bias,
        "WO": attn.c_proj.weight.view(H, D, F),
        "bo": attn.c_proj.bias,
    }


@functools.cache
def falcon() -> torch.nn.Module:
    from transformers import FalconConfig
    from transformers.models.falcon.modeling_falcon import FalconAttention

    config = FalconConfig(
        hidden_size=F,
        num_attention_heads=H,
        multi_query=True,
        new_decoder_architecture=False,
        alibi=False,
        bias=False,
        attn_implementation="sdpa",
    )
    return randomized(FalconAttention(config, layer_idx=0))


def falcon_weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    """query_key_value [(H + 2)·D, F] is Wqkv[f j d] transposed; dense [F, H·D] is WO[h e g] transposed."""
    return {"Wqkv": attn.query_key_value.weight.T.reshape(F, H + 2, D), "WO": attn.dense.weight.T.reshape(H, D, F)}


@functools.cache
def bloom() -> torch.nn.Module:
    from transformers import BloomConfig
    from transformers.models.bloom.modeling_bloom import BloomAttention

    return randomized(BloomAttention(BloomConfig(hidden_size=F, n_head=H), layer_idx=0))


def bloom_weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    """query_key_value [H·3·D, F] is Wqkv[h j f] as it is, its bias bqkv[h j]; dense transposed."""
    return {
        "Wqkv": attn.query_key_value.weight.view(H, 3 * D, F),
        "bqkv": attn.query_key_value.bias.view(H, 3 * D),
        "WO": attn.dense.weight.T.reshape(H, D, F),
        "bo": attn.dense.bias,
    }


class SoftmaxInInputDtype:
    """torch.nn.functional, but softmax in its input's dtype: BloomAttention asks for float32."""

    def __getattr__(self, name: str):
        return getattr(torch.nn.functional, name)

    @staticmethod
    def softmax(x: torch.Tensor, dim: int, dtype: torch.dtype | None = None) -> torch.Tensor:
        return torch.nn.functional.softmax(x, dim=dim)


def bloom_alibi(batch: int, n: int) -> torch.Tensor:
    """build_alibi_tensor's [batch·H, 1, n] bias for sequences without padding, in float64:
    slope_h · m with slopes 2^(−8(h+1)/H) (H a power of two)."""
    slopes = 2.0 ** (-8.0 * torch.arange(1, H + 1, dtype=F64) / H)
    return (slopes[:, None] * torch.arange(n, dtype=F64)).expand(batch, H, n).reshape(batch * H, 1, n)


def bloom_call(attn: torch.nn.Module, x: torch.Tensor, causal: bool) -> torch.Tensor:
    """BloomAttention with build_alibi_tensor's bias (slope_h · key position, for a sequence
    without padding) and its softmax in float64, no residual (zeros), HF's causal mask or none."""
    from transformers.models.bloom import modeling_bloom

    batch, n, _ = x.shape
    mask = plain_or_causal_mask(n, True) if causal else None
    with mock.patch.object(modeling_bloom, "F", SoftmaxInInputDtype()):
        return attn(x, torch.zeros_like(x), bloom_alibi(batch, n), mask)[0]


@functools.cache
def bert() -> torch.nn.Module:
    from transformers import BertConfig
    from transformers.models.bert.modeling_bert import BertAttention

    config = BertConfig(hidden_size=F, num_attention_heads=H, layer_norm_eps=1e-12, attn_implementation="sdpa")
    return randomized(BertAttention(config, layer_idx=0))


def bert_weights(attn: torch.nn.Module) -> dict[str, torch.Tensor]:
    projections = {"Q": attn.self.query, "K": attn.self.key, "V": attn.self.value}
    return {
        **{f"W{k}": p.weight.T.reshape(F, H, D) for k, p in projections.items()},
        **{f"b{k.lower()}": p.bias.view(H, D) for k, p in projections.items()},
        "WO": attn.output.dense.weight.T.reshape(H, D, F),
        "bo": attn.output.dense.bias,
        "ln_w": attn.output.LayerNorm.weight,
        "ln_b": attn.output.LayerNorm.bias,
    }


def bert_call(attn: torch.nn.Module, x: torch.Tensor, pad: torch.Tensor | None = None) -> torch.Tensor:
    """BertAttention with the additive key padding mask [batch, 1, 1, N] of the extended attention
    mask (0 where attended, the dtype's lowest where padded), or none."""
    mask = None if pad is None else torch.zeros(pad.shape, dtype=F64).masked_fill(~pad, torch.finfo(F64).min)
    return attn(x, attention_mask=None if mask is None else mask[:, None, None, :])[0]


def padding(lengths: tuple[int, ...], n: int = N) -> torch.Tensor:
    """Key padding [batch, n]: the first `length` tokens of each sequence exist."""
    return torch.arange(n)[None, :] < torch.tensor(lengths)[:, None]


def set_causal(module: torch.nn.Module, causal: bool) -> torch.nn.Module:
    """HF decoders mask causally by `is_causal` when no attention mask is given; False gives the
    same module's bidirectional (plain) attention."""
    module.is_causal = causal
    return module


@dataclass(frozen=True)
class Case:
    """A design and the HF module it is tested against: how the HF weights become the design's
    parameters, and how the HF module is called (plain or causal)."""

    design: str
    sizes: tuple[tuple[str, int], ...]
    build: Callable[[], torch.nn.Module]
    weights: Callable[[torch.nn.Module], dict[str, torch.Tensor]]
    call: Callable[[torch.nn.Module, torch.Tensor, bool], torch.Tensor]
    decoder: bool = True  # causal, so tested plain and causal; an encoder is tested plain only


CASES = {
    "llama": Case(
        "llama",
        (("F", F), ("H", H), ("G", G)),
        llama,
        projections,
        lambda attn, x, causal: set_causal(attn, causal)(
            x, position_embeddings=rope_cos_sin(x.shape[-2], D, 10000), attention_mask=None
        )[0],
    ),
    "qwen3": Case(
        "qwen3",
        (("F", F), ("H", H), ("G", G), ("D", QWEN3_D)),
        qwen3,
        qwen3_weights,
        lambda attn, x, causal: set_causal(attn, causal)(
            x, position_embeddings=rope_cos_sin(x.shape[-2], QWEN3_D, 1000000), attention_mask=None
        )[0],
    ),
    "gpt2": Case(
        "gpt2",
        (("F", F), ("H", H)),
        gpt2,
        gpt2_weights,
        lambda attn, x, causal: set_causal(attn, causal)(x)[0],
    ),
    "falcon": Case(
        "falcon",
        (("F", F), ("H", H)),
        falcon,
        falcon_weights,
        lambda attn, x, causal: set_causal(attn, causal)(
            x, alibi=None, attention_mask=None, position_embeddings=rope_cos_sin(x.shape[-2], D, 10000)
        )[0],
    ),
    "bloom": Case("bloom", (("F", F), ("H", H)), bloom, bloom_weights, bloom_call),
    "bert": Case("bert", (("F", F), ("H", H)), bert, bert_weights, lambda attn, x, causal: bert_call(attn, x), False),
}
MODES = [(name, causal) for name, case in CASES.items() for causal in ((False, True) if case.decoder else (False,))]


def loaded(case: Case, causal: bool) -> tuple[torch.nn.Module, torch.nn.Module]:
    """(HF module, compiled module holding its weights)."""
    attn = case.build()
    module = compiled(case.design, causal, case.sizes)
    load_into(module, case.weights(attn))
    return attn, module


def gradients_as_weights(attn: torch.nn.Module) -> torch.nn.Module:
    """A copy of the HF module whose parameters hold the original's gradients, so that a case's
    `weights` maps them to the design's legs as it maps the weights."""
    grads = copy.deepcopy(attn)
    with torch.no_grad():
        for copied, original in zip(grads.parameters(), attn.parameters(), strict=True):
            copied.copy_(original.grad)
    return grads


# The tests -----------------------------------------------------------------------------------------


def test_import_tdiag_does_not_import_transformers():
    code = "import sys, tdiag; assert 'transformers' not in sys.modules, 'transformers imported'"
    subprocess.run([sys.executable, "-c", code], check=True, cwd=ROOT)


@pytest.mark.parametrize(("name", "causal"), MODES, ids=[f"{n}-{'causal' if c else 'plain'}" for n, c in MODES])
def test_design_equals_its_hf_attention_module(name, causal):
    case = CASES[name]
    attn, module = loaded(case, causal)
    x = x_input()
    with torch.no_grad():
        assert_equal64(module(x), case.call(attn, x, causal))


@pytest.mark.parametrize("name", list(CASES))
def test_design_gradients_equal_its_hf_attention_module(name):
    """The gradients in the input and in every weight equal HF's, mapped to the legs (causal for a
    decoder)."""
    case = CASES[name]
    attn, module = loaded(case, case.decoder)
    attn.zero_grad()
    module.zero_grad()
    x = x_input().requires_grad_()
    x_hf = x.detach().clone().requires_grad_()
    weight = torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(3))
    (module(x) * weight).sum().backward()
    (case.call(attn, x_hf, case.decoder) * weight).sum().backward()
    assert_equal64(x.grad, x_hf.grad)
    grads = dict(module.named_parameters())
    expected = case.weights(gradients_as_weights(attn))
    scale = max(value.abs().max() for value in expected.values())  # a key bias's gradient is 0
    for parameter, value in expected.items():
        assert_equal64(grads[parameter].grad, value, scale)


def test_llama_rope_base_is_the_theta_size():
    """Llama 3's rope_theta = 500000 is the size Theta."""
    attn = llama(500000)
    module = compiled("llama", True, (("F", F), ("H", H), ("G", G), ("Theta", 500000)))
    load_into(module, projections(attn))
    x = x_input(n=40)
    expected = set_causal(attn, True)(x, position_embeddings=rope_cos_sin(40, D, 500000), attention_mask=None)[0]
    with torch.no_grad():
        assert_equal64(module(x), expected)


def test_the_float64_rope_tables_are_hf_rotary_embedding_in_float32():
    from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding

    x = x_input(n=40)
    hf = LlamaRotaryEmbedding(llama(500000).config)(x, torch.arange(40)[None])
    for ours, theirs in zip(rope_cos_sin(40, D, 500000), hf, strict=True):
        assert theirs.dtype == F64 and (ours - theirs).abs().max() < 1e-5


def test_the_float64_alibi_is_hf_build_alibi_tensor_in_float32():
    from transformers.models.bloom.modeling_bloom import build_alibi_tensor

    hf = build_alibi_tensor(torch.ones(BATCH, 40, dtype=torch.long), H, F64)
    assert (bloom_alibi(BATCH, 40) - hf).abs().max() < 1e-5


def test_a_causal_design_differs_from_the_plain_hf_module():
    """The comparison sees the mask: llama's causal module is not HF's bidirectional one."""
    case = CASES["llama"]
    attn, module = loaded(case, True)
    x = x_input()
    with torch.no_grad():
        assert (module(x) - case.call(attn, x, False)).abs().max() > 1e-3


def test_bert_equals_hf_bert_attention_with_a_key_padding_mask():
    attn, module = loaded(CASES["bert"], False)
    x, pad = x_input(), padding((N, 7))
    with torch.no_grad():
        assert_equal64(module(x, pad=pad), bert_call(attn, x, pad))


def test_bert_gradients_equal_hf_with_a_key_padding_mask():
    attn, module = loaded(CASES["bert"], False)
    x, pad = x_input().requires_grad_(), padding((5, 9))
    x_hf = x.detach().clone().requires_grad_()
    weight = torch.randn(BATCH, N, F, dtype=F64, generator=torch.Generator().manual_seed(3))
    (module(x, pad=pad) * weight).sum().backward()
    (bert_call(attn, x_hf, pad) * weight).sum().backward()
    assert_equal64(x.grad, x_hf.grad)


def test_bert_padded_keys_change_nothing_of_the_rest():
    """A token beyond every length is invisible: changing it leaves the real tokens' outputs as they were."""
    _, module = loaded(CASES["bert"], False)
    x, pad = x_input(), padding((7, 7))
    changed = x.clone()
    changed[:, 7:] += 1.0
    with torch.no_grad():
        assert torch.equal(module(x, pad=pad)[:, :7], module(changed, pad=pad)[:, :7])
