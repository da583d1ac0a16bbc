"""What the tests against Hugging Face modules share: HF's float32 parts (RMSNorm, RoPE tables)
computed in float64, so that a float64 HF module is the exact reference."""

from __future__ import annotations

import torch

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


def assert_equal64(actual: torch.Tensor, expected: torch.Tensor) -> None:
    """Equal to 1e-10 relative to the largest entry of `expected`."""
    assert actual.shape == expected.shape
    scale = expected.abs().max()
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
