# Gemma 3's local sliding-window layer: the global layer of designs/gemma3.td (GQA, QK-norm with
# Gemma's (1 + w) RMS norm, query_pre_attn_scalar scaling) with each query seeing only itself and
# the W − 1 keys before it, and RoPE of its own base.
# Paper: Gemma Team, "Gemma 3 Technical Report" (2025), Sec. 2 (5 local layers per global layer,
# local attention span 1024 tokens, RoPE base 10k on local layers); Hugging Face transformers'
# Gemma3Attention of a "sliding_attention" layer with config.sliding_window = W.
# The box, eq. of designs/gemma3.td over the window: A[n m] = exp(s_nm) / Σ_{n − W < m' ≤ n} exp(s_nm')
# for n − W < m ≤ n, 0 elsewhere, with s = q·k / √QS.
# Readings:
# - HF's sliding_window_causal_mask_function(W): key m visible to query n where n − W < m ≤ n,
#   i.e. window(n, m, W). Gemma3TextConfig's default sliding_window is 4096; the released models
#   set 1024 (the default here).
# - RoPE base Theta = 10000 (Gemma3TextConfig's default_theta["local"], rope_local_base_freq) and
#   no position scaling (Factor = 1: the released models scale only the global layers).
# - Causal by its window: with_causal_mask leaves it unchanged. (Gemma 3 with
#   use_bidirectional_attention = True is an encoder whose window is two-sided; not this design.)
# family: production
design gemma3_sliding extends gemma3

replace size Theta = 10000
size W = 1024

replace A[g r n m] = softmax[m, scale = 1 / sqrt(QS), mask = window(n, m, W)](Qr[n g r d] Kr[m g d])
