# mistake: extends a design with no file next to this one
design causal_mhsa extends mhsa_base

replace A[h n m] = softmax[m, mask = causal(n, m)](Q[n h d] K[m h d])
