# General Kronecker THSA: C = C1 kron (C2^T C3), with C1 (H x H), C2, C3 (1 x D) all trainable.
# Paper: Tuformer, eq. 3a-3c with the core of Fig. 4c / Sec. 3.2 ("allowing trainable components
# C1, C2 and C3"); not evaluated in the paper.
# Spec: shared/specs/tuformer.md §2.4, §5 (A1, A3, A6, A7, A14, A22), §6 P17.
# Readings:
# - C[(h d), (k e)] = C1[h, k] C2[d] C3[e]; C1's row and C2 on the r (value) side, C3 on the s
#   (query/key) side (A7). C2, C3 are 1 x D (A6). Parameters 4FHD + H^2 + 2D.
# - Scale 1/sqrt(R) (A1). Init C1 = sqrt(H) I_H, C2 = C3 = 1_D: exactly MHSA at init (P17);
#   contains skip-left (C1 fixed) and skip-right (C2, C3 fixed) (A14, P17).
# - r = h*D + d head-major (A3).
# family: tuformer
design kronecker extends thsa

param C1[h: H, k: H] = identity(scale = sqrt(H))
param C2[d: D] = ones
param C3[e: D] = ones
replace C[(h d) (k e)] = C1[h k] C2[d] C3[e]
