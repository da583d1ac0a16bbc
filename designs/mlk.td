# Transformer-MLK: a mixture of linear keys. Katharopoulos linear attention whose key feature is
# the prior-weighted mixture of the M key features, mixed after the feature map.
# Paper: MGK, eq. 13 (Sec. 2.4), multi-head as eq. 3.
# Spec: shared/specs/mgk.md §1.6, §1.8, §6.6, §4 (A4, A9, A10, A11), §5 P12, P13, P14.
# Readings:
# - phi = elu + 1 (Katharopoulos, the stated base; A11); mixing AFTER phi as eq. 13:
#   Kbar_j = sum_r pi_jr phi(k_jr), then normalize_m(phi(q) . Kbar) (P12: exact collapse; the
#   code's mixing before phi is not used). No sigma, no temperature.
# - pi per head, shared over key positions, learned, init 1/M (App. A.1.1; A10, §1.8), clamped to [0, 1] at
#   forward time as for MGK (A4), so the kernel stays nonnegative (P14).
# - eps = 1e-6 in the denominator (the linear transformer's eps).
# - Keys option A; H = 4 heads of width D = 64 (A9); WO maps H*D -> F. Non-causal as eq. 13.
# family: mgk
design mlk

size F = 512, H = 4, M = 2, D = 64   # width, heads, keys per position, head width
size N                               # sequence length

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, r: M, d: D] = normal(std = 1 / sqrt(F))   # one key projection per component
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
param pi[h: H, r: M] = fill(1 / M)                             # prior pi_jr, shared over j

Q[n h d] = X[n f] WQ[f h d]
K[m h r d] = X[m f] WK[f h r d]                                # k_jr
V[m h e] = X[m f] WV[f h e]
Kbar[m h d] = clamp(pi[h r], 0, 1) elu1(K[m h r d])            # eq. 13: sum_r pi_jr phi(k_jr)
A[h n m] = normalize[m, eps = 1e-6](elu1(Q[n h d]) Kbar[m h d])   # eq. 13
Y[n g] = A[h n m] V[m h e] WO[h e g]                           # eq. 13, eq. 3

output Y
