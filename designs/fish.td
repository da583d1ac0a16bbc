# FiSH self-attention: Hard FiSH plus reparameterized Gaussian noise on the score maps.
# Paper: FiSHformer, eq. 9 (with eq. 6-7, Def. 1), inside the MHA of eq. 1-3; Remark 3.
# Spec: shared/specs/fishformer.md §3.0, §3.2, §3.4, §8.3, §6 (A1-A7, A18).
# Readings (besides those of hard_fish.td, which this extends):
# - Noise on the M GLOBAL matrices, then mixed: A_j = sum_k p_kj (G_k + sigma_k eps_k) (A7a: App.
#   D.1 counts noise on M global matrices, and the authors' code agrees); literal eq. 9 would put
#   eps_j on the local heads.
# - Noise mode train: zero in eval, so eval equals Hard FiSH with the same parameters (A7d); the
#   authors' code adds it also at eval (that would be mode = always).
# - sigma_k is the standard deviation, one learnable scalar per global head (A7b, A7c), init 0.1
#   (A7b); fresh i.i.d. noise per call, per batch element, per entry (A7e).
# - Eq. 9 is implemented as written: Gaussian noise on a weighted mean; no component is sampled (A6).
# Derived from hard_fish (adding the noise) rather than the reverse: replace cannot remove sigma.
# family: fish
design fish extends hard_fish

param sigma[k: M] = fill(0.1)
random eps[k: M, n: N, m: N] = normal(mode = train)
replace A[h n m] = softmax[m, scale = 1 / sqrt(D)](P[k h] * (Q[n k d] K[m k d] + sigma[k] eps[k n m]))   # eq. 9
