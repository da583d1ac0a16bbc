# mistake: an output names a parameter, which no input reaches
design bad

size F = 8
size N

input X[n: N, f: F]
param W[f: F, g: F]

Y[n g] = X[n f] W[f g]

output Y, W
