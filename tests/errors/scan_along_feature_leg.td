# mistake: a cumulative sum along a feature leg (h has the fixed size H), not a position leg
design bad

size F = 64, H = 4, D = F / H
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, g: F]

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
G[n h] = X[n f] WQ[f h d] WK[f h d]
C[n h] = cumsum[h](G[n h])
A[h n m] = softmax[m](Q[n h d] K[m h d] + C[m h])
Y[n g] = A[h n m] V[m h e] WO[h e g]

output Y
