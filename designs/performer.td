# Performer (FAVOR+): linear attention whose positive random features estimate the softmax kernel.
# Paper: Choromanski et al., "Rethinking Attention with Performers" (ICLR 2021), Lemma 1 (positive
# random features phi(x) = exp(-|x|^2 / 2) / sqrt(R) (exp(w_1 . x), ..., exp(w_R . x)), w_i ~ N(0, I_D)
# with E[phi(q) . phi(k)] = exp(q . k)), and eq. 5 (Att = D^-1 (Q' K'^T) V, D = diag(Q' K'^T 1)).
# Readings:
# - Queries and keys are scaled by D^(-1/4) each, so phi(q) . phi(k) estimates exp(q . k / sqrt(D)), the
#   softmax kernel of MHSA (Sec. 2.2).
# - R = D features per head, drawn once i.i.d. N(0, 1) and kept fixed (a buffer, saved, never
#   trained or redrawn); the paper's default orthogonal features and periodic redrawing are not used.
# - One feature draw shared by the heads; the box normalizes over the keys (eq. 5's D^-1), in
#   linear time; causal use (with_causal_mask) is the prefix-sum form of Sec. 2.4.
# family: attention
design performer

size F = 512, H = 8, D = F / H, R = D
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
buffer W[d: D, r: R] = normal(std = 1)

Q[n h d]  = X[n f] WQ[f h d] / D ^ 0.25
K[m h d]  = X[m f] WK[f h d] / D ^ 0.25
V[m h e]  = X[m f] WV[f h e]
Pq[n h r] = exp(Q[n h d] W[d r] - 0.5 Q[n h d] Q[n h d]) / sqrt(R)
Pk[m h r] = exp(K[m h d] W[d r] - 0.5 K[m h d] K[m h d]) / sqrt(R)
A[h n m]  = normalize[m](Pq[n h r] Pk[m h r])
Y[n g]    = A[h n m] V[m h e] WO[h e g]

output Y
