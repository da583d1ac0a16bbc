# Based: linear attention with a second-order Taylor feature map of exp.
# Paper: Arora et al., "Simple linear attention language models balance the recall-throughput
# tradeoff" (ICML 2024), Sec. 4: the Taylor feature map, the eq. φ(q)ᵀφ(k) = 1 + qᵀk + (qᵀk)²/2
# (a second-order approximation of exp(qᵀk)) on projections to a small feature dimension d′ = 16,
# in the linear attention y_i = φ(q_i)ᵀ Σ_j φ(k_j) v_jᵀ / (φ(q_i)ᵀ Σ_j φ(k_j) + ε) (equation
# numbers not cited: the equations are given by their content), causal as a decoder.
# Readings:
# - The official feature map (TaylorExp) concatenates [1, x / d′^(1/4), (x ⊗ x) / (√2 · √d′)],
#   so φ(q)·φ(k) = 1 + q·k / √d′ + (q·k)² / (2 d′): the content of the normalize box is that sum,
#   written as the three terms; the linear-time order takes each term's Σ_j separately (the
#   squared term through its d′² products), O(N), never the N × N scores.
# - ε = 1e-12 as the official code; one feature projection per head (Dk = d′ = 16), values at the
#   full head width D = F / H, an output projection W_O. No short convolution or sliding-window
#   layer (Based's other mixers). Causal as a decoder: `with_causal_mask()`.
# family: attention
design based

size F = 512, H = 8, D = F / H, Dk = 16
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: Dk] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: Dk] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = normalize[m, eps = 1e-12](1 + Q[n h d] K[m h d] / sqrt(Dk) + (Q[n h d] K[m h d]) ^ 2 / (2 * Dk))
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
