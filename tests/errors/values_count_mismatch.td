# mistake: three values for a 2 x 2 constant
design rope_bad

size F = 64, H = 4, D = F / H, P = D / 2
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
const R[s: 2, t: 2] = values(0, -1, 1)

Q[n h d] = X[n f] WQ[f h d]
Y[n h (p s)] = R[s t] Q[n h (p t)]

output Y
