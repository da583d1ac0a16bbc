# Multi-Token Attention: attention logits convolved over neighbouring queries and keys, heads mixed in groups.
# Paper: Golovneva, Wang, Weston & Sukhbaatar, "Multi-Token Attention" (arXiv 2504.00927, 2025), §3.1
# (key-query convolution), §3.2 (head mixing convolution), §3.3 (group normalization with depth scaling);
# the authors' code: facebookresearch/RAM, projects/mta/mta_transformer.py (Attention._mta_convolution,
# _head_convolution, subln).
# eq. (§3.1, the key-query convolution, pre-softmax): A = Softmax(Mask_-inf(Conv2d_θ(Mask_0(Â)))), Â = Q Kᵀ / √d, per head:
#   Conv2d_θ(Â)[i, j] = Σ_{i'=0}^{c_q-1} Σ_{j'=-P}^{P} θ[i', j'] Â[i - i', j - j'], Â read as 0 outside
# eq. (§3.2, head mixing, post-softmax): A'[(g c)] = Σ_k w[g, k, c] A[(g k)], groups of c_h consecutive heads
# eq. (§3.3, group norm): each head's output RMS-normalized over its width (ε = 1e-5) with a gain over the width
#   shared by the heads, times (1 − λ_init), λ_init = 0.8 − 0.6 exp(−0.3 l) (depth scaling, l the layer from 0)
# Readings:
# - The key offsets as quoted from the paper, j' = ⌈−c_k/2⌉+1 .. ⌊c_k/2⌋, hold c_k values only for an
#   even c_k; for an odd c_k (11 here) we take j' = −P .. P, P = (c_k − 1) / 2, the keys
#   padded by P on both sides as the authors' code does (pad_key = "both"); c_k must be odd. Queries look back only:
#   i' = 0 .. c_q − 1 (the code pads the queries by c_q − 1 before the first).
# - θ[h i j] is θ_h[i', j'] at i = i', j = j' + P: the i-th earlier query, the key j − P after it, so
#   `conv[n = n - i, m = m - j + (CK - 1) / 2]` is the paper's sum as written (a convolution, the kernel not flipped;
#   the authors' conv2d weight is θ reversed along both axes).
# - Mask_0 and Mask_-inf are the causal masks: this design is the plain (bidirectional) one, and
#   with_causal_mask (tdiag ... --causal) adds both, mask = causal(n, m) on the convolution (the
#   future keys of each query zeroed before the shift; the query offsets look back, so no row reads a
#   later query) and on the softmax box. The indicator 1_{i ≥ j − j'} of the paper's per-entry sum is
#   read as that Mask_0 (the conv of the zero-masked logits), as the masked formula above and the
#   authors' code (scores[mask == -inf] = 0 before the conv) compute it.
# - Head mixing follows the softmax (the code's head_kernel, applied to the probabilities):
#   w[g k c] mixes the c_h heads of group g; the gain of the group norm is gn[e], one per head width
#   dimension (the code's RMSNorm(head_dim)); L = l + 1 is the layer counted from 1 (the code's layer_id = l).
# - θ is drawn normal(0, 0.3) (the code's `normal` option; its default, identity, makes MTA plain
#   attention at step 0); w is drawn normal(0, 1/√c_h) (the code starts it from the identity).
# family: attention
design multi_token_attention

size F = 512, H = 8, D = F / H, CQ = 6, CK = 11, CH = 2, G = H / CH, L = 1
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, o: F] = normal(std = 1 / sqrt(F))
param theta[h: H, i: CQ, j: CK] = normal(std = 0.3)
param w[g: G, k: CH, c: CH] = normal(std = 1 / sqrt(CH))
param gn[e: D] = ones

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
S[h n m] = Q[n h d] K[m h d] / sqrt(D)                                        # Â
A[h n m] = softmax[m](conv[n = n - i, m = m - j + (CK - 1) / 2](S[h n m], theta[h i j]))   # key-query convolution
M[(g c) n m] = w[g k c] A[(g k) n m]                                           # head mixing
O[n h e] = M[h n m] V[m h e]
Y[n o] = (1 - (0.8 - 0.6 * exp(-0.3 * (L - 1)))) O[n h e] (mean[e](O[n h e] ^ 2) + 1e-5) ^ -0.5 gn[e] WO[h e o]

output Y
