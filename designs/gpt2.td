# GPT-2's self-attention block: fused QKV projection with biases, causal multi-head attention.
# Paper: Radford et al., "Language Models are Unsupervised Multitask Learners" (2019), Sec. 2.3
# (the Transformer decoder of GPT-1, Radford et al. 2018, Sec. 3.1), with the multi-head attention
# of Vaswani et al., "Attention Is All You Need" (2017), eq. (1) and Sec. 3.2.2.
# Module: Hugging Face transformers' GPT2Attention (models/gpt2/modeling_gpt2.py): c_attn, a Conv1D
# (y = x W + b, W stored [F, 3F]), split into q, k, v of F columns each and each viewed as
# (heads, head_dim); softmax(q kᵀ · head_dim^−0.5) v, causal; c_proj, a Conv1D with bias.
# Readings:
# - The fused weight as the checkpoint stores it: c_attn.weight [F, 3F] is Wattn[f, j], its bias
#   [3F] battn[j]; one projection QKV = x Wattn + battn, as HF's Conv1D, whose columns 0..F are
#   q, F..2F k and 2F..3F v, each viewed as (h d): column h·D + d (HF's split and view); the
#   ranges are written in H·D (= F) so that a head width set apart from F / H is checked against
#   the heads it views.
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
param Wattn[f: F, j: 3 * F] = normal(std = 0.02)
param battn[j: 3 * F] = zeros
param WO[h: H, e: D, g: F] = normal(std = 0.02)
param bo[g: F] = zeros

QKV[n j] = X[n f] Wattn[f j] + battn[j]                      # c_attn
Q[n c]   = QKV[n, c: 0..H * D]
K[m c]   = QKV[m, c: H * D..2 * H * D]
V[m c]   = QKV[m, c: 2 * H * D..3 * H * D]
A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n (h d)] K[m (h d)])
Y[n g]   = A[h n m] V[m (h e)] WO[h e g] + bo[g]              # c_proj

output Y
