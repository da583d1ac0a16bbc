design decay_statement
size F = 2, H = 1, D = 1, E = 1
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: E]
param t[h: H]
Dec[h n m] = causal(n, m) exp(-softplus(t[h]) (index(n) - index(m)))
Y[n h e] = Dec[h n m] X[n f] WQ[f h d] X[m k] WK[k h d] X[m j] WV[j h e]
output Y
