# Scaled cosine attention with a learned per-head temperature.
# Paper: Liu et al., "Swin Transformer V2" (2022), Sec. 3.2, eq. Sim(q_i, k_j) = cos(q_i, k_j) / τ + B_ij.
# Readings:
# - τ is learned per head as s = log(1 / τ) (the paper's code), clamped at τ >= 0.01, i.e.
#   1/τ = exp(clamp(s, −20, log(100))), initialized at τ = 0.1 (s = log 10).
# - The relative position bias B is left out; softmax over the keys as in MHSA.
# family: attention
design cosine_attention

size F = 512, H = 8, D = F / H
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
param s[h: H] = fill(log(10))

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
Qn[n h d] = Q[n h d] / sqrt(Q[n h c] Q[n h c])
Kn[m h d] = K[m h d] / sqrt(K[m h c] K[m h c])
A[h n m] = softmax[m, scale = exp(clamp(s[h], -20, log(100)))](Qn[n h d] Kn[m h d])
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
