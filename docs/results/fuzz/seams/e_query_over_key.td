design query_over_key
size F = 2, H = 1, D = 1, E = 1
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: E]
V[m h e] = X[m f] WV[f h e]
Y[n h e] = normalize[m, eps = 1e-6](exp(X[n f] WQ[f h d] X[m k] WK[k h d])) V[m h e] + V[n h e]
output Y
