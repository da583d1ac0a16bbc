# Qwen2's self-attention block: Llama's grouped-query attention with rotate-half RoPE, plus biases
# on the query, key and value projections.
# Paper: Yang et al., "Qwen2 Technical Report" (2024), Sec. 2.2.1 (grouped-query attention, RoPE,
# "QKV bias for attention", dual chunk attention with YARN for long contexts); Bai et al.,
# "Qwen Technical Report" (2023), Sec. 2.2 (the bias: "we add biases to the QKV layer"); the
# rotation of Su et al., RoFormer (2021), eq. (34), logits eq. (16).
# Module: Hugging Face transformers' Qwen2Attention (models/qwen2/modeling_qwen2.py), as it
# computes: q, k, v = q_proj(x), k_proj(x), v_proj(x) (nn.Linear with bias = True);
# (q, k) = apply_rotary_pos_emb with rotate_half; softmax(q kᵀ · head_dim^−0.5) v with each
# key-value head repeated (repeat_kv); o_proj (bias = False).
# Readings:
# - Extends llama.td: the projections Q, K, V it rotates and attends with get the biases
#   bq[g r d], bk[g d], bv[g e] (HF's q_proj.bias [H·D] viewed head-major as (g r d), k_proj.bias
#   and v_proj.bias [G·D] as (g d)); o_proj has none.
# - Theta = 1000000 (Qwen2Config's rope_theta default, the released checkpoints' too).
# - Qwen2-7B: F = 3584, H = 28, G = 4, D = 128 (F / H). Set D to decouple the head width.
# - No sliding window (use_sliding_window = False, the released models' setting; dual chunk
#   attention for long contexts is not HF's module); causal as a decoder: `with_causal_mask()`.
# family: production
design qwen2 extends llama

replace size Theta = 1000000
param bq[g: G, r: R, d: D] = zeros
param bk[g: G, d: D] = zeros
param bv[g: G, e: D] = zeros

replace Q[n g r d] = X[n f] WQ[f g r d] + bq[g r d]
replace K[m g d]   = X[m f] WK[f g d] + bk[g d]
replace V[m g e]   = X[m f] WV[f g e] + bv[g e]
