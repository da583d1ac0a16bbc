# DeepSeek's multi-head latent attention (MLA), as in DeepSeek-V2 and V3.
# Paper: DeepSeek-AI, "DeepSeek-V2: A Strong, Economical, and Efficient Mixture-of-Experts Language
# Model" (2024), Sec. 2.1.2-2.1.3, eq. (9)-(19): queries through a low-rank latent c^Q (eq. 12-13),
# keys and values through one shared latent c^KV (eq. 9-11), decoupled RoPE on a separate part of
# the queries (per head, eq. 14) and of the key (one shared by all heads, eq. 15), logits
# q_t,i · k_j,i over the concatenated parts (eq. 16-18), scale 1/√(d_h + d_h^R); DeepSeek-V3
# (2024), Sec. 2.1.1, the same with RMSNorm on both latents.
# Module: Hugging Face transformers' DeepseekV3Attention (models/deepseek_v3/modeling_deepseek_v3.py):
# q = q_b_proj(RMSNorm(q_a_proj(x))) split per head into (nope C, rope E); kv_a_proj_with_mqa(x)
# split into the latent (KL) and the shared rope key (E); RMSNorm on the latent; kv_b_proj split per
# head into (key nope C, value V); softmax(q·k · (C + E)^-0.5) v; o_proj.
# Readings:
# - Interleaved RoPE (HF's rope_interleave = True, the default, as DeepSeek's checkpoints store
#   it): rope dims (2p, 2p + 1) form pair p, rotated by θ_p = Theta^(−2p/E), positions from 0; HF
#   writes the rotated pairs half-major, the same scores (a permutation of both q and k).
# - RMSNorm eps 1e-6 with a learned weight (HF's rms_norm_eps default); HF computes it in float32.
# - q_lora_rank set (V2, V3); DeepSeek-V2-Lite's direct q_proj is not this design. No projection
#   biases (attention_bias = False), default RoPE (YaRN's mscale not modeled).
# - The key's nope part and the value are computed from the latent (HF's order); whether the
#   latent is absorbed into the queries is the planner's contraction order.
# family: production
design deepseek_mla

size F = 512, H = 8, QL = 96, KL = 64, C = 32, E = 16, V = 32, P = E / 2, Theta = 10000
size N

input X[n: N, f: F]
param Wqa[f: F, a: QL] = normal(std = 1 / sqrt(F))
param nqa[a: QL] = ones
param WqN[a: QL, h: H, c: C] = normal(std = 1 / sqrt(QL))
param WqR[a: QL, h: H, d: E] = normal(std = 1 / sqrt(QL))
param Wkva[f: F, l: KL] = normal(std = 1 / sqrt(F))
param WkR[f: F, d: E] = normal(std = 1 / sqrt(F))
param nkv[l: KL] = ones
param WkN[l: KL, h: H, c: C] = normal(std = 1 / sqrt(KL))
param WV[l: KL, h: H, e: V] = normal(std = 1 / sqrt(KL))
param WO[h: H, e: V, g: F] = normal(std = 1 / sqrt(H * V))
const Rot[s: 2, t: 2] = values(0, -1, 1, 0)

theta[p]      = exp(-2 index(p, P) / E * log(Theta))
Ang[n p]      = index(n) theta[p]
Qa[n a]       = X[n f] Wqa[f a]
Cq[n a]       = nqa[a] Qa[n a] (mean[a](Qa[n a] ^ 2) + 1e-6) ^ -0.5          # eq. 12, V3's RMSNorm
QN[n h c]     = Cq[n a] WqN[a h c]                                           # eq. 13
QR[n h d]     = Cq[n a] WqR[a h d]                                           # eq. 14 before RoPE
Ckv[m l]      = X[m f] Wkva[f l]                                             # eq. 9
Ckn[m l]      = nkv[l] Ckv[m l] (mean[l](Ckv[m l] ^ 2) + 1e-6) ^ -0.5
KN[m h c]     = Ckn[m l] WkN[l h c]                                          # eq. 10
Vh[m h e]     = Ckn[m l] WV[l h e]                                           # eq. 11
KR[m d]       = X[m f] WkR[f d]                                              # eq. 15 before RoPE
QRr[n h (p s)] = cos(Ang[n p]) QR[n h (p s)] + sin(Ang[n p]) Rot[s t] QR[n h (p t)]
KRr[m (p s)]   = cos(Ang[m p]) KR[m (p s)] + sin(Ang[m p]) Rot[s t] KR[m (p t)]
A[h n m]      = softmax[m, scale = 1 / sqrt(C + E)](QN[n h c] KN[m h c] + QRr[n h d] KRr[m d])   # eq. 16-18
Y[n g]        = A[h n m] Vh[m h e] WO[h e g]                                 # eq. 19

output Y
