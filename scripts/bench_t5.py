"""T5's self-attention: tdiag's designs/t5.td (encoder) and t5_decoder.td (causal) against Hugging
Face transformers' T5Attention (its sdpa implementation), forward + backward, round-robin in one
process (tdiag.bench.measure_all); each pair checked equal in float64 first.

    OMP_NUM_THREADS=1 python scripts/bench_t5.py --n 256 2048 --repeat 5 --out docs/results/bench-cpu/t5
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import torch
from torch import nn

import tdiag
from tdiag.bench import measure_all

ROOT = Path(__file__).resolve().parent.parent


class HF(nn.Module):
    """T5Attention called as a layer: its output alone (the decoder masks by is_causal)."""

    def __init__(self, attn: nn.Module):
        super().__init__()
        self.attn = attn

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.attn(x)[0]


def pair(decoder: bool, args) -> tuple[nn.Module, nn.Module]:
    """The tdiag module and HF's T5Attention with the same random weights (float32)."""
    from transformers import T5Config
    from transformers.models.t5.modeling_t5 import T5Attention

    config = T5Config(
        d_model=args.width,
        d_kv=args.head,
        num_heads=args.heads,
        relative_attention_num_buckets=32,
        relative_attention_max_distance=128,
        dropout_rate=0.0,
        is_decoder=decoder,
        attn_implementation="sdpa",
    )
    torch.manual_seed(0)
    attn = T5Attention(config, has_relative_attention_bias=True, layer_idx=0, is_causal=decoder)
    nn.init.normal_(attn.relative_attention_bias.weight)
    design = tdiag.load(
        ROOT / "designs" / f"{'t5_decoder' if decoder else 't5'}.td", F=args.width, H=args.heads, D=args.head
    )
    ours = design.module()
    f, h, d = args.width, args.heads, args.head
    with torch.no_grad():
        ours.WQ.copy_(attn.q.weight.T.reshape(f, h, d))
        ours.WK.copy_(attn.k.weight.T.reshape(f, h, d))
        ours.WV.copy_(attn.v.weight.T.reshape(f, h, d))
        ours.WO.copy_(attn.o.weight.T.reshape(h, d, f))
        ours.Rel.copy_(attn.relative_attention_bias.weight)
    return ours, HF(attn)


def max_difference(ours: nn.Module, theirs: nn.Module, args) -> float:
    """Max |tdiag − HF| relative to HF's largest entry, float64, N = 150 (every bucket read)."""
    ours64, theirs64 = ours.to(torch.float64), theirs.to(torch.float64)
    x = torch.randn(1, 150, args.width, dtype=torch.float64)
    with torch.no_grad():
        a, b = ours64(x), theirs64(x)
    ours.float(), theirs.float()
    return ((a - b).abs().max() / b.abs().max()).item()


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, nargs="+", default=[256, 2048])
    parser.add_argument("--width", type=int, default=512)
    parser.add_argument("--heads", type=int, default=8)
    parser.add_argument("--head", type=int, default=64)
    parser.add_argument("--repeat", type=int, default=5)
    parser.add_argument("--forms", nargs="+", default=["encoder", "decoder"])
    parser.add_argument("--out", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)
    rows = []
    for form in args.forms:
        ours, theirs = pair(form == "decoder", args)
        difference = max_difference(ours, theirs, args)
        assert difference < 1e-10, (form, difference)
        for n in args.n:
            timings = measure_all([ours, theirs], torch.randn(1, n, args.width), False, args.repeat)
            mine, hf = (t.seconds for t in timings)
            ratios = sorted(a / b for a, b in zip(mine, hf, strict=True))
            row = {
                "form": form,
                "n": n,
                "tdiag ms": 1e3 * sorted(mine)[len(mine) // 2],
                "hf ms": 1e3 * sorted(hf)[len(hf) // 2],
                "tdiag / hf": ratios[len(ratios) // 2],
                "min": ratios[0],
                "max": ratios[-1],
                "tdiag kept MB": timings[0].saved_bytes / 1e6,
                "hf kept MB": timings[1].saved_bytes / 1e6,
                "float64 max relative difference": difference,
            }
            rows.append(row)
            print(
                f"{form:<8} N={n:>5}  tdiag {row['tdiag ms']:8.1f} ms  HF {row['hf ms']:8.1f} ms  "
                f"tdiag/HF {row['tdiag / hf']:.2f} ({row['min']:.2f}-{row['max']:.2f})  "
                f"kept MB {row['tdiag kept MB']:.1f}, {row['hf kept MB']:.1f}  (float64 diff {difference:.1e})",
                flush=True,
            )
    if args.out:
        out = Path(args.out)
        out.mkdir(parents=True, exist_ok=True)
        (out / "t5.json").write_text(json.dumps(rows, indent=1) + "\n")


if __name__ == "__main__":
    main()
