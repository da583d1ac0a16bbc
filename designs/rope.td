# Rotary position embedding (RoPE) on queries and keys.
# Paper: Su et al., "RoFormer: Enhanced Transformer with Rotary Position Embedding" (2021),
# Sec. 3.4.2, eq. (34): R_m x = x ⊙ cos(m θ) + (−x_2, x_1, −x_4, x_3, ...) ⊙ sin(m θ), with
# θ_i = 10000^(−2(i−1)/d) (eq. 15); the logits are (R_n W_q x_n)ᵀ (R_m W_k x_m) (eq. 16).
# Readings:
# - Interleaved pairs (RoFormer eq. 34, GPT-J): head dims (2p, 2p + 1) form pair p, so the head
#   leg d is viewed as (p s), pair-major, s in {0, 1}; θ_p = 10000^(−2p/D) for p = 0 .. D/2 − 1.
# - The rotation acts per position on each pair as the 2×2 block cos·I + sin·R with the constant
#   generator R = [[0, −1], [1, 0]] (R[s t], row-major), never as an N·D·D matrix.
# - Positions count from 0 at the first token of the input, at the run-time length N.
# - Queries and keys rotate, values do not; softmax scale 1/√D over the keys, as in MHSA.
# family: positions
design rope

size F = 512, H = 8, D = F / H, P = D / 2
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
const R[s: 2, t: 2] = values(0, -1, 1, 0)

theta[p]      = exp(-2 index(p, P) / D * log(10000))
Ang[n p]      = index(n) theta[p]
Q[n h d]      = X[n f] WQ[f h d]
K[m h d]      = X[m f] WK[f h d]
V[m h e]      = X[m f] WV[f h e]
Qr[n h (p s)] = cos(Ang[n p]) Q[n h (p s)] + sin(Ang[n p]) R[s t] Q[n h (p t)]
Kr[m h (p s)] = cos(Ang[m p]) K[m h (p s)] + sin(Ang[m p]) R[s t] K[m h (p t)]
A[h n m]      = softmax[m, scale = 1 / sqrt(D)](Qr[n h d] Kr[m h d])
Y[n g]        = A[h n m] V[m h e] WO[h e g]

output Y
