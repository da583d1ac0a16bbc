# mistake: two replaced names the base does not have
design thsa_small extends thsa

replace size Dh = 32
replace param Wo[r: R, g: F] = zeros
