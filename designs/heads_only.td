# Heads-only THSA: D = 1, so R = H, and C = I_H fixed.
# Paper: Tuformer, eq. 3a-3c with Fig. 5d, App. C case 2, App. D.1 case 2; Table 2 ("1.5%").
# Spec: shared/specs/tuformer.md §2.4, §5 (A1, A13, A21), §6 P4, P13.
# Readings:
# - C = I_H with R = H (A21: App. C's I_H and D.1's I_R agree at D = 1). Parameters 4FH.
# - Scale stays 1/sqrt(R) = 1/sqrt(H) (A1): this is MHSA with H heads of width 1 apart from the
#   temperature; MHSA(D = 1) exactly would need C = sqrt(H) I_H (P4). The fixed factor is
#   absorbed by the trainable WQ, WK, so the paper's C = I_H is kept.
# family: tuformer
design heads_only extends thsa

replace size D = 1
replace const C[r: R, s: R] = identity   # I_H (R = H here)
