# mistake: extends 'tsha' instead of 'thsa'
design skip_right extends tsha

param C1[h: H, k: H] = identity(scale = sqrt(H))
const J[d: D, e: D] = ones
replace C[(h d) (k e)] = C1[h k] J[d e]
