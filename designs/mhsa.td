# Multi-head self-attention, MHSA.
# Paper: Tuformer (Liu, Huang & Su, ICLR 2022), eq. 1a-1c; tensor form App. B, Fig. 3b / 9c.
# Spec: shared/specs/tuformer.md §2.1, §2.4, §5 (A1, A8, A16).
# Readings:
# - Softmax scale is 1/sqrt(D) (eq. 1b; spec A1), normalized over the key leg m (A8).
# - h is the head hyperedge: a batch leg inside the box, contracted at WO (App. C head-contraction).
# - No biases, masks or dropout: the paper's equations have none (A16).
# - Projections initialized normal(std = 1/sqrt(F)); the paper gives no initialization.
# family: attention
design mhsa

size F = 512, H = 8, D = F / H   # model width, heads, head width
size N                           # sequence length: bound by the input at run time

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

Q[n h d] = X[n f] WQ[f h d]                                    # eq. 1a
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m h d])  # eq. 1b
Y[n g]   = A[h n m] V[m h e] WO[h e g]                         # eq. 1b-1c

output Y
