# mistake: a leg group inside a leg group; one axis splits into a flat list of legs
design rope_heads

size F = 64, H = 4, D = F / H, P = D / 2
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1)
param WO[h: H, d: D, g: F] = normal(std = 1)

Q[n (h d)]      = X[n f] WQ[f h d]
Qr[n h (s p)]   = Q[n (h (s p))]
Y[n g]          = Qr[n h d] WO[h d g]

output Y
