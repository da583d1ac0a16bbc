# Skip-right THSA: C = C1 kron (1_D 1_D^T), C1 trainable H x H (pre-softmax head mixing).
# Paper: Tuformer, eq. 3a-3c with the core of Sec. 3.2, Fig. 5b, Table 2 row "C = C1 kron (1_D^T 1_D)".
# Spec: shared/specs/tuformer.md §2.4, §5 (A1, A3, A4, A5, A22), §6 P10, P17.
# Readings:
# - Skip-right is C1 kron J_D (A5; Sec. 3.2 prints I_H kron (C2^T C3) for both skips, a typo).
# - Only C1 is trainable; the right factor stays J_D (A22). Parameters 4FHD + H^2.
# - Scale 1/sqrt(R) (A1). Init C1 = sqrt(H) I_H: exactly MHSA at init (P1, P17).
# - r = h*D + d head-major (A3); C1's first leg is on the value side (A7).
# family: tuformer
design skip_right extends thsa

param C1[h: H, k: H] = identity(scale = sqrt(H))
const J[d: D, e: D] = ones
replace C[(h d) (k e)] = C1[h k] J[d e]
