# GPT-NeoX's self-attention block: fused query_key_value with bias, partial rotary, dense with bias.
# Paper: Black et al., "GPT-NeoX-20B: An Open-Source Autoregressive Language Model" (2022),
# Sec. 2.1.1 (rotary embeddings on the first 25% of each head's dims, rotary_pct), with the
# rotation of Su et al., RoFormer (2021), eq. (34) and its logits eq. (16), and the multi-head
# attention of Vaswani et al. (2017), eq. (1).
# Module: Hugging Face transformers' GPTNeoXAttention (models/gpt_neox/modeling_gpt_neox.py), as it
# computes: qkv = query_key_value(x) viewed (heads, 3·head_size) and chunked into q, k, v; the
# first rotary_ndims dims of q and k rotated by apply_rotary_pos_emb (rotate_half), the rest
# passed through; softmax(q kᵀ · head_size^−0.5) v; dense, with bias.
# Readings:
# - The fused weight as the checkpoint stores it: query_key_value.weight [3F, F] (out, in) is
#   Wqkv[h, j, f] (the same numbers: row h·3D + j), its bias [3F] is bqkv[h, j]; per head,
#   entries 0..D of j are the query, D..2D the key, 2D..3D the value (HF's view then chunk(3)).
#   One projection QKV = X Wqkv + b, as HF's one Linear; each part is read in its range of QKV
#   (views of one split), so the backward joins the parts' gradients once.
# - Partial rotary: R = rotary_ndims = D · rotary_pct, R = D / 2 here (rotary_pct = 0.5;
#   GPT-NeoX-20B and HF's default use 0.25: set R = D / 4). The query's range 0..R rotates,
#   R..D passes through; q·k = q_r·k_r + q_p·k_p, the two ranges of each side read separately
#   and the scores summed (one SDPA call on the concatenated sides).
# - Rotate-half (HF's rotate_half, not RoFormer's interleaved pairs): the rotated range viewed as
#   (s p), half-major; dims p and R/2 + p form pair p, rotated by n·θ_p with
#   θ_p = Base^(−2p/R) (GPTNeoXRotaryEmbedding at dim = rotary_ndims, rotary_emb_base = Base);
#   positions from 0 at the first token. HF builds cos and sin in float32; here they are
#   computed in the compute dtype.
# - dense.weight [F, F] (out, in) is WO[g, h, e] (column h·D + e), its bias bo[g]; scale
#   head_size^−0.5; no dropout (eval). Causal as a decoder: `with_causal_mask()` (HF's
#   is_causal = True). GPT-NeoX-20B is F = 6144, H = 64 (the defaults here are the library's
#   F = 512, H = 8); normal(std = 0.02) is its initializer_range.
# family: production
design gpt_neox

size F = 512, H = 8, D = F / H, R = D / 2, P = R / 2, Base = 10000
size N

input X[n: N, f: F]
param Wqkv[h: H, j: 3 * D, f: F] = normal(std = 0.02)
param bqkv[h: H, j: 3 * D] = zeros
param WO[g: F, h: H, e: D] = normal(std = 0.02)
param bo[g: F] = zeros
const Rot[s: 2, t: 2] = values(0, -1, 1, 0)

theta[p]      = exp(-2 index(p, P) / R * log(Base))
Ang[n p]      = index(n) theta[p]
QKV[n h j]    = X[n f] Wqkv[h j f] + bqkv[h j]                                # query_key_value
Qc[n h r]     = QKV[n, h, r: 0..R]
Kc[m h r]     = QKV[m, h, r: D..D + R]
Qr[n h (s p)] = cos(Ang[n p]) Qc[n h (s p)] + sin(Ang[n p]) Rot[s t] Qc[n h (t p)]
Kr[m h (s p)] = cos(Ang[m p]) Kc[m h (s p)] + sin(Ang[m p]) Rot[s t] Kc[m h (t p)]
A[h n m]      = softmax[m, scale = 1 / sqrt(D)](Qr[n h r] Kr[m h r] + QKV[n, h, c: R..D] QKV[m, h, c: D + R..2 * D])
Y[n g]        = A[h n m] QKV[m, h, e: 2 * D..3 * D] WO[g h e] + bo[g]

output Y
