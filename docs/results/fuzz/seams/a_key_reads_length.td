design key_reads_length
size F = 2, H = 1, D = 1, E = 1
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: E]
K[m h d] = X[m f] WK[f h d] (1 + index(m) / N)
Y[n h e] = softmax[m, mask = causal(n, m)](X[n f] WQ[f h d] K[m h d]) X[m j] WV[j h e]
output Y
