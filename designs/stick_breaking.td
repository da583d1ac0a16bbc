# Stick-breaking attention.
# Paper: Tan, Yang, Courville, Panda, Shen, "Scaling Stick-Breaking Attention: An Efficient
# Implementation and In-depth Study" (ICLR 2025; arXiv:2410.17980), the stick-breaking eq. and
# its log-space form (eq. numbers not checked against the PDF here): for query j and each earlier
# key i, β_ij = σ(q_jᵀ k_i / √d) is the share of the stick left over by the keys between them,
# A_ij = β_ij Π_{i<k<j} (1 − β_kj), o_j = Σ_{i<j} A_ij v_i; in log space,
# log A_ij = log σ(z_ij) + Σ_{k=i+1..j−1} log σ(−z_kj).
# Readings:
# - Strictly earlier keys only (i < j, the paper's convention: the diagonal is excluded), so the
#   first query's output is 0; the weights are not normalized (the stick left over is dropped).
# - Written with query n and key m: B[n m] = clamp(n − m, 0, 1) is 1 exactly where m < n; the
#   log-remainders log σ(−z) = −softplus(z) of the keys before the query are summed over
#   k = m+1..n−1 by a reverse exclusive cumsum along the key leg, O(H·N²) in all, not O(N³).
# - H heads of width D = F / H, concatenated and projected by WO as in MHSA.
# family: scans
design stick_breaking

size F = 512, H = 8, D = F / H
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
Z[h n m] = Q[n h d] K[m h d] / sqrt(D)
B[n m]   = clamp(index(n) - index(m), 0, 1)                   # 1 where key m is before query n
L[h n m] = -softplus(Z[h n m]) B[n m]                         # log(1 − β), keys before the query
R[h n m] = cumsum[m, exclusive = 1, reverse = 1](L[h n m])    # Σ_{k=m+1..n−1} log(1 − β_k)
A[h n m] = exp(R[h n m] - softplus(-Z[h n m])) B[n m]         # β_m Π (1 − β_k)
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
