# The mLSTM cell of xLSTM: a matrix memory with exponential input and sigmoid forget gates.
# Paper: Beck et al., "xLSTM: Extended Long Short-Term Memory" (NeurIPS 2024), Sec. 2.3, the
# mLSTM recurrence (the block of eq. numbered there; the numbers are not checked against the
# paper's text, which is not among ../shared/papers): C_t = f_t C_{t−1} + i_t v_t k_tᵀ, n_t = f_t n_{t−1} + i_t k_t,
# h̃_t = C_t q_t / max{|n_tᵀ q_t|, 1}, h_t = o_t ⊙ h̃_t, with q_t = W_q x_t,
# k_t = W_k x_t / √d, v_t = W_v x_t, i_t = exp(ĩ_t), f_t = σ(f̃_t), o_t = σ(W_o x_t); and its
# parallel form (App. A.3): h̃ = (D ⊙ Q Kᵀ/√d) V / max{|(D ⊙ Q Kᵀ/√d) 1|, 1} with
# D_ts = Π_{k=s+1..t} f_k · i_s for s ≤ t, 0 otherwise.
# Readings:
# - One mLSTM cell per head (H heads of width D), its output gate per (head, feature), the heads
#   projected back by W_O; the block around the cell (up-projection, convolution, skip, norm) is
#   left out.
# - log D_ts = segsum(log f)[t, s] + ĩ_s, log σ(f̃) = −softplus(−f̃): a decay with a key term,
#   taken in chunks for the numerator and the denominator alike.
# - The stabilizer m_t of the paper's numerics (App. A.2) is not written: it scales C_t and n_t
#   by e^{−m_t} and the bound 1 by the same, so h̃ is the same function; the planner applies it
#   to any such quotient of causal products sharing a decay (docs/language.md), so exp(ĩ) does
#   not overflow (as written, float32 does for ĩ above 88).
# - max{|x|, 1} is max(abs(x), 1): a bound from below only.
# family: scans
design mlstm

size F = 512, H = 4, D = F / H
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param Wi[f: F, h: H] = normal(std = 1 / sqrt(F))
param bi[h: H] = fill(-2)
param Wf[f: F, h: H] = normal(std = 1 / sqrt(F))
param bf[h: H] = fill(3)
param Wo[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

Li[n h]   = X[n f] Wi[f h] + bi[h]                                   # ĩ = log i
Lf[n h]   = -softplus(-(X[n f] Wf[f h] + bf[h]))                      # log f = log σ(f̃)
Q[n h d]  = X[n f] WQ[f h d]
K[m h d]  = X[m f] WK[f h d] / sqrt(D)
V[m h e]  = X[m f] WV[f h e]
Num[n h e] = exp(segsum[n, m](Lf[n h]) + Li[m h]) Q[n h d] K[m h d] V[m h e]   # C_t q_t
Den[n h]   = exp(segsum[n, m](Lf[n h]) + Li[m h]) Q[n h d] K[m h d]            # n_tᵀ q_t
Hc[n h e]  = Num[n h e] / max(abs(Den[n h]), 1)
Y[n g]     = sigmoid(X[n f] Wo[f h e]) Hc[n h e] WO[h e g]

output Y
