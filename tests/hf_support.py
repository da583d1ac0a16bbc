"""What the tests against Hugging Face modules share: HF's float32 parts (RMSNorm, RoPE tables)
computed in float64, so that a float64 HF module is the exact reference; the small SDPA configs, the
random weights and inputs, HF's additive masks, and the HF weights as the designs' leg-shaped
parameters, so that each test file states only what its model does differently."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch

if TYPE_CHECKING:
    from tdiag.design import Design

F64 = torch.float64


class Float64RMSNorm(torch.nn.Module):
    """An HF RMSNorm (Llama/Qwen3/DeepSeek: weight · x / √(mean(x²) + eps)) with its weight, in
    float64 instead of its float32."""

    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        self.weight, self.eps = norm.weight, norm.variance_epsilon

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.weight * x * (x.pow(2).mean(-1, keepdim=True) + self.eps).rsqrt()


def rope_angles(positions: torch.Tensor, head_dim: int, theta: float) -> torch.Tensor:
    """HF's default RoPE table cat(freqs, freqs) over the positions, in float64: the angles whose
    cos and sin its rotary embedding returns (in float32)."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, dtype=F64) / head_dim))
    freqs = positions[..., None].to(F64) * inv_freq
    return torch.cat((freqs, freqs), dim=-1)


def randomized(module: torch.nn.Module, seed: int = 0, std: float = 0.3) -> torch.nn.Module:
    """The HF module in float64 and eval mode with every parameter drawn normal(0, std) (norm
    weights and biases too, so that each one matters)."""
    module = module.to(F64).eval()
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.copy_(std * torch.randn(parameter.shape, dtype=F64, generator=generator))
    return module


def load_into(module: torch.nn.Module, tensors: dict[str, torch.Tensor]) -> None:
    """Copy leg-shaped tensors into the compiled module's parameters of those names (every one)."""
    assert set(tensors) == {name for name, _ in module.named_parameters()}
    with torch.no_grad():
        for name, value in tensors.items():
            getattr(module, name).copy_(value)


def assert_equal64(actual: torch.Tensor, expected: torch.Tensor, scale: float | None = None) -> None:
    """Equal to 1e-10 relative to `scale`, by default the largest entry of `expected`."""
    assert actual.shape == expected.shape
    scale = expected.abs().max() if scale is None else scale
    assert scale > 0 and (actual - expected).abs().max() <= 1e-10 * scale


def rope_cos_sin(n: int, head_dim: int, theta: float) -> tuple[torch.Tensor, torch.Tensor]:
    """HF's default rotary (cos, sin) [1, n, head_dim] for positions 0 .. n − 1, in float64."""
    angles = rope_angles(torch.arange(n), head_dim, theta)[None]
    return angles.cos(), angles.sin()


def additive_mask(visible: torch.Tensor) -> torch.Tensor:
    """HF's additive mask [1, 1, n, m] from a boolean [n, m]: 0 where visible, the lowest float64
    elsewhere."""
    return torch.zeros(visible.shape, dtype=F64).masked_fill(~visible, torch.finfo(F64).min)[None, None]


class Float64GemmaRMSNorm(torch.nn.Module):
    """Gemma's RMSNorm (Gemma 3's q_norm and k_norm: x / √(mean(x²) + eps) · (1 + weight)) with
    its weight, in float64 instead of its float32."""

    def __init__(self, norm: torch.nn.Module) -> None:
        super().__init__()
        self.weight, self.eps = norm.weight, norm.eps

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return x * (x.pow(2).mean(-1, keepdim=True) + self.eps).rsqrt() * (1.0 + self.weight)


def sdpa_config(config_class: type, hidden: int, heads: int, kv_heads: int, **settings: object) -> object:
    """A small HF config of `config_class` (LlamaConfig, Qwen2Config, ...) with `heads` query heads
    in `kv_heads` groups over `hidden` features, run by SDPA; `settings` are the model's own."""
    return config_class(
        hidden_size=hidden,
        num_attention_heads=heads,
        num_key_value_heads=kv_heads,
        **settings,
        attn_implementation="sdpa",
    )


def default_rope(theta: float, **settings: object) -> dict[str, object]:
    """HF's rope_parameters for the default (unscaled) RoPE at base `theta`."""
    return {"rope_type": "default", "rope_theta": theta, **settings}


