# mistake: a number raised to a tensor exponent is exp(exponent · log(base)): the base must be positive
design rope_frequencies

size F = 64, H = 4, D = F / H, P = D / 2
size N

input X[n: N, f: F]
param WO[p: P, g: F] = normal(std = 1)

theta[p] = (-10000) ^ (-2 index(p, P) / D)
Y[n g]   = index(n) theta[p] WO[p g] + X[n g]

output Y
