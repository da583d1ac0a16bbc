design layer_norm_step
size F = 2, H = 1, D = 1, E = 2
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: E]
O[n h e] = softmax[m, mask = causal(n, m)](X[n f] WQ[f h d] X[m k] WK[k h d]) X[m j] WV[j h e]
C[n h e] = O[n h e] - mean[e](O[n h e])
Y[n h e] = C[n h e] (mean[e](C[n h e] ^ 2) + 1e-5) ^ -0.5
output Y
