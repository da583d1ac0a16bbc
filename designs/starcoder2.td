# StarCoder2's self-attention block: Mistral's grouped-query attention with rotate-half RoPE and a
# sliding window, plus biases on every projection.
# Paper: Lozhkov et al., "StarCoder 2 and The Stack v2: The Next Generation" (2024), its model
# architecture section (grouped-query attention, RoPE, a sliding window of 4096 tokens, biases in
# the linear layers); the rotation of Su et al., RoFormer (2021), eq. (34), logits eq. (16).
# Module: Hugging Face transformers' Starcoder2Attention (models/starcoder2/modeling_starcoder2.py),
# as it computes: q, k, v = q_proj(x), k_proj(x), v_proj(x) (nn.Linear with bias = use_bias =
# True); (q, k) = apply_rotary_pos_emb with rotate_half; softmax(q kᵀ · head_dim^−0.5 + mask) v
# with each key-value head repeated (repeat_kv), the mask the model's
# create_sliding_window_causal_mask; o_proj with its bias; residual dropout (eval: none).
# Readings:
# - Extends mistral.td (its window: key m visible from query n where n − W < m ≤ n, HF's
#   sliding_window_causal_mask_function(W)); the projections get the biases bq[g r d], bk[g d],
#   bv[g e] (HF's q_proj.bias [H·D] viewed head-major as (g r d), k_proj.bias and v_proj.bias
#   [G·D] as (g d)) and the output its bias bo[o].
# - Theta = 10000 (Starcoder2Config's default); each released checkpoint sets its own rope_theta
#   in its config: set the size. W = 4096 in the released models (the default here, 256, is
#   mistral.td's); Starcoder2Config's defaults are F = 3072, H = 24, G = 2.
# - Head width D = F / H; scale head_dim^−0.5. The window makes the design causal:
#   `with_causal_mask()` returns it unchanged.
# family: production
design starcoder2 extends mistral

param bq[g: G, r: R, d: D] = zeros
param bk[g: G, d: D] = zeros
param bv[g: G, e: D] = zeros
param bo[o: F] = zeros

replace Q[n g r d] = X[n f] WQ[f g r d] + bq[g r d]
replace K[m g d]   = X[m f] WK[f g d] + bk[g d]
replace V[m g e]   = X[m f] WV[f g e] + bv[g e]
replace Y[n o]     = A[g r n m] V[m g e] WO[g r e o] + bo[o]
