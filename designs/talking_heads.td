# Talking-heads attention.
# Paper: Shazeer et al., "Talking-Heads Attention" (2020), Sec. 4, eq. (TalkingHeadsAttention):
# J = Q Kᵀ per head, J' = J P_l (mix the logits across heads), W = softmax(J'), W' = W P_w (mix the
# weights across heads), O = W' V.
# Readings:
# - Key heads h, softmax heads k and value heads l all number H (the paper allows different counts).
# - The 1/√D scale is on the logits before the mix (the paper scales Q); P_l, P_w start at the identity,
#   so the design starts as MHSA.
# family: attention
design talking_heads

size F = 512, H = 8, D = F / H
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, l: H, e: D] = normal(std = 1 / sqrt(F))
param WO[l: H, e: D, g: F] = normal(std = 1 / sqrt(F))
param PL[h: H, k: H] = identity
param PW[k: H, l: H] = identity

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m l e] = X[m f] WV[f l e]
A[k n m] = softmax[m, scale = 1 / sqrt(D)](PL[h k] Q[n h d] K[m h d])
Y[n g]   = PW[k l] A[k n m] V[m l e] WO[l e g]

output Y
