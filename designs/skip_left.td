# Skip-left THSA: C = I_H kron (C2^T C3), C2 and C3 trainable vectors of length D.
# Paper: Tuformer, eq. 3a-3c with the core of Sec. 3.2 "THSA as a flexible design space", Fig. 5a,
# Table 2 ("skip-left C = I_H kron (C2^T C3)").
# Spec: shared/specs/tuformer.md §2.4, §5 (A1, A3, A6, A7, A22), §6 P11, P17.
# Readings:
# - C2, C3 are 1 x D (A6: they replace the two 1_D vectors; joined by a leg of size 1, i.e. an outer
#   product), so C2^T C3 is a rank-1 D x D matrix; parameters 4FHD + 2D.
# - C2 sits on the r (value) side, C3 on the s (query/key) side, following eq. 3b (A7).
# - Only C2, C3 are trainable; the left factor stays I_H (A22).
# - Scale 1/sqrt(R) (A1). Init C2 = sqrt(H) 1_D, C3 = 1_D: exactly MHSA at init (P11, P17).
# - r = h*D + d head-major (A3).
# family: tuformer
design skip_left extends thsa

const I[h: H, k: H] = identity
param C2[d: D] = fill(sqrt(H))
param C3[e: D] = ones
replace C[(h d) (k e)] = I[h k] C2[d] C3[e]
