design strict_causal
size F = 2, H = 1, D = 1, E = 1
size N
input X[n: N, f: F]
const I[n: N, m: N] = identity
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: E]
Y[n h e] = (causal(n, m) - I[n m]) X[n f] WQ[f h d] X[m k] WK[k h d] X[m j] WV[j h e]
output Y
