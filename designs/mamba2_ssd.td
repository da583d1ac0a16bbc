# Mamba-2's state space dual (SSD) layer: scalar decay per head, attention-like dual form.
# Paper: Dao & Gu, "Transformers are SSMs: Generalized Models and Efficient Algorithms Through
# Structured State Space Duality" (ICML 2024). The recurrence (Sec. 3, eq. 2 with a scalar
# A_t = a_t I): h_t = a_t h_{t−1} + B_t x_tᵀ, y_t = C_tᵀ h_t; its dual (Sec. 5, eq. 16, "1-SS"
# masked attention) y = (L ∘ C Bᵀ) x with the 1-semiseparable mask
# L[t, s] = a_{s+1} ⋯ a_t = exp(Σ_{k=s+1..t} log a_k) for s ≤ t, 0 otherwise; Mamba-2's
# parametrisation (Sec. 7): a_t = exp(Δ_t A_h), Δ_t = softplus(x_t W_Δ + b_Δ) per head, A_h < 0,
# the input scaled by Δ (x̄_t = Δ_t x_t), and a skip D_h x_t.
# Readings:
# - The SSD layer's core only: no depthwise convolution, no gate z, no output norm (the block
#   around the layer is a separate design choice); one group: B and C shared by every head.
# - log a_t = Δ_t A_h with A_h = −exp(A_log[h]); L = exp(segsum(log a)), the segment sums
#   Σ_{k=s+1..t} log a_k (−∞ for s > t), as the paper's reference code writes it: tdiag evaluates
#   it in chunks (the SSD algorithm's block decomposition, Sec. 6: diagonal blocks as masked
#   attention, off-diagonal blocks through the chunk states carried with their decay).
# - Heads: H of P channels each (x is projected to H·P), state size S.
# family: scans
design mamba2_ssd

size F = 512, H = 8, P = F / H, S = 64
size N

input X[n: N, f: F]
param Wx[f: F, h: H, p: P] = normal(std = 1 / sqrt(F))
param WB[f: F, s: S] = normal(std = 1 / sqrt(F))
param WC[f: F, s: S] = normal(std = 1 / sqrt(F))
param Wdt[f: F, h: H] = normal(std = 1 / sqrt(F))
param bdt[h: H] = uniform(low = -4.6, high = -2.3)      # softplus(b) ≈ Δ in [0.01, 0.1]
param Alog[h: H] = uniform(low = 0, high = 2.7)          # A = −exp(A_log) in [−16, −1]
param Dskip[h: H] = ones
param WO[h: H, p: P, g: F] = normal(std = 1 / sqrt(F))

dt[n h]   = softplus(X[n f] Wdt[f h] + bdt[h])           # Δ
La[n h]   = -dt[n h] exp(Alog[h])                        # log a_n = Δ_n A_h
Xs[m h p] = X[m f] Wx[f h p]
Bm[m s]   = X[m f] WB[f s]
Cm[n s]   = X[n f] WC[f s]
O[n h p]  = exp(segsum[n, m](La[n h])) Cm[n s] Bm[m s] dt[m h] Xs[m h p] + Dskip[h] Xs[n h p]   # eq. 16
Y[n g]    = O[n h p] WO[h p g]

output Y
