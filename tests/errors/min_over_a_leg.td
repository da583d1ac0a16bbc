# mistake: min is the elementwise bound min(x, c); there is no min reduction over a leg
design rope_frequencies

size F = 64, H = 4, D = F / H, P = D / 2
size N

input X[n: N, f: F]
param WO[p: P, g: F] = normal(std = 1)

theta[p] = exp(-2 index(p, P) / D * log(10000))
low[]    = min[p](theta[p])
Y[n g]   = index(n) theta[p] WO[p g] + X[n g] + low[]

output Y
