# Tunable-head self-attention, THSA: the Tuformer design space is THSA with a structured core C.
# Paper: Tuformer (Liu, Huang & Su, ICLR 2022), eq. 3a-3c; Fig. 4b; Sec. 3.2.
# Spec: shared/specs/tuformer.md §2.3, §2.4, §3.5, §5 (A1, A3, A7, A10, A16).
# Readings:
# - Softmax scale is 1/sqrt(R) (eq. 3b, spec A1) for every design of the THSA family.
# - C[r, s]: r is the value/output side, s the query/key side (the sum over s in eq. 3b; A7).
# - R = H * D (the THSA-vs-MHSA setting of Sec. 3.2); r is head-major, r = h*D + d (A3), which is
#   what the variants' reshapes C[(h d) (k e)] assume. Parameters 4FR + R^2 (A10: no fixed 125%).
# - No biases, masks or dropout (A16); the official code's C bias is inert (P9) and is left out.
# - C init: uniform(-1/sqrt(R), 1/sqrt(R)), the init of the official code's nn.Linear(R, R) c_proj
#   (the paper gives none). Projections normal(std = 1/sqrt(F)).
# - The exact MHSA initialization would be C = sqrt(H) (I_H kron J_D) (§3.2, P1); see skip_right.td.
# family: tuformer
design thsa

size F = 512, H = 8, D = F / H, R = H * D   # width, heads, head width, core rank
size N                                      # sequence length

input X[n: N, f: F]
param WQ[f: F, s: R] = normal(std = 1 / sqrt(F))
param WK[f: F, s: R] = normal(std = 1 / sqrt(F))
param WV[f: F, r: R] = normal(std = 1 / sqrt(F))
param WO[r: R, g: F] = normal(std = 1 / sqrt(F))
param C[r: R, s: R] = uniform(low = -1 / sqrt(R), high = 1 / sqrt(R))   # the core

Q[n s] = X[n f] WQ[f s]                                              # eq. 3a
K[m s] = X[m f] WK[f s]
V[m r] = X[m f] WV[f r]
A[r n m] = softmax[m, scale = 1 / sqrt(R)](C[r s] Q[n s] K[m s])     # eq. 3b: R score maps
Y[n g] = A[r n m] V[m r] WO[r g]                                     # eq. 3b-3c

output Y
