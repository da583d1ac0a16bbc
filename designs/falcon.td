# Falcon-7B's self-attention block: multi-query attention from one fused QKV projection, with RoPE.
# Paper: Almazrouei et al., "The Falcon Series of Open Language Models" (2023), its architecture
# section (multi-query attention, rotary embeddings), with Shazeer, "Fast Transformer Decoding: One
# Write-Head is All You Need" (2019), Sec. 3 (one key and one value head shared by all query
# heads) and the rotation of Su et al., RoFormer (2021), eq. (34), logits eq. (16).
# Module: Hugging Face transformers' FalconAttention (models/falcon/modeling_falcon.py) with
# multi_query = True, new_decoder_architecture = False, alibi = False (Falcon-7B): query_key_value(x)
# viewed as (H + 2, head_dim): H query heads, then one key head, then one value head; RoPE with
# rotate_half on q and k; softmax(q kᵀ / sqrt(head_dim)) v; dense.
# Readings:
# - The fused weight as the checkpoint stores it: query_key_value.weight [(H + 2)·D, F] is
#   Wqkv[f, j, d] transposed (j = 0 .. H − 1 the query heads, j = H the key, j = H + 1 the value);
#   the queries are its slice j: H, the key and the value its reads at j = H and j = H + 1.
# - dense.weight [F, H·D] is WO[h, e, g] transposed; no biases (bias = False, Falcon-7B's setting).
# - Rotate-half RoPE (HF's layout): the head leg viewed as (s p), half-major; θ_p = Theta^(−2p/D),
#   positions from 0; HF builds cos and sin in float32, here in the compute dtype.
# - Head width D = F / H; Falcon-7B is F = 4544, H = 71, D = 64.
# - Causal as a decoder: `with_causal_mask()` (HF's is_causal = True); no dropout (eval).
# family: production
design falcon

size F = 512, H = 8, D = F / H, J = H + 2, P = D / 2, Theta = 10000
size N

input X[n: N, f: F]
param Wqkv[f: F, j: J, d: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
const Rot[s: 2, t: 2] = values(0, -1, 1, 0)

theta[p]      = exp(-2 index(p, P) / D * log(Theta))
Ang[n p]      = index(n) theta[p]
Q[n h d]      = X[n f] Wqkv[f, h: H, d]
K[m d]        = X[m f] Wqkv[f, j = H, d]
V[m e]        = X[m f] Wqkv[f, j = H + 1, e]
Qr[n h (s p)] = cos(Ang[n p]) Q[n h (s p)] + sin(Ang[n p]) Rot[s t] Q[n h (t p)]
Kr[m (s p)]   = cos(Ang[m p]) K[m (s p)] + sin(Ang[m p]) Rot[s t] K[m (t p)]
A[h n m]      = softmax[m, scale = 1 / sqrt(D)](Qr[n h d] Kr[m d])
Y[n g]        = A[h n m] V[m e] WO[h e g]

output Y
