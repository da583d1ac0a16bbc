# mistake: a real constant declared as a size (StarCoder2-3B's rope_theta is 999999.4420358813)
design rope_base

size F = 64, H = 4, D = F / H, P = D / 2, Theta = 999999.4420358813
size N

input X[n: N, f: F]
param WO[p: P, g: F] = normal(std = 1)

theta[p] = exp(-2 index(p, P) / D * log(Theta))
Y[n g]   = index(n) theta[p] WO[p g] + X[n g]

output Y
