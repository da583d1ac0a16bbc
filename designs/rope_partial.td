# Partial rotary embedding: RoPE on the first Dr dims of each head, the rest passed through.
# Paper: Black et al., "GPT-NeoX-20B: An Open-Source Autoregressive Language Model" (2022),
# Sec. 2.1.1 (rotary_pct), with the rotation of Su et al., RoFormer (2021), Sec. 3.4.2,
# eq. (34) and the logits of eq. (16).
# Readings:
# - A head of width D = Dr + Dp: its first Dr dims rotate, the last Dp do not; Dr = D / 2 here
#   (rotary_pct = 0.5; GPT-NeoX-20B uses 0.25: set Dr = D / 4).
# - Separate projections WQr[f h d] (the first Dr columns of each head of one W_q) and WQp[f h c]
#   (the last Dp): q = (q_r, q_p) and q·k = q_r·k_r + q_p·k_p, so rotating the first Dr dims of
#   one projection is exactly Σ_d Rot(Qr)[d] Rot(Kr)[d] + Σ_c Qp[c] Kp[c]; the parameters are the
#   same numbers split by columns.
# - Interleaved pairs within the rotary dims (RoFormer eq. 34, GPT-J); θ_p = 10000^(−2p/Dr).
# - Values keep the full head width D; softmax scale 1/√D.
# family: positions
design rope_partial

size F = 512, H = 8, D = F / H, Dr = D / 2, Dp = D - Dr, P = Dr / 2
size N

input X[n: N, f: F]
param WQr[f: F, h: H, d: Dr] = normal(std = 1 / sqrt(F))
param WKr[f: F, h: H, d: Dr] = normal(std = 1 / sqrt(F))
param WQp[f: F, h: H, c: Dp] = normal(std = 1 / sqrt(F))
param WKp[f: F, h: H, c: Dp] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
const R[s: 2, t: 2] = values(0, -1, 1, 0)

theta[p]      = exp(-2 index(p, P) / Dr * log(10000))
Ang[n p]      = index(n) theta[p]
Q[n h d]      = X[n f] WQr[f h d]
K[m h d]      = X[m f] WKr[f h d]
Qr[n h (p s)] = cos(Ang[n p]) Q[n h (p s)] + sin(Ang[n p]) R[s t] Q[n h (p t)]
Kr[m h (p s)] = cos(Ang[m p]) K[m h (p s)] + sin(Ang[m p]) R[s t] K[m h (p t)]
V[m h e]      = X[m f] WV[f h e]
A[h n m]      = softmax[m, scale = 1 / sqrt(D)](Qr[n h d] Kr[m h d] + X[n f] WQp[f h c] X[m f2] WKp[f2 h c])
Y[n g]        = A[h n m] V[m h e] WO[h e g]

output Y
