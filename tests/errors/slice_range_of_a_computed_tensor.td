# mistake: a range of a computed tensor (only stored tables are read in ranges)
design computed_range

size F = 64, H = 4, D = F / H
size N

input X[n: N, f: F]
param Wqkv[h: H, j: 3 * D, f: F] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

QKV[n h j] = X[n f] Wqkv[h j f]
A[h n m]   = softmax[m, scale = 1 / sqrt(D)](QKV[n, h, d: 0..D] QKV[m, h, d: D..2 * D])
Y[n g]     = A[h n m] QKV[m, h, e: 2 * D..3 * D] WO[h e g]

output Y
