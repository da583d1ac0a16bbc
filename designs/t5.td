# T5's self-attention with log-spaced relative position buckets (the encoder: bidirectional).
# Paper: Raffel et al., "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
# Transformer" (T5, JMLR 2020), Sec. 2.1: "a scalar [learned per head, by bucket] is added to the
# corresponding logit"; "the number of positions in each embedding bucket [grows] logarithmically
# up to an offset of 128"; 32 buckets. The logits are Shaw, Uszkoreit and Vaswani (2018) eq. (5)
# with one scalar per head and bucket for its relative term, e_nm = q_n·k_m + Rel[b(m − n), h],
# in Vaswani et al. (2017) eq. (1) without its 1/√d_k. The buckets b are Mesh TensorFlow's
# `_relative_position_bucket`.
# Module: Hugging Face transformers' T5Attention(config, has_relative_attention_bias=True)
# (models/t5/modeling_t5.py): q, k, v, o without bias; compute_bias; softmax(q kᵀ + bias) v.
# Readings:
# - Offset m − n (key minus query). Bidirectional: half of the R buckets, NB = R/2, are for keys
#   after the query: clamp(m − n, 0, 1)·NB. The rest of the bucket is of the distance |m − n|:
#   exact below E = NB/2, then E + ⌊log(|m − n|/E) / log(MD/E) · (NB − E)⌋, at most NB − 1.
#   Written as min(|m − n|, E) + min(⌊log(max(|m − n|, E)/E) / log(MD/E)·(NB − E)⌋, NB − 1 − E):
#   the log part is 0 below E, so the sum is T5's `where(is_small, ...)`; its log is taken in
#   float32 on the integer distance, as T5 takes it, so the buckets equal T5's exactly.
# - The table Rel[r, h] is T5's relative_attention_bias (an embedding of R buckets by H heads),
#   read by a gather of the (n, m) → bucket table, built once per call at the run-time length.
# - No 1/√D: T5 folds the scaling into its initialization (Mesh TensorFlow); no biases.
# - The decoder's causal form with one-sided buckets is designs/t5_decoder.td.
# family: production
design t5

size F = 512, H = 8, D = 64, R = 32, MD = 128, NB = R / 2, E = NB / 2
size N

input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F * D))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param WO[h: H, e: D, g: F] = normal(std = 1 / sqrt(H * D))
param Rel[r: R, h: H] = zeros

Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m](Q[n h d] K[m h d] + Rel[r = clamp(m - n, 0, 1) * NB + min(abs(m - n), E)
                                             + min(floor(log(max(abs(m - n), E) / E) / log(MD / E) * (NB - E)), NB - 1 - E), h])
Y[n g]   = A[h n m] V[m h e] WO[h e g]

output Y
