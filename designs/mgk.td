# Transformer-MGK self-attention: each key is a mixture of M Gaussian keys; soft E-step with a
# learned prior pi (setting A, key option A: one key projection per component).
# Paper: MGK (Nguyen et al.), eq. 9 (attention score) and eq. 10 (output), multi-head as eq. 3;
# Sec. 2.3 (sigma fixed), App. B (shapes, heads halved).
# Spec: shared/specs/mgk.md §1.3, §1.4(A), §1.5(A), §1.8, §1.9, §6.1, §4 (A1-A4, A9, A10, A14, A18).
# Readings:
# - MGK sigma^2 = sqrt(D) fixed, shared by all (j, r) (A2, A3): logits -||q - k||^2 / (2 sqrt(D)).
# - Full squared distance via sqdist: the query-norm term cancels in the normalization, the
#   key-norm term stays (A1); no Gaussian normalizing constant (kernel, not density).
# - Joint normalization over (m, r) with log pi added (eq. 9 = P1's merged form); r is summed
#   against the values in the next statement (eq. 10). Log-space for stability (A18).
# - pi: per head, shared over key positions (A10), learned by SGD, init 1/M (App. A.1.1: 0.5 at
#   M = 2); no explicit normalization (eq. 9 is invariant to pi -> c pi, P5), clamped to
#   [1e-6, 1] at forward time as the authors' code clamps to [0, 1], floored so log pi is finite (A4).
# - Heads halved: H = 4 heads of width D = 64 kept fixed (A9); WO maps H*D -> F. No biases (A14).
# - Key position leg m; a causal or padding mask on the box applies to all r of key m (A15).
# family: mgk
design mgk

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
A[h n m r] = softmax[m r](log(clamp(pi[h r], 1e-6, 1))
                          - sqdist[d](Q[n h d], K[m h r d]) / (2 * sqrt(D)))   # eq. 9, before sum_r
Y[n g] = sum[r](A[h n m r] V[m h e] WO[h e g])                 # eq. 10 (sum over r and m), eq. 3

output Y
