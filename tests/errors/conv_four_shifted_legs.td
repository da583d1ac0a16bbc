# mistake: a convolution along four position legs: one torch convolution shifts at most three
design bad

size F = 64, H = 4, D = F / H, C = 2
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, h: H, d: D]
param WV[f: F, h: H, e: D]
param WO[h: H, e: D, g: F]
param w[i: C, j: C, k: C, l: C]

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
P4[n m p q] = X[n f] X[m f] X[p f] X[q f]
C4[n m p q] = conv[n = n - i, m = m - j, p = p - k, q = q - l](P4[n m p q], w[i j k l])
A[h n m] = softmax[m](Q[n h d] K[m h d] + C4[n m p q])
Y[n g] = A[h n m] V[m h e] WO[h e g]

output Y
