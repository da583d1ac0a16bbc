# mistake: a learned bias over the run-time sequence length N, which has no size when the module is built
design bad

size F = 8
size N

input X[n: N, f: F]
param Bias[n: N, m: N] = zeros

Y[n f] = softmax[m](X[n g] X[m g] + Bias[n m]) X[m f]

output Y
