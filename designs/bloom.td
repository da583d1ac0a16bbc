# BLOOM's self-attention block: multi-head attention with ALiBi, from one fused QKV projection.
# Paper: BigScience Workshop, "BLOOM: A 176B-Parameter Open-Access Multilingual Language Model"
# (2022), Sec. 3.2 (model architecture: ALiBi positional embeddings), with Press, Smith and Lewis,
# "Train Short, Test Long" (ICLR 2022), Sec. 3, eq. softmax(q_i Kᵀ + m · [−(i−1), ..., −1, 0])
# (head slopes m).
# Module: Hugging Face transformers' BloomAttention (models/bloom/modeling_bloom.py): query_key_value(x)
# viewed as (heads, 3, head_dim); scores alibi + q kᵀ / sqrt(head_dim) (one baddbmm, beta = 1,
# alpha = 1 / sqrt(head_dim)), the alibi of build_alibi_tensor = slope_h · (key position);
# softmax (in float32, cast back), times v; dense.
# Readings:
# - The fused weight as the checkpoint stores it: query_key_value.weight [H·3·D, F] is
#   Wqkv[h, j, f] (per head, its 3·D rows: query, key, value), its bias bqkv[h, j]; one projection
#   QKV = x Wqkvᵀ + b, as HF's Linear, q, k, v its ranges 0..D, D..2D, 2D..3D of each head's
#   3·D columns (HF's view and split). dense.weight [F, H·D] is WO[h, e, g]
#   transposed, its bias bo[g]. BLOOM always has these biases.
# - The bias as BLOOM computes it: + slope_h · m (the key's position, from 0), not the paper's
#   −slope_h · (n − m): under the causal mask they differ by slope_h · n, the same for every key
#   of a row, which the softmax cancels; without a mask this is what the module computes.
# - Slopes 2^(−8(h+1)/H), h = 0 .. H − 1 (_get_alibi_slopes: base 2^(−8/H) to the powers 1 .. H),
#   exact for H a power of two (BLOOM-560m and -1b7: 16 heads, -3b and -7b1: 32). BLOOM-176B's
#   112 heads take the slopes of the next lower power of two plus interleaved ones, which needs
#   floor(log2 H): not written here.
# - Scale 1/√D on q·k only (the alibi term is unscaled); HF computes the softmax in float32, here
#   in the compute dtype; no dropout (eval). BLOOM is a decoder: `with_causal_mask()`.
# - The block's output is dense(context); HF's BloomAttention also adds the residual (dropout_add),
#   which belongs to the layer, not the attention.
# family: production
design bloom

size F = 512, H = 8, D = F / H
size N

input X[n: N, f: F]
param Wqkv[h: H, j: 3 * D, f: F] = normal(std = 0.02)
param bqkv[h: H, j: 3 * D] = zeros
param WO[h: H, e: D, g: F] = normal(std = 0.02)
param bo[g: F] = zeros

slope[h]   = exp(-8 (index(h) + 1) / H * log(2))
QKV[n h j] = X[n f] Wqkv[h j f] + bqkv[h j]                    # query_key_value
Q[n h d]   = QKV[n, h, d: 0..D]
K[m h d]   = QKV[m, h, d: D..2 * D]
V[m h e]   = QKV[m, h, e: 2 * D..3 * D]
A[h n m]   = softmax[m](Q[n h d] K[m h d] / sqrt(D) + slope[h] index(m))
Y[n g]     = A[h n m] V[m h e] WO[h e g] + bo[g]

output Y
