# Transformer-sMGK: MGK with shifted keys k_jr = x_j W_K^T + b_r (key option B).
# Paper: MGK, eq. 9-10 with Sec. 2.3 "Design Options for Keys" (B); App. A.1.1, A.1.3 (b init).
# Spec: shared/specs/mgk.md §1.5(B), §1.8, §6.3, §4 A12, §5 P11.
# Readings (besides those of mgk.td, which this extends; soft E-step, learned pi):
# - One key projection per head plus M learnable shift vectors per head: K = K0 + b, a sum node
#   broadcasting K0 over r and b over key positions (§6.3).
# - b init N(0, 1), the paper's (A12; the authors' code uses N(0, 0.25) with b_1 = 0).
# - The compiler expands sqdist(Q, K0 + b) into one N^2 contraction plus O(NMD) terms (P11) when
#   that costs fewer FLOPs (any M >= 2); `tdiag compile` reports it.
# family: mgk
design smgk extends mgk

replace param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))   # one key projection per head
param b[h: H, r: M, d: D] = normal(std = 1)                      # shifts b_r
K0[m h d] = X[m f] WK[f h d]
replace K[m h r d] = K0[m h d] + b[h r d]
