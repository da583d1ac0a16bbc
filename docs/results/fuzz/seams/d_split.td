design split
size F = 2, C = 2
size N
input X[n: N, f: F]
const one[i: C] = ones
Y[b i f] = X[(b i) f] one[i]
output Y
