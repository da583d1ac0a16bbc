# mistake: a box scale juxtaposed with a call before a quotient (inside [...] a space separates items)
design mhsa

size F = 512, H = 8, D = F / H   # model width, heads, head width
size N                           # sequence length

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
param s[h: H] = ones

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = s[h] log(N) / sqrt(D)](Q[n h d] K[m h d])
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
