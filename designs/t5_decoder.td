# T5's decoder self-attention: causal, with one-sided log-spaced relative position buckets.
# Paper: Raffel et al., "Exploring the Limits of Transfer Learning with a Unified Text-to-Text
# Transformer" (T5, JMLR 2020), Sec. 2.1; logits as in designs/t5.td (Shaw et al. 2018 eq. (5)
# with a scalar per head and bucket, Vaswani et al. 2017 eq. (1) unscaled), the buckets Mesh
# TensorFlow's `_relative_position_bucket` with bidirectional=False.
# Module: Hugging Face transformers' T5Attention in a decoder (is_decoder=True) with its causal mask.
# Readings:
# - designs/t5.td with its scores replaced: a key after the query is hidden (the causal mask),
#   and the distance is n − m ≥ 0 (T5's −min(m − n, 0)), so all R buckets are for it: exact
#   below E1 = R/2, then E1 + ⌊log((n − m)/E1) / log(MD/E1) · (R − E1)⌋, at most R − 1, written as
#   in t5.td with max(n − m, 0) for |m − n| (its log taken in float32, as T5 takes it).
# family: production
design t5_decoder extends t5

size E1 = R / 2

replace A[h n m] = softmax[m, mask = causal(n, m)](Q[n h d] K[m h d] + Rel[r = min(max(n - m, 0), E1)
                     + min(floor(log(max(n - m, E1) / E1) / log(MD / E1) * (R - E1)), R - 1 - E1), h])
