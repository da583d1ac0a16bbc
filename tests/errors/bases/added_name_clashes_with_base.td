# mistake: redefines C without 'replace'
design skip_right_noreplace extends thsa

param C1[h: H, k: H] = identity(scale = sqrt(H))
const J[d: D, e: D] = ones
C[(h d) (k e)] = C1[h k] J[d e]
