"""The hand-written baselines of the GPU report (`python -m tdiag.gpu_report`): a FlexAttention
multi-head attention with the weights of a compiled mhsa, and a plain nanoGPT-style language model
with scaled_dot_product_attention of the same shape as `tdiag train`'s model. Written as one
would by hand, without tdiag, so that tdiag's plans are measured against what users write."""

from __future__ import annotations

from typing import TYPE_CHECKING

import torch
import torch.nn.functional as functional
from torch import nn

from .bench import Reference

if TYPE_CHECKING:
    from torch.nn.attention.flex_attention import BlockMask


class Autocast(nn.Module):
    """A module run under bfloat16 autocast with float32 parameters, as `tdiag train` runs its
    model on CUDA; takes `causal` when the module does."""

    def __init__(self, module: nn.Module):
        super().__init__()
        self.module = module
        self.takes_causal = getattr(module, "takes_causal", False)

    def forward(self, *args: torch.Tensor, **kwargs: object) -> torch.Tensor:
        device = next(self.module.parameters()).device.type
        with torch.autocast(device, dtype=torch.bfloat16):
            return self.module(*args, **kwargs)


class FlexAttentionMhsa(Reference):
    """Multi-head self-attention through `flex_attention` with a causal block mask, compiled on
    CUDA (its fused kernel) and eager elsewhere (its reference path; on CPU forward only)."""

    def __init__(self, mhsa: nn.Module):
        super().__init__()
        from torch.nn.attention.flex_attention import flex_attention

        weights = dict(mhsa.named_parameters())
        width, heads, head = weights["WQ"].shape
        self.heads = heads
        self.qkv = nn.Linear(
            width, 3 * heads * head, bias=False, dtype=weights["WQ"].dtype, device=weights["WQ"].device
        )
        self.out = nn.Linear(heads * head, width, bias=False, dtype=weights["WQ"].dtype, device=weights["WQ"].device)
        with torch.no_grad():
            self.qkv.weight.copy_(torch.cat([weights[w].reshape(width, -1).T for w in ("WQ", "WK", "WV")]))
            self.out.weight.copy_(weights["WO"].reshape(-1, width).T)
        self.attend = torch.compile(flex_attention) if weights["WQ"].is_cuda else flex_attention
        self.masks: dict[tuple[int, str], BlockMask] = {}

    def _causal_mask(self, n: int, device: torch.device) -> BlockMask:
        from torch.nn.attention.flex_attention import create_block_mask

        key = (n, str(device))
        if key not in self.masks:  # made once per length, as a training loop would
            self.masks[key] = create_block_mask(lambda b, h, q, k: q >= k, None, None, n, n, device=str(device))
        return self.masks[key]

    def forward(self, x: torch.Tensor, causal: bool = False) -> torch.Tensor:
        b, n, _ = x.shape
        q, k, v = self.qkv(x).view(b, n, 3, self.heads, -1).permute(2, 0, 3, 1, 4)
        mask = self._causal_mask(n, x.device) if causal else None
        y = self.attend(q, k, v, block_mask=mask)
        return self.out(y.transpose(1, 2).reshape(b, n, -1))


# ---- nanoGPT-style language model (Karpathy's model.py, without dropout and biases in attention) ----


class CausalSelfAttention(nn.Module):
    """One Linear for Q, K and V, causal SDPA, one output Linear: nanoGPT's attention."""

    def __init__(self, width: int, heads: int):
        super().__init__()
        self.heads = heads
        self.c_attn = nn.Linear(width, 3 * width, bias=False)
        self.c_proj = nn.Linear(width, width, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        b, n, width = x.shape
        q, k, v = self.c_attn(x).view(b, n, 3, self.heads, width // self.heads).permute(2, 0, 3, 1, 4)
        y = functional.scaled_dot_product_attention(q, k, v, is_causal=True)
        return self.c_proj(y.transpose(1, 2).reshape(b, n, width))


class NanoBlock(nn.Module):
    def __init__(self, width: int, heads: int):
        super().__init__()
        self.ln_1, self.ln_2 = nn.LayerNorm(width), nn.LayerNorm(width)
        self.attn = CausalSelfAttention(width, heads)
        self.mlp = nn.Sequential(nn.Linear(width, 4 * width), nn.GELU(), nn.Linear(4 * width, width))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = x + self.attn(self.ln_1(x))
        return x + self.mlp(self.ln_2(x))


class NanoGpt(nn.Module):
    """Token and position embeddings, pre-norm blocks, a final LayerNorm and a bias-free head: the
    shape of `tdiag train`'s LanguageModel with mhsa, so tokens/s compare like for like."""

    def __init__(self, vocab: int, width: int, heads: int, layers: int, context: int):
        super().__init__()
        self.wte, self.wpe = nn.Embedding(vocab, width), nn.Embedding(context, width)
        self.blocks = nn.ModuleList(NanoBlock(width, heads) for _ in range(layers))
        self.ln_f = nn.LayerNorm(width)
        self.lm_head = nn.Linear(width, vocab, bias=False)

    def forward(self, ids: torch.Tensor) -> torch.Tensor:
        x = self.wte(ids) + self.wpe(torch.arange(ids.shape[-1], device=ids.device))
        for block in self.blocks:
            x = block(x)
        return self.lm_head(self.ln_f(x))
