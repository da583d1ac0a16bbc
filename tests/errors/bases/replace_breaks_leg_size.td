# mistake: the replacing core uses leg s at size D
design thsa_bad_core extends thsa

replace param C[r: R, s: D] = zeros