def gqa_weights(
    attn: torch.nn.Module, f: int, g: int, r: int, d: int, output: str = "o_proj", biases: bool = False
) -> dict[str, torch.Tensor]:
    """q/k/v_proj and the output projection `output` ([out, in] nn.Linear weights, heads
    head-major) as the designs' leg-shaped WQ[f g r d], WK[f g d], WV[f g e], WO[g r e o] (query
    head (g r) = g·R + r); with `biases`, also the q/k/v biases bq[g r d], bk[g d], bv[g e]."""
    out = getattr(attn, output)
    tensors = {
        "WQ": attn.q_proj.weight.T.reshape(f, g, r, d),
        "WK": attn.k_proj.weight.T.reshape(f, g, d),
        "WV": attn.v_proj.weight.T.reshape(f, g, d),
        "WO": out.weight.T.reshape(g, r, d, f),
    }
    if biases:
        tensors |= {
            "bq": attn.q_proj.bias.view(g, r, d),
            "bk": attn.k_proj.bias.view(g, d),
            "bv": attn.v_proj.bias.view(g, d),
        }
    return tensors


def random_input(batch: int, n: int, f: int, seed: int = 1) -> torch.Tensor:
    """A float64 input [batch, n, f] drawn normal(0, 1) from its own generator at `seed`."""
    return torch.randn(batch, n, f, dtype=F64, generator=torch.Generator().manual_seed(seed))


def compiled64(design: Design, causal: bool) -> torch.nn.Module:
    """The design's float64 module, with the causal mask where `causal`."""
    return (design.with_causal_mask() if causal else design).module(dtype=F64)


def plain_or_causal_mask(n: int, causal: bool) -> torch.Tensor:
    """HF's additive mask [1, 1, n, n]: every key visible, or (causal) keys m ≤ query n."""
    visible = torch.ones(n, n, dtype=torch.bool)
    return additive_mask(visible.tril() if causal else visible)


def sliding_window_mask(n: int, window: int) -> torch.Tensor:
    """The additive mask [1, 1, n, n] HF's model gives a sliding-window layer
    (masking_utils.sliding_window_causal_mask_function)."""
    from transformers.masking_utils import sliding_window_causal_mask_function

    index = torch.arange(n)
    return additive_mask(sliding_window_causal_mask_function(window)(0, 0, index[:, None], index[None, :]))


def rotary_tables(inv_freq: torch.Tensor, n: int) -> tuple[torch.Tensor, torch.Tensor]:
    """The rotate-half (cos, sin) [1, n, 2·len(inv_freq)] of the given inverse frequencies over
    positions 0 .. n − 1, in float64: what an HF rotary embedding returns for its inv_freq."""
    freqs = torch.arange(n, dtype=F64)[:, None] * inv_freq
    angles = torch.cat((freqs, freqs), dim=-1)[None]
    return angles.cos(), angles.sin()


def assert_tables_near_float32(ours: tuple[torch.Tensor, ...], theirs: tuple[torch.Tensor, ...]) -> None:
    """Each float64 table within 1e-5 of HF's float32 one (float32's rounding of values near 1)."""
    for table, hf_table in zip(ours, theirs, strict=True):
        assert (table - hf_table).abs().max() < 1e-5


def input_gradients(
    module: torch.nn.Module, attn: torch.nn.Module, x: torch.Tensor, *hf_args: torch.Tensor | tuple
) -> tuple[torch.Tensor, torch.Tensor]:
    """The gradients in `x` of a random weighting (seed 3) of the compiled module's output and of
    the HF module's (called with `hf_args` after the input): (ours, HF's). The parameters'
    gradients accumulate in both modules (zero the HF module's first: it is shared)."""
    ours, theirs = x.detach().clone().requires_grad_(), x.detach().clone().requires_grad_()
    weight = torch.randn(x.shape, dtype=F64, generator=torch.Generator().manual_seed(3))
    (module(ours) * weight).sum().backward()
    (attn(theirs, *hf_args)[0] * weight).sum().backward()
    return ours.grad, theirs.grad


class Float64Rotary(torch.nn.Module):
    """A model's default RoPE tables (HF's rotary embedding: cos and sin of rope_angles, the
    angles divided by a linear scaling `factor`) in float64 instead of its float32, so that the
    untouched model is the float64 reference. With `per_layer_type` (Gemma 3), the tables of
    each layer type as (head_dim, theta, factor), and the layer type is the call's third argument."""

    def __init__(
        self,
        head_dim: int = 0,
        theta: float = 10000.0,
        factor: float = 1.0,
        per_layer_type: dict[str, tuple[int, float, float]] | None = None,
    ) -> None:
        super().__init__()
        self.tables = per_layer_type or {None: (head_dim, theta, factor)}

    def forward(
        self, x: torch.Tensor, position_ids: torch.Tensor, layer_type: str | None = None
    ) -> tuple[torch.Tensor, torch.Tensor]:
        head_dim, theta, factor = self.tables[layer_type]
        angles = rope_angles(position_ids, head_dim, theta) / factor
        return angles.cos().to(x.dtype), angles.sin().to(x.dtype)
