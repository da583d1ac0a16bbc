# THSA with the ELU feature-map kernel (linear attention): the softmax box becomes phi boxes on Q
# and K and a normalize box.
# Paper: Tuformer, eq. 3a-3c with Sec. 4.1(3), 4.3, App. E (ELU kernel of Katharopoulos et al.,
# phi = elu + 1); Table 1 right. The paper gives no equations for kernelized THSA.
# Spec: shared/specs/tuformer.md §3.3, §5 A15, §6 P15.
# Readings:
# - kappa_r(n, m) = sum_s C[r, s] phi(Q)[n, s] phi(K)[m, s];  Omega[n, r] = sum_m kappa V / sum_m kappa
#   (A15); with C = I_H kron J_D this is per-head Katharopoulos linear attention (P15).
#   The alternative phi(q * C_r) . phi(k) is rejected (A15).
# - No softmax scale: the linear transformer has none (A15).
# - C unconstrained in training (A15), eps = 1e-6 in the denominator (A15, the linear
#   transformer's eps). C is initialized nonnegative, uniform(0, 2/sqrt(R)) (mean 1/sqrt(R), as
#   THSA's scale), so that kappa > 0 and the denominator is positive at init (A15 sign problem).
# - Non-causal, as the equations; a causal run needs the mask on the normalize box.
# family: tuformer
design thsa_elu extends thsa

replace param C[r: R, s: R] = uniform(low = 0, high = 2 / sqrt(R))
replace A[r n m] = normalize[m, eps = 1e-6](C[r s] elu1(Q[n s]) elu1(K[m s]))
