# cosFormer: linear attention with ReLU features and a cos re-weighting by position.
# Paper: Qin et al., "cosFormer: Rethinking Softmax in Attention" (ICLR 2022), Sec. 3.3-3.4:
# Q' = ReLU(Q), K' = ReLU(K) (eq. 6), s(Q'_i, K'_j) = Q'_i K'_jᵀ cos(π/2 · (i − j)/M) (eq. 9),
# decomposed by cos(a − b) = cos a cos b + sin a sin b into
# Q'_i K'_jᵀ cos(πi/2M) cos(πj/2M) + Q'_i K'_jᵀ sin(πi/2M) sin(πj/2M) (eq. 10), and
# O_i = Σ_j s(Q'_i, K'_j) V_j / Σ_j s(Q'_i, K'_j) (eq. 11), computed in linear time.
# Readings:
# - The content of the normalize box is the sum of eq. 10's two products, as written: the
#   linear-time order takes each term's Σ_j separately (Σ_j Q^cos_i K^cos_j V_j + Σ_j Q^sin_i
#   K^sin_j V_j over the sum of the two Σ_j), O(N), never the N × N scores.
# - Positions i = 1 .. N (the official code's arange(1, N + 1)) and M = N, the sequence length
#   (the official code's max(source length, target length) for self-attention).
# - ε = 1e-6 added to the denominator (the official code clamps it at 1e-6); multi-head, per
#   head width D = F / H, an output projection W_O.
# family: attention
design cosformer

size F = 512, H = 8, D = F / H
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

Q[n h d]  = relu(X[n f] WQ[f h d])
K[m h d]  = relu(X[m f] WK[f h d])
V[m h e]  = X[m f] WV[f h e]
W[n]      = 3.141592653589793 / 2 (index(n) + 1) / N                       # πi / 2M
A[h n m]  = normalize[m, eps = 1e-6](cos(W[n]) cos(W[m]) Q[n h d] K[m h d]
                                     + sin(W[n]) sin(W[m]) Q[n h d] K[m h d])
Y[n g]    = A[h n m] V[m h e] WO[h e g]

output Y
