# mistake: N has no default and no input has an axis of size N, so nothing tells the module N
design bad

size F = 8
size N

input X[f: F]
mask P[m: N]

Y[f] = X[f]

output Y
