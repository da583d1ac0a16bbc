# gpt-oss's sliding-window layer: the full-attention layer of designs/gpt_oss.td (GQA, RoPE,
# biases, a learned sink per head) with each query seeing only itself and the W − 1 keys before it.
# Paper: OpenAI, "gpt-oss-120b & gpt-oss-20b Model Card" (2025), Sec. 2.1: layers alternate between
# banded (a window of 128 tokens) and dense attention; Hugging Face transformers' GptOssAttention of
# a "sliding_attention" layer with config.sliding_window = 128.
# The box, eq. of designs/gpt_oss.td over the window: A[h n m] = exp(q_n·k_m / √D) /
# (exp(s_h) + Σ_{n − W < m' ≤ n} exp(q_n·k_m' / √D)) for n − W < m ≤ n, 0 elsewhere.
# Readings:
# - HF's sliding_window_causal_mask_function: key m visible to query n where n − W < m ≤ n, i.e.
#   window(n, m, W); the sink stays in every row's denominator, as the full layer's.
# - Causal by its window: with_causal_mask leaves it unchanged.
# family: production
design gpt_oss_sliding extends gpt_oss

size W = 128

replace A[g r n m] = softmax[m, scale = 1 / sqrt(D), sink = S[g r], mask = window(n, m, W)](Qr[n g r d] Kr[m g d])
