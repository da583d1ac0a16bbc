# Hard FiSH self-attention: H local pre-softmax score maps mixed from M global ones by a learned,
# input-independent M x H matrix P; zero noise.
# Paper: FiSHformer, eq. 10 (the zero-noise limit of eq. 9), inside the MHA of eq. 1-3; Remark 3.
# Spec: shared/specs/fishformer.md §3.0, §3.3, §3.4, §3.8, §8.2, §6 (A1-A5, A9, A16, A18).
# Readings:
# - Mixing acts on PRE-softmax scores G_k = Q_k K_k^T (A1); softmax(A_j / sqrt(D)) per local head,
#   scale 1/sqrt(D) with D the per-head width of global and local heads alike (A2, A3, A4).
# - Hard FiSH = zero noise, eq. 10; nothing discrete, no argmax (spec §3.8).
# - P is free (discriminative relaxation, Remark 3 and §4; A5), not softmax-normalized, not computed
#   from X. Init U(-1/sqrt(M), 1/sqrt(M)), PyTorch's nn.Linear(M, H) default used by the
#   authors' code (§3.4).
# - H local value heads, unshared; WO maps H*D -> F (A9). No biases.
# - A mask belongs on the softmax box, so it acts after the mixing (A18).
# - Leg k is the global head (size M), h the local head (size H): the key leg is m, so P's axes are
#   named [k, h] (P[m: M, h: H] would give leg m two sizes).
# family: fish
design hard_fish

size F = 512, H = 8, M = 2, D = F / H   # width, local heads, global heads, head width
size N                                  # sequence length

input X[n: N, f: F]
param WQ[f: F, k: M, d: D] = normal(std = 1 / sqrt(F))   # M global query heads
param WK[f: F, k: M, d: D] = normal(std = 1 / sqrt(F))   # M global key heads
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))   # H local value heads
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(F))
param P[k: M, h: H] = uniform(low = -1 / sqrt(M), high = 1 / sqrt(M))   # mixing p_kj

Q[n k d] = X[n f] WQ[f k d]
K[m k d] = X[m f] WK[f k d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = 1 / sqrt(D)](P[k h] Q[n k d] K[m k d])   # eq. 10, then eq. 1
Y[n g] = A[h n m] V[m h e] WO[h e g]                                   # eq. 1-3

output Y
