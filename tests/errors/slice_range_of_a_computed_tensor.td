# mistake: a computed tensor read in a range of a run-time axis (its length is the input's)
design computed_range

size F = 64, H = 4, D = F / H
size N

input X[n: N, f: F]
param Wqkv[h: H, j: 3 * D, f: F] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

QKV[n h j] = X[n f] Wqkv[h j f]
A[h n m]   = softmax[m, scale = 1 / sqrt(D)](QKV[n, h, d: 0..D] QKV[m, h, d: D..2 * D])
Y[l g]     = A[h l m] QKV[m: 1..N, h, e: 2 * D..3 * D] WO[h e g]

output Y
