# GFiSH self-attention: Hard GFiSH with reparameterized Gaussian noise on the global score maps,
# before the head-axis ReLU network.
# Paper: FiSHformer, the unnumbered GFiSH equation of §2.4 (eq. 12', the noisy eq. 12), §4.
# Spec: shared/specs/fishformer.md §3.6, §8.5, §6 (A7, A8).
# Readings (besides those of hard_gfish.td, which this extends):
# - GFiSH = R1 head-axis MLP (A8), noise inside phi, on the global matrices G_k before the first
#   layer, as in the authors' LM code (A7a, A8).
# - sigma: M standard deviations, init 0.1 (A7b, A7c); noise mode train, zero in eval (A7d).
# family: fish
design gfish extends hard_gfish

param sigma[k: M] = fill(0.1)
random eps[k: M, n: N, m: N] = normal(mode = train)
replace A[h n m] = softmax[m, scale = 1 / sqrt(D)](
    W2[i h] relu(P[k i] * (Q[n k d] K[m k d] + sigma[k] eps[k n m]) + b1[i]) + b2[h])   # eq. 12', R1
