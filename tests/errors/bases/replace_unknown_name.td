# mistake: replaces W0 (zero), the base has WO
design thsa_wide_out extends thsa

replace param W0[r: R, g: F] = zeros
