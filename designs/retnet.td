# Multi-scale retention (RetNet).
# Paper: Sun et al., "Retentive Network: A Successor to Transformer for Large Language Models"
# (2023), Sec. 2.1-2.2: the parallel form eq. (5), Retention(X) = (Q Kᵀ ⊙ D) V with
# Q = (X W_Q) ⊙ Θ, K = (X W_K) ⊙ Θ̄, Θ_n = e^{inθ}, D_nm = γ^(n−m) for n ≥ m and 0 otherwise;
# the recurrent form eq. (6), S_n = γ S_{n−1} + K_nᵀ V_n, Retention(X_n) = Q_n S_n; and
# multi-scale retention eq. (8): γ = 1 − 2^(−5−arange(0, h)), one γ per head,
# Y = GroupNorm_h(Concat(head_1, ..., head_h)), MSR(X) = (swish(X W_G) ⊙ Y) W_O.
# Readings:
# - Θ (a complex rotation e^{inθ} of queries and the conjugate of keys) is written in real form
#   as RoPE's 2×2 rotation of interleaved pairs (rope.td), θ_p = 10000^(−2p/D): Q_n Θ_n (K_m Θ_m)*
#   rotates the query-key product by (n − m)θ, as RoPE does.
# - The decay γ^(n−m) is exp(log γ_h · (n − m)) beside causal(n, m): tdiag evaluates it in the
#   chunkwise form of eq. (7) (the planner's chunked prefix sums with a decay), never as N × N.
# - GroupNorm_h normalizes each head's output over its value leg e (mean 0, variance 1, eps 1e-5)
#   without an affine transform: a per-(h, e) scale is absorbed by W_O.
# - Value width E = 2D per head (the paper's configurations double the value dimension); no
#   1/√D scaling of the keys (the official code's, which GroupNorm cancels up to its eps).
# family: scans
design retnet

size F = 512, H = 8, D = F / H, E = 2 * D, P = D / 2
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: E] = normal(std = 1 / sqrt(F))
param WG[f: F, h: H, e: E] = normal(std = 1 / sqrt(F))
param WO[h: H, e: E, g: F] = normal(std = 1 / sqrt(H * E))
const R[s: 2, t: 2] = values(0, -1, 1, 0)

lg[h]         = log(1 - exp(-(5 + index(h)) * log(2)))                 # log γ_h, eq. (8)
theta[p]      = exp(-2 index(p, P) / D * log(10000))
Ang[n p]      = index(n) theta[p]
Q[n h d]      = X[n f] WQ[f h d]
K[m h d]      = X[m f] WK[f h d]
V[m h e]      = X[m f] WV[f h e]
Qr[n h (p s)] = cos(Ang[n p]) Q[n h (p s)] + sin(Ang[n p]) R[s t] Q[n h (p t)]
Kr[m h (p s)] = cos(Ang[m p]) K[m h (p s)] + sin(Ang[m p]) R[s t] K[m h (p t)]
O[n h e]      = causal(n, m) exp(lg[h] (index(n) - index(m))) Qr[n h d] Kr[m h d] V[m h e]   # eq. (5)
C[n h e]      = O[n h e] - mean[e](O[n h e])
Yn[n h e]     = C[n h e] (mean[e](C[n h e] ^ 2) + 1e-5) ^ -0.5                # GroupNorm per head
Y[n g]        = silu(X[n f] WG[f h e]) Yn[n h e] WO[h e g]                  # eq. (8)

output Y
