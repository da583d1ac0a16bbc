# Single-head THSA: C = J_R = 1_R 1_R^T (all ones, fixed).
# Paper: Tuformer, eq. 3a-3c with App. C case 1 and App. D.1 case 1 (C = 1_D 1_D^T with H = 1,
# D = R); Fig. 10 left.
# Spec: shared/specs/tuformer.md §2.4, §5 (A1, A21), §6 P3.
# Readings:
# - Scale stays 1/sqrt(R) (A1); then THSA(C = J_R) equals single-head attention of width R at
#   scale 1/sqrt(R) exactly, with no rescaling of C (P3).
# - App. C's 1_D 1_D^T and D.1's 1_R 1_R^T are one design (A21). C has no parameters: 4FR.
# family: tuformer
design single_head extends thsa

replace const C[r: R, s: R] = ones   # J_R: every score map is the same sum over s
