# Trainable heads-only THSA: D = 1, so R = H, and C = C1 trainable H x H.
# Paper: Tuformer, eq. 3a-3c with Fig. 5c (Sec. 3.2: a special case of skip-right); Table 2.
# Spec: shared/specs/tuformer.md §2.4, §5 (A1, A11), §6 P4, P13.
# Readings:
# - THSA with R = H and C = C1 in R^{H x H} (A11: the structural definition; the paper's "around
#   6%" is not reproduced by any consistent shape). Parameters 4FH + H^2.
# - Scale 1/sqrt(R) (A1). Init C = sqrt(H) I_H, as skip-right's C1: at init this is MHSA with
#   H heads of width 1 (P4).
# family: tuformer
design trainable_heads_only extends thsa

replace size D = 1
replace param C[r: R, s: R] = identity(scale = sqrt(H))   # C1 (R = H here)
