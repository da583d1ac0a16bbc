# mistake: a sink is a logit of a softmax's denominator; a normalize box has no exp
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
param s[h: H]
A[h n m] = normalize[m, sink = s[h]](relu(Q[n h d] K[m h d]))
Y[n g] = A[h n m] V[m h e] WO[h e g]

output Y
