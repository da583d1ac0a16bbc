design strict_as_written
size F = 2, H = 1, D = 1, E = 1
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: E]
Y[n h e] = clamp(index(n) - index(m), 0, 1) sigmoid(X[n f] WQ[f h d] X[m k] WK[k h d]) X[m j] WV[j h e]
output Y
