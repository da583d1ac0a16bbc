# mistake: a derived design uses a tensor the base does not have
design mhsa_gated extends mhsa

param G[h: H] = ones
replace Y[n g] = G[h] A[h n m] Vv[m h e] WO[h e g]
