# mistake: a fused weight read in a range that ends past its axis (the value part of [H, 3 D, F])
design neox_values

size F = 64, H = 4, D = F / H
size N

input X[n: N, f: F]
param Wqkv[h: H, j: 3 * D, f: F] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

Q[n h d] = X[n f] Wqkv[h, d: 0..D, f]
K[m h d] = X[m f] Wqkv[h, d: D..2 * D, f]
V[m h e] = X[m f] Wqkv[h, e: 2 * D..3 * D + 1, f]
A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m h d])
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
