# MiSH self-attention: a mixture (not admixture) of shared heads; one weight vector p for all local
# heads, which then differ only by their own noise and their own values.
# Paper: FiSHformer, Remark 4, eq. 11, inside the MHA of eq. 1-3; §5.4 (Table 9).
# Spec: shared/specs/fishformer.md §3.5, §8.4, §6 (A5, A7, A14).
# Readings (besides those of fish.td / hard_fish.td):
# - MiSH = FiSH with P = p 1_H^T; P here is the free vector p (M weights), init U(-1/sqrt(M),
#   1/sqrt(M)) as the code's nn.Linear(M, 1) (A5, §3.5).
# - Noise indexed by the LOCAL head j, eq. 11 as written (A7a exception, A14):
#   A_j = sum_k p_k (G_k + sigma_k eps_j); with global noise all local maps would be identical.
# - sigma: M standard deviations, init 0.1 (A7b, A7c); noise mode train (A7d).
# family: fish
design mish extends fish

replace param P[k: M] = uniform(low = -1 / sqrt(M), high = 1 / sqrt(M))   # p_k
replace random eps[h: H, n: N, m: N] = normal(mode = train)                # eps_j, per local head
# eq. 11, distributed: sum_k p_k (G_k + sigma_k eps_j) = sum_k p_k G_k + (sum_k p_k sigma_k) eps_j (spec §3.5 [D]),
# so the shared base is mixed once and only the noise term carries the local head h.
replace A[h n m] = softmax[m, scale = 1 / sqrt(D)](P[k] Q[n k d] K[m k d] + P[k] sigma[k] eps[h n m])
