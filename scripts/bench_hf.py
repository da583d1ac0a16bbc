"""The production designs against Hugging Face transformers' attention modules: for each design
(designs/llama.td, qwen3, mistral, gpt2, falcon, bloom, bert, deepseek_mla), time a training step (forward, mean-square
loss, backward) of tdiag's compiled module and of the HF module it equals (tests/test_hf_models.py)
holding the same weights, round-robin in one process (float32, batch 1, one thread). HF's module
runs with attn_implementation="sdpa" where it has one (BloomAttention has none: eager). Each HF
step also computes what tdiag's module computes in its forward and HF's model computes once per
forward outside the attention module: the RoPE cos/sin tables (the model's rotary embedding),
BLOOM's alibi tensor and causal mask. The decoders are causal on both sides (HF: no attention mask,
is_causal; BLOOM: HF's additive causal mask); BERT runs without a padding mask. Before timing, the
two are checked equal in float32 (max relative difference printed). Prints each tdiag / HF ratio
with its min-max over rounds and the bytes each keeps for backward, and writes JSON and CSV to --out.

    OMP_NUM_THREADS=1 python scripts/bench_hf.py --n 256 2048 --repeat 5 --out docs/results/bench-cpu/hf"""

from __future__ import annotations

import argparse
import csv
import json
import platform
from collections.abc import Callable
from pathlib import Path

import torch
from torch import nn

import tdiag
from tdiag.bench import measure_all

ROOT = Path(__file__).resolve().parent.parent
F, H, G = 512, 8, 2  # the designs' defaults (llama, qwen3, mistral: G = 2 key-value heads)
MISTRAL_WINDOW = 256  # designs/mistral.td's W
D = F // H


def positions(x: torch.Tensor) -> torch.Tensor:
    return torch.arange(x.shape[-2], device=x.device)[None]


