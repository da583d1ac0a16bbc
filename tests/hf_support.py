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
