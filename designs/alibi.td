# Attention with linear biases (ALiBi).
# Paper: Press, Smith and Lewis, "Train Short, Test Long: Attention with Linear Biases Enables
# Input Length Extrapolation" (ICLR 2022), Sec. 3, eq. softmax(q_i Kᵀ + m · [−(i−1), ..., −2, −1, 0]):
# a per-head slope m times the query-key distance is added to the logits; no position embedding.
# Readings:
# - Head slopes 2^(−8h/H) for h = 1 .. H (the geometric sequence of Sec. 3, 1/2 .. 1/256 at H = 8).
# - Logits Q Kᵀ/√D (as in MHSA), then the bias −slope_h·|n − m|: under the causal mask (the paper's
#   language model, `with_causal_mask()`) that is −slope_h·(n − m) exactly; without it the same
#   penalty applies to keys after the query (the usual bidirectional reading).
# - Positions are computed in the forward at the run-time length, never stored.
# family: positions
design alibi

size F = 512, H = 8, D = F / H
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

slope[h] = exp(-8 (index(h) + 1) / H * log(2))
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m](Q[n h d] K[m h d] / sqrt(D) - slope[h] abs(index(n) - index(m)))
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