class Llama(nn.Module):
    """LlamaAttention (or Qwen3Attention, or MistralAttention with its sliding-window mask) with its
    model's rotary embedding, causal."""

    def __init__(self, name: str):
        super().__init__()
        self.window = None
        if name == "llama":
            from transformers import LlamaConfig as Config
            from transformers.models.llama.modeling_llama import LlamaAttention as Attention
            from transformers.models.llama.modeling_llama import LlamaRotaryEmbedding as Rotary

            theta, more = 10000, {}
        elif name == "mistral":
            from transformers import MistralConfig as Config
            from transformers.models.mistral.modeling_mistral import MistralAttention as Attention
            from transformers.models.mistral.modeling_mistral import MistralRotaryEmbedding as Rotary

            theta, more = 10000, {"sliding_window": MISTRAL_WINDOW}
            self.window = MISTRAL_WINDOW
        else:
            from transformers import Qwen3Config as Config
            from transformers.models.qwen3.modeling_qwen3 import Qwen3Attention as Attention
            from transformers.models.qwen3.modeling_qwen3 import Qwen3RotaryEmbedding as Rotary

            theta, more = 1000000, {"head_dim": D, "rms_norm_eps": 1e-6}
        config = Config(
            hidden_size=F,
            num_attention_heads=H,
            num_key_value_heads=G,
            attention_dropout=0.0,
            rope_parameters={"rope_type": "default", "rope_theta": theta},
            attn_implementation="sdpa",
            **more,
        )
        self.attn, self.rotary = Attention(config, 0), Rotary(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        mask = None
        if self.window is not None:  # the boolean band the model builds once per forward (True: attend)
            n, m = torch.arange(x.shape[-2])[:, None], torch.arange(x.shape[-2])[None, :]
            mask = ((m <= n) & (m > n - self.window))[None, None]
        return self.attn(x, position_embeddings=self.rotary(x, positions(x)), attention_mask=mask)[0]

    def weights(self) -> dict[str, torch.Tensor]:
        a, r = self.attn, H // G
        tensors = {
            "WQ": a.q_proj.weight.T.reshape(F, G, r, D),
            "WK": a.k_proj.weight.T.reshape(F, G, D),
            "WV": a.v_proj.weight.T.reshape(F, G, D),
            "WO": a.o_proj.weight.T.reshape(G, r, D, F),
        }
        if hasattr(a, "q_norm"):
            tensors |= {"nq": a.q_norm.weight, "nk": a.k_norm.weight}
        return tensors


class GPT2(nn.Module):
    def __init__(self):
        super().__init__()
        from transformers import GPT2Config
        from transformers.models.gpt2.modeling_gpt2 import GPT2Attention

        config = GPT2Config(n_embd=F, n_head=H, attn_pdrop=0.0, resid_pdrop=0.0, attn_implementation="sdpa")
        self.attn = GPT2Attention(config, layer_idx=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x)[0]

    def weights(self) -> dict[str, torch.Tensor]:
        a = self.attn
        return {
            "Wattn": a.c_attn.weight,
            "battn": a.c_attn.bias,
            "WO": a.c_proj.weight.view(H, D, F),
            "bo": a.c_proj.bias,
        }


class Falcon(nn.Module):
    """FalconAttention as in Falcon-7B (multi-query, rotary) with its model's rotary embedding."""

    def __init__(self):
        super().__init__()
        from transformers import FalconConfig
        from transformers.models.falcon.modeling_falcon import FalconAttention, FalconRotaryEmbedding

        config = FalconConfig(
            hidden_size=F,
            num_attention_heads=H,
            multi_query=True,
            new_decoder_architecture=False,
            alibi=False,
            bias=False,
            attention_dropout=0.0,
            attn_implementation="sdpa",
        )
        self.attn, self.rotary = FalconAttention(config, layer_idx=0), FalconRotaryEmbedding(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        tables = self.rotary(x, positions(x))
        return self.attn(x, alibi=None, attention_mask=None, position_embeddings=tables)[0]

    def weights(self) -> dict[str, torch.Tensor]:
        a = self.attn
        return {"Wqkv": a.query_key_value.weight.T.reshape(F, H + 2, D), "WO": a.dense.weight.T.reshape(H, D, F)}


MLA_RANKS = {"q_lora_rank": 96, "kv_lora_rank": 64, "qk_rope_head_dim": 16, "qk_nope_head_dim": 32, "v_head_dim": 32}


class DeepseekMLA(nn.Module):
    """DeepseekV3Attention (multi-head latent attention, interleaved RoPE) at designs/deepseek_mla.td's
    default ranks, with its model's rotary embedding, causal."""

    def __init__(self):
        super().__init__()
        from transformers import DeepseekV3Config
        from transformers.models.deepseek_v3.modeling_deepseek_v3 import (
            DeepseekV3Attention,
            DeepseekV3RotaryEmbedding,
        )

        config = DeepseekV3Config(
            hidden_size=F, num_attention_heads=H, num_key_value_heads=H, attention_dropout=0.0,
            attn_implementation="sdpa", **MLA_RANKS,
        )  # fmt: skip
        self.attn, self.rotary = DeepseekV3Attention(config, layer_idx=0), DeepseekV3RotaryEmbedding(config)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x, position_embeddings=self.rotary(x, positions(x)), attention_mask=None)[0]

    def weights(self) -> dict[str, torch.Tensor]:
        a, r = self.attn, MLA_RANKS
        c, e, v, latent = r["qk_nope_head_dim"], r["qk_rope_head_dim"], r["v_head_dim"], r["kv_lora_rank"]
        q_b = a.q_b_proj.weight.view(H, c + e, r["q_lora_rank"]).permute(2, 0, 1)
        kv_b = a.kv_b_proj.weight.view(H, c + v, latent).permute(2, 0, 1)
        return {
            "Wqa": a.q_a_proj.weight.T,
            "nqa": a.q_a_layernorm.weight,
            "WqN": q_b[..., :c],
            "WqR": q_b[..., c:],
            "Wkva": a.kv_a_proj_with_mqa.weight[:latent].T,
            "WkR": a.kv_a_proj_with_mqa.weight[latent:].T,
            "nkv": a.kv_a_layernorm.weight,
            "WkN": kv_b[..., :c],
            "WV": kv_b[..., c:],
            "WO": a.o_proj.weight.T.reshape(H, v, F),
        }


class Bloom(nn.Module):
    """BloomAttention (eager: it has no other) with build_alibi_tensor's bias and an additive
    causal mask, as BloomModel builds them; no residual (0)."""

    def __init__(self):
        super().__init__()
        from transformers import BloomConfig
        from transformers.models.bloom.modeling_bloom import BloomAttention

        config = BloomConfig(hidden_size=F, n_head=H, attention_dropout=0.0, hidden_dropout=0.0)
        self.attn = BloomAttention(config, layer_idx=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        from transformers.models.bloom.modeling_bloom import build_alibi_tensor

        batch, n, _ = x.shape
        alibi = build_alibi_tensor(torch.ones(batch, n, dtype=torch.long), H, x.dtype)
        hidden = torch.ones(n, n, dtype=torch.bool).triu(1)
        mask = torch.zeros(n, n, dtype=x.dtype).masked_fill(hidden, torch.finfo(x.dtype).min)[None, None]
        return self.attn(x, torch.zeros((), dtype=x.dtype), alibi, mask)[0]

    def weights(self) -> dict[str, torch.Tensor]:
        a = self.attn
        return {
            "Wqkv": a.query_key_value.weight.view(H, 3 * D, F),
            "bqkv": a.query_key_value.bias.view(H, 3 * D),
            "WO": a.dense.weight.T.reshape(H, D, F),
            "bo": a.dense.bias,
        }


class Bert(nn.Module):
    """BertAttention (self-attention, dense, residual, LayerNorm), no padding mask."""

    def __init__(self):
        super().__init__()
        from transformers import BertConfig
        from transformers.models.bert.modeling_bert import BertAttention

        config = BertConfig(
            hidden_size=F,
            num_attention_heads=H,
            attention_probs_dropout_prob=0.0,
            hidden_dropout_prob=0.0,
            layer_norm_eps=1e-12,
            attn_implementation="sdpa",
        )
        self.attn = BertAttention(config, layer_idx=0)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x)[0]

    def weights(self) -> dict[str, torch.Tensor]:
        s, o = self.attn.self, self.attn.output
        projections = {"Q": s.query, "K": s.key, "V": s.value}
        return {
            **{f"W{k}": p.weight.T.reshape(F, H, D) for k, p in projections.items()},
            **{f"b{k.lower()}": p.bias.view(H, D) for k, p in projections.items()},
            "WO": o.dense.weight.T.reshape(H, D, F),
            "bo": o.dense.bias,
            "ln_w": o.LayerNorm.weight,
            "ln_b": o.LayerNorm.bias,
        }


MODELS: dict[str, tuple[Callable[[], nn.Module], bool, str]] = {  # HF module, causal, its implementation
    "llama": (lambda: Llama("llama"), True, "sdpa"),
    "qwen3": (lambda: Llama("qwen3"), True, "sdpa"),
    "mistral": (lambda: Llama("mistral"), True, "sdpa"),
    "gpt2": (GPT2, True, "sdpa"),
    "falcon": (Falcon, True, "sdpa"),
    "bloom": (Bloom, True, "eager"),
    "bert": (Bert, False, "sdpa"),
    "deepseek_mla": (DeepseekMLA, True, "sdpa"),
}


def pair(name: str, n: int) -> tuple[nn.Module, nn.Module, float]:
    """(tdiag's module planned at N = n, the HF module with the same weights, their max relative
    difference in float32 at length n)."""
    build, causal, _ = MODELS[name]
    torch.manual_seed(0)
    hf = build().eval()
    with torch.no_grad():
        for parameter in hf.parameters():
            parameter.copy_(0.3 * torch.randn_like(parameter))
    design = tdiag.load(
        ROOT / "designs" / f"{name}.td", F=F, H=H, **({"G": G} if name in ("llama", "qwen3", "mistral") else {})
    )
    module = (design.with_causal_mask() if causal else design).module(N=n)
    with torch.no_grad():
        for key, value in hf.weights().items():
            getattr(module, key).copy_(value)
        x = torch.randn(1, n, F)
        expected = hf(x)
        difference = float((module(x) - expected).abs().max() / expected.abs().max())
    return module, hf, difference


def measure(name: str, n: int, repeat: int) -> dict:
    module, hf, difference = pair(name, n)
    tdiag_time, hf_time = measure_all([module, hf], torch.randn(1, n, F), False, repeat)
    ratios = sorted(a / b for a, b in zip(tdiag_time.seconds, hf_time.seconds, strict=True))
    median = lambda values: sorted(values)[len(values) // 2]  # noqa: E731
    row = {
        "design": name,
        "n": n,
        "hf implementation": MODELS[name][2],
        "causal": MODELS[name][1],
        "tdiag ms": 1e3 * median(tdiag_time.seconds),
        "hf ms": 1e3 * median(hf_time.seconds),
        "tdiag / hf": median(ratios),
        "tdiag / hf min": ratios[0],
        "tdiag / hf max": ratios[-1],
        "tdiag kept MB": tdiag_time.saved_bytes / 1e6,
        "hf kept MB": hf_time.saved_bytes / 1e6,
        "float32 max relative difference": difference,
    }
    print(f"{name:<12} {n:>5} {row['hf implementation']:>6} {row['tdiag ms']:>9.1f} {row['hf ms']:>9.1f}"
          f"  {row['tdiag / hf']:>5.2f} ({ratios[0]:.2f}-{ratios[-1]:.2f})"
          f"  {row['tdiag kept MB']:>7.1f} {row['hf kept MB']:>7.1f}  {difference:.1e}", flush=True)  # fmt: skip
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--designs", nargs="+", default=list(MODELS), choices=list(MODELS))
    parser.add_argument("--n", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    print(f"{'design':<12} {'N':>5} {'HF':>6} {'tdiag ms':>9} {'HF ms':>9}  {'tdiag/HF (min-max)':>18}"
          f"  {'kept MB tdiag':>13} {'HF':>5}  float32 diff")  # fmt: skip
    rows = [measure(name, n, args.repeat) for n in args.n for name in args.designs]
    if args.out:
        write(Path(args.out), rows, args)


def write(out: Path, rows: list[dict], args: argparse.Namespace) -> None:
    import transformers

    out.mkdir(parents=True, exist_ok=True)
    settings = {"F": F, "H": H, "G (llama, qwen3)": G, "repeat": args.repeat, "batch": 1, "threads": 1}
    settings |= {"dtype": "float32", "torch": torch.__version__, "transformers": transformers.__version__}
    settings |= {"machine": platform.platform()}
    (out / "hf.json").write_text(json.dumps({"settings": settings, "rows": rows}, indent=2))
    with (out / "hf.csv").open("w", newline="") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)


if __name__ == "__main__":
    main()
