# mistake: a slice that reads no entries of its table
design absolute

size F = 64, L = 128
size N

input X[n: N, f: F]
param P[i: L, f: F] = zeros

Y[n f] = X[n f] P[k: L - L, f]

output Y
