"""gpt-oss's attention with sinks, forward and backward, float32, one thread: designs/gpt_oss.td
in the SDPA sink form (forms/sdpa_sink.py) and as the materialized box, next to Hugging Face's
GptOssAttention (eager: HF has no SDPA path for sinks), causal, weights random, timed round-robin
in one process (median, min, max in ms).

    OMP_NUM_THREADS=1 python scripts/bench_sinks.py --n 256 --repeat 15

Sizes F = 512, 8 query heads over 2 key-value heads of width 64 (--n sets the length)."""

from __future__ import annotations

import argparse
import time

import torch
from transformers.models.gpt_oss.modeling_gpt_oss import GptOssAttention, GptOssConfig

import tdiag
from tdiag.plan import forms

F, G, R, D, THETA = 512, 2, 4, 64, 150000.0


def tdiag_module(n: int, form: str) -> torch.nn.Module:
    """The causal design at length n with `form` the only fused form weighed."""
    design = tdiag.load("designs/gpt_oss.td", F=F, G=G, R=R, H=G * R, D=D).with_causal_mask()
    saved = forms.FORMS
    forms.FORMS = [f for f in saved if f.name in (form, "materialized")]
    try:
        module = design.module(N=n, objective="memory" if form != "materialized" else "time")
    finally:
        forms.FORMS = saved
    assert [c.taken for c in module.tdiag_plan.choices] == [form]
    return module


def hf_call(n: int):
    config = GptOssConfig(
        hidden_size=F,
        num_attention_heads=G * R,
        num_key_value_heads=G,
        head_dim=D,
        num_hidden_layers=1,
        layer_types=["full_attention"],
        attention_bias=True,
        rope_parameters={"rope_type": "default", "rope_theta": THETA},
    )
    config._attn_implementation = "eager"
    module = GptOssAttention(config, 0)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.normal_(0.0, 0.02)
    angles = torch.arange(n).float()[:, None] / (THETA ** (torch.arange(0, D, 2).float() / D))
    rotary = (angles.cos()[None], angles.sin()[None])
    future = torch.ones(n, n, dtype=torch.bool).triu(1)
    mask = torch.zeros(n, n).masked_fill(future, torch.finfo(torch.float32).min)[None, None]
    return lambda x: module(x, position_embeddings=rotary, attention_mask=mask)[0]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=256)
    parser.add_argument("--repeat", type=int, default=15)
    args = parser.parse_args()
    torch.set_num_threads(1)
    calls = {
        "tdiag sdpa_sink": tdiag_module(args.n, "sdpa_sink"),
        "tdiag materialized": tdiag_module(args.n, "materialized"),
        "HF eager": hf_call(args.n),
    }
    x = torch.randn(1, args.n, F)
    times: dict[str, list[float]] = {name: [] for name in calls}
    for call in calls.values():
        call(x).sum().backward()
    for _ in range(args.repeat):
        for name, call in calls.items():
            start = time.perf_counter()
            call(x).sum().backward()
            times[name].append(time.perf_counter() - start)
    for name, measured in times.items():
        measured.sort()
        median, low, high = (1e3 * measured[k] for k in (len(measured) // 2, 0, -1))
        print(f"N={args.n} {name:20s} median {median:8.1f} ms  min {low:8.1f}  max {high:8.1f}")


if __name__ == "__main__":
    main()
