# Forgetting Transformer (FoX): softmax attention with a forget gate.
# Paper: Lin, Nikishin, He, Courville, "Forgetting Transformer: Softmax Attention with a Forget
# Gate" (ICLR 2025; arXiv:2503.02130), the equations of its Forgetting Attention section (eq.
# numbers not checked against the PDF here): a scalar forget gate per head and time step
# f_t = σ(w_fᵀ x_t + b_f),
# o_i = Σ_{j ≤ i} F_ij exp(q_iᵀ k_j) v_j / Σ_{j ≤ i} F_ij exp(q_iᵀ k_j) with
# F_ij = Π_{l=j+1..i} f_l, i.e. O = softmax(Q Kᵀ + D) V with D_ij = Σ_{l=j+1..i} log f_l
# (−∞ above the diagonal: causal).
# Readings:
# - The scores are scaled by 1/√D as in the softmax attention FoX modifies (the paper's Q Kᵀ
#   leaves the scale implicit); H heads of width D = F / H, each with its own gate (w_f, b_f).
# - D_ij is computed in O(N) as c_i − c_j with c = cumsum(log f) (D = c 1ᵀ − 1 cᵀ), not as
#   an N×N sum; log f = log σ(z) = −softplus(−z), finite for any z.
#   In the box c_i is constant along the keys and drops out; −c_j is a key bias.
# - The SDPA form's key-bias column −c_j·√D grows with the position (|c| is a running sum): in
#   bfloat16 it was 22% off float64 at N = 512, so tdiag runs an SDPA with a key bias in float32
#   under autocast (0.5%, as MHSA). Writing the bias as segsum[n, m](G[n h]) keeps it relative
#   to its query instead, at the cost of an (h, n, m) bias.
# - pad[m] marks the keys that exist (True = attend); the gates of padded positions still decay
#   the later ones, as the recurrence runs over every position.
# family: scans
design forgetting_attention

size F = 512, H = 8, D = F / H
size N

input X[n: N, f: F]
mask pad[m: N]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
param Wf[f: F, h: H] = normal(std = 1 / sqrt(F))
param bf[h: H] = zeros

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
G[n h]   = -softplus(-(X[n f] Wf[f h] + bf[h]))          # log f_n
C[n h]   = cumsum[n](G[n h])                              # c_n = Σ_{l ≤ n} log f_l
A[h n m] = softmax[m, mask = causal(n, m), mask = pad[m]](Q[n h d] K[m h d] / sqrt(D) + C[n h] - C[m h])
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
