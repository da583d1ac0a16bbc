# mistake: the base design was saved as Latin-1, not UTF-8
design latin1_base
size N, F = 8
input X[n: N, f: F]   # entrée
Y[n f] = X[n f]
output Y
