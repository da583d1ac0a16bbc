# Transformer-sMLK: MLK with shifted keys k_jr = x_j W_K^T + b_r (key option B), phi(k_jr) mixed.
# Paper: MGK, eq. 13 (Sec. 2.4) with Sec. 2.3 "Design Options for Keys" (B).
# Spec: shared/specs/mgk.md §1.5(B), §1.6, §6.6, §4 (A11, A12).
# Readings (besides those of mlk.td, which this extends):
# - phi applied to the shifted key, phi(x_j W_K^T + b_r) (§1.6), then mixed by pi after phi (A11).
# - One key projection per head plus M shift vectors per head, b init N(0, 1) (A12).
# family: mgk
design smlk extends mlk

replace param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))   # one key projection per head
param b[h: H, r: M, d: D] = normal(std = 1)                      # shifts b_r
K0[m h d] = X[m f] WK[f h d]
replace K[m h r d] = K0[m h d] + b[h r d]
