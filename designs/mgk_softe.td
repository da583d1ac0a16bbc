# Transformer-MGK + Soft-E: the prior pi is a per-key-position buffer, re-estimated by the closed-form
# M-step from the soft E-step responsibilities (setting B, "+ Soft-E" rows of Table 4).
# Paper: MGK, eq. 9-10 (attention with the current prior) and eq. 11 (responsibilities), with the
# M-step pi_jr = N_jr / N of Sec. 2.3.
# Spec: shared/specs/mgk.md §1.4(B), §1.8, §6.5, §4 (A5, A6, A15, A17), §5 P15.
# Readings (besides those of mgk.td, which this extends):
# - Soft-E prior is a buffer updated in training mode (A6): no gradient; the forward uses the
#   current pi and the update, run after the forward in training only, is used from the next call.
# - pi is per key position j in this setting (A6), so the buffer is pi[h, m, r] with m of size N;
#   init 1/M, and it stays on the simplex over r (P15).
# - gamma = eq. 11 with its indices corrected (A5): a softmax over r only of log pi + logits.
# - M-step: pi_jr <- mean over queries (and the batch) of gamma_ijr (A6; Sec. 2.3 "N is the number
#   of queries").
# - N has a default here, N = 256 (the buffer's key-position axis needs a size); override it with
#   the sequence length used. Without padding every query is valid (A15).
# - The logits L are one statement, shared by the E-step and the attention.
# family: mgk
design mgk_softe extends mgk

replace size N = 256
replace buffer pi[h: H, m: N, r: M] = fill(1 / M)
L[h n m r] = log(clamp(pi[h m r], 1e-6, 1)) - sqdist[d](Q[n h d], K[m h r d]) / (2 * sqrt(D))
replace A[h n m r] = softmax[m r](L[h n m r])          # eq. 9 with the current per-key prior
gamma[h n m r] = softmax[r](L[h n m r])                # eq. 11: responsibilities
update pi[h m r] = mean[n](gamma[h n m r])             # M-step: pi_jr = N_jr / N
