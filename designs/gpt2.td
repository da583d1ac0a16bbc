# GPT-2's self-attention block: fused QKV projection with biases, causal multi-head attention.
# Paper: Radford et al., "Language Models are Unsupervised Multitask Learners" (2019), Sec. 2.3
# (the Transformer decoder of GPT-1, Radford et al. 2018, Sec. 3.1), with the multi-head attention
# of Vaswani et al., "Attention Is All You Need" (2017), eq. (1) and Sec. 3.2.2.
# Module: Hugging Face transformers' GPT2Attention (models/gpt2/modeling_gpt2.py): c_attn, a Conv1D
# (y = x W + b, W stored [F, 3F]), split into q, k, v of F columns each and each viewed as
# (heads, head_dim); softmax(q kᵀ · head_dim^−0.5) v, causal; c_proj, a Conv1D with bias.
# Readings:
# - The fused weight as the checkpoint stores it: c_attn.weight [F, 3F] is Wattn[f, t, h, d]
#   (row-major, the same numbers: columns t·F + h·D + d, t = 0 query, 1 key, 2 value), its bias
#   [3F] is battn[t, h, d]; q, k and v read the fused tables at t = 0, 1, 2.
# - c_proj.weight [F, F] is WO[(h e), g] viewed as WO[h, e, g]; its bias bo[g].
# - scale_attn_weights = True (scale head_dim^−0.5), scale_attn_by_inverse_layer_idx = False,
#   reorder_and_upcast_attn = False (the GPT-2 checkpoints' settings); no dropout (eval).
# - Causal as a decoder: `with_causal_mask()` (HF's is_causal = True). GPT-2 small is F = 768,
#   H = 12 (the defaults here are the library's F = 512, H = 8); normal(std = 0.02) is its init.
# family: production
design gpt2

size F = 512, H = 8, D = F / H
size N

input X[n: N, f: F]
param Wattn[f: F, t: 3, h: H, d: D] = normal(std = 0.02)
param battn[t: 3, h: H, d: D] = zeros
param WO[h: H, e: D, g: F] = normal(std = 0.02)
param bo[g: F] = zeros

Q[n h d] = X[n f] Wattn[f, t = 0, h, d] + battn[t = 0, h, d]
K[m h d] = X[m f] Wattn[f, t = 1, h, d] + battn[t = 1, h, d]
V[m h e] = X[m f] Wattn[f, t = 2, h, e] + battn[t = 2, h, e]
A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m h d])
Y[n g]   = A[h n m] V[m h e] WO[h e g] + bo[g]

output Y
