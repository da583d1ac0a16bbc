# LFiSH self-attention, in its Hard form (Hard LFiSH): FiSH on a linear transformer. The M global
# kernel matrices phi(Q_k) phi(K_k)^T are mixed into H local ones before the row normalization.
# Paper: FiSHformer §4.4, Table 5 (no equations given); Katharopoulos et al.'s linear attention with
# phi = elu + 1; mixing as eq. 10.
# Spec: shared/specs/fishformer.md §3.7, §8.6, §6 A15, §7 T15, T16.
# Readings:
# - This is Hard LFiSH, the spec's recommended definition (A15): A_j = sum_k p_kj phi(Q_k) phi(K_k)^T,
#   out_j = (A_j V_j) / (A_j 1); linear in N when evaluated as phi(Q) (phi(K)^T V).
# - The noisy LFiSH is not included: noise on an N x N matrix breaks the low-rank (linear-cost)
#   form and the positivity of the kernel, and the paper gives no equation (A15).
# - Mixing weights on the simplex (A15: nonnegative or simplex P keeps the denominator positive):
#   p_kj = softmax over k of the logits P, init zeros (p = 1/M). Since the normalization over m
#   removes any per-local-head scale, the simplex loses nothing against nonnegative P.
# - No temperature; eps = 1e-6 in the denominator (the linear transformer's eps).
# - A mask belongs on the normalize box, after the mixing (A18).
# family: fish
design lfish extends hard_fish

replace param P[k: M, h: H] = zeros   # simplex logits
replace A[h n m] = normalize[m, eps = 1e-6](softmax[k](P[k h]) elu1(Q[n k d]) elu1(K[m k d]))
