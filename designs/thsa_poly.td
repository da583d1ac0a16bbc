# THSA with the polynomial kernel: exp in the softmax box replaced by the power p of the C-score.
# Paper: Tuformer, eq. 3a-3c with Sec. 4.1(3), 4.3, App. E (polynomial kernel of Tsai et al.);
# Table 1 right. The paper gives no equations for kernelized THSA.
# Spec: shared/specs/tuformer.md §3.3, §5 A15, A18, §6 P15.
# Readings:
# - kappa_r(n, m) = (sum_s C[r, s] Q[n, s] K[m, s])^p, normalized over m (A15); with
#   C = I_H kron J_D this is per-head (q.k)^2-normalized attention (P15).
# - Degree p = 2 (A15: not given in the paper).
# - The 1/sqrt(R) scale is dropped: a homogeneous polynomial is invariant to it (A15, P15).
# - eps = 1e-6 in the denominator (kappa >= 0 for even p, but can vanish).
# family: tuformer
design thsa_poly extends thsa

replace A[r n m] = normalize[m, eps = 1e-6]((C[r s] Q[n s] K[m s]) ^ 2)
