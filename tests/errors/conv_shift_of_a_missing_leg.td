# mistake: a shift of leg r, which the argument S[h n m] does not have
design bad

size F = 64, H = 4, D = F / H, C = 3
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, g: F]
param theta[h: H, i: C, j: C]
param w[h: H, i: C]

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
S[h n m] = Q[n h d] K[m h d]
A[h n m] = softmax[m](conv[r = r - i](S[h n m], w[h i]))
Y[n g] = A[h n m] V[m h e] WO[h e g]

output Y
