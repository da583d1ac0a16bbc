# Transformer-MGK + Hard-E: each (query, key) pair uses its nearest key component; no prior
# (setting C, "+ Hard-E" rows of Table 4).
# Paper: MGK, eq. 12 (attention score) and eq. 10 (output); Remark 3; multi-head as eq. 3.
# Spec: shared/specs/mgk.md §1.4(C), §1.5(A), §6.4, §4 (A1, A2, A7, A8, A9), §5 P9, P10.
# Readings:
# - Hard-E = max over components r (eq. 12): softmax_m(max_r(-||q - k_r||^2) / (2 sqrt(D))); hard
#   over r only, soft over keys m, sigma^2 = sqrt(D) kept in the exponent (A8, A2).
# - No prior pi at all (Remark 3, A7): parameters = MGK's minus H*M.
# - Key-norm term kept via sqdist (A1); keys option A, H = 4 heads of width D = 64 (A9).
# Written out in full rather than `extends mgk`: replace cannot remove mgk's pi parameter.
# family: mgk
design mgk_harde

size F = 512, H = 4, M = 2, D = 64   # width, heads, keys per position, head width
size N                               # sequence length

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, r: M, d: D] = normal(std = 1 / sqrt(F))   # one key projection per component
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

Q[n h d] = X[n f] WQ[f h d]
K[m h r d] = X[m f] WK[f h r d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m](max[r](-sqdist[d](Q[n h d], K[m h r d])) / (2 * sqrt(D)))   # eq. 12
Y[n g] = A[h n m] V[m h e] WO[h e g]                                             # eq. 10, eq. 3

output Y
