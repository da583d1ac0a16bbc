# mistake: replaces a size the base does not have
design thsa_small extends thsa

replace size Dh = 32
