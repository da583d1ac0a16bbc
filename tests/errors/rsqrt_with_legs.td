# mistake: rsqrt is elementwise (x ^ -0.5); the mean over the normalized leg is written inside it
design qk_norm

size F = 64, H = 4, D = F / H
size N

input X[n: N, f: F]
param W[f: F, h: H, d: D] = normal(std = 1)

Q[n h d] = X[n f] W[f h d]
R[n h d] = Q[n h d] rsqrt[d](Q[n h d] ^ 2)
A[h n m] = softmax[m](R[n h d] R[m h d])
Y[n f]   = A[h n m] Q[m h d] W[f h d]

output Y
