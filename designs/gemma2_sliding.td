# Gemma 2's local sliding-window layer: the global layer of designs/gemma2.td (GQA, RoPE,
# query_pre_attn_scalar scaling, the tanh logit softcap) with each query seeing only itself and the
# W − 1 keys before it.
# Paper: Gemma Team, "Gemma 2: Improving Open Language Models at a Practical Size" (2024), Sec. 2.1
# (local sliding-window attention of 4096 tokens alternating with global attention, Table 1);
# Hugging Face transformers' Gemma2Attention of a "sliding_attention" layer with
# config.sliding_window = 4096.
# The box, eq. of designs/gemma2.td over the window: A[n m] = exp(c(s_nm)) / Σ_{n − W < m' ≤ n} exp(c(s_nm'))
# for n − W < m ≤ n, 0 elsewhere, with s = q·k / √QS and c(s) = 50 tanh(s / 50).
# Readings:
# - HF's sliding_window_causal_mask_function: key m visible to query n where n − W < m ≤ n, i.e.
#   window(n, m, W); the softcap applies to the scores before the mask, as in HF's eager forward.
# - Causal by its window: with_causal_mask leaves it unchanged.
# - `--attention flex` applies the softcap in score_mod and the window as the block mask; by
#   default the box is materialized over its window (SDPA cannot apply a map to its scores).
# family: production
design gemma2_sliding extends gemma2

size W = 4096

replace A[g r n m] = softmax[m, mask = window(n, m, W)](50 tanh(Qr[n g r d] Kr[m g d] / sqrt(QS) / 50))
