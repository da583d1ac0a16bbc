# Cross-attention (encoder-decoder attention) with key-side padding.
# Paper: Vaswani et al., "Attention Is All You Need" (2017), Sec. 3.2.3 ("queries come from the
# previous decoder layer, and the memory keys and values come from the output of the encoder")
# with multi-head attention eq. (1) and Sec. 3.2.2.
# Readings:
# - Two inputs: the queries' sequence X[n f] (length N) and the memory Z[m f] (length M), both of
#   width F; H heads of width D = F / H, softmax scale 1/√D over the memory positions.
# - pad[m] marks the memory positions that exist (True = attend); padded keys get no weight.
# - No causal mask: the memory is a different sequence from the queries.
# family: attention
design cross_attention

size F = 512, H = 8, D = F / H
size N, M

input X[n: N, f: F]
input Z[m: M, f: F]
mask pad[m: M]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = Z[m f] WK[f h d]
V[m h e] = Z[m f] WV[f h e]
A[h n m] = softmax[m, scale = 1 / sqrt(D), mask = pad[m]](Q[n h d] K[m h d])
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
