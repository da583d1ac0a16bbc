# mistake: max(a, b) bounds a tensor by a number or size; the elementwise maximum of two tensors is not a map
design rope_frequencies

size F = 64, H = 4, D = F / H, P = D / 2
size N

input X[n: N, f: F]
param WO[p: P, g: F] = normal(std = 1)
param lower[p: P] = zeros

theta[p] = max(exp(-2 index(p, P) / D * log(10000)), lower[p])
Y[n g]   = index(n) theta[p] WO[p g] + X[n g]

output Y
