# BERT's self-attention block: bidirectional multi-head attention with biases and a key padding mask,
# then the output projection, the residual and the post-LayerNorm.
# Paper: Devlin et al., "BERT: Pre-training of Deep Bidirectional Transformers for Language
# Understanding" (NAACL 2019), Sec. 3 (the bidirectional Transformer encoder of Vaswani et al.,
# "Attention Is All You Need" (2017), eq. (1), Sec. 3.2.2, with the sub-layer output
# LayerNorm(x + Sublayer(x)) of Sec. 3.1); LayerNorm of Ba, Kiros and Hinton (2016), eq. (3).
# Module: Hugging Face transformers' BertAttention (models/bert/modeling_bert.py): BertSelfAttention
# (query, key, value: nn.Linear with bias; softmax(q kᵀ · head_dim^−0.5 + mask) v) then
# BertSelfOutput: LayerNorm(dense(context) + x).
# Readings:
# - pad[m] marks the tokens that exist (True = attend; HF's attention_mask 1): padded keys get no
#   weight. Every query is computed, padded ones included (as HF does); a mask not given attends
#   everywhere. No causal mask: BERT is an encoder.
# - query/key/value.weight [H·D, F] are WQ/WK/WV[f, h, d] transposed, their biases bq/bk/bv[h, d];
#   dense.weight [F, H·D] is WO[h, e, g] transposed, its bias bo[g].
# - LayerNorm over the F features: (z − mean) / sqrt(var + eps) · ln_w + ln_b with the biased
#   variance (mean of squared deviations), eps = 1e-12 (BertConfig.layer_norm_eps; written in the
#   design, not a size). BERT-base is F = 768, H = 12; no dropout (eval).
# family: production
design bert

size F = 512, H = 8, D = F / H
size N

input X[n: N, f: F]
mask pad[m: N]
param WQ[f: F, h: H, d: D] = normal(std = 0.02)
param WK[f: F, h: H, d: D] = normal(std = 0.02)
param WV[f: F, h: H, e: D] = normal(std = 0.02)
param bq[h: H, d: D] = zeros
param bk[h: H, d: D] = zeros
param bv[h: H, e: D] = zeros
param WO[h: H, e: D, g: F] = normal(std = 0.02)
param bo[g: F] = zeros
param ln_w[g: F] = ones
param ln_b[g: F] = zeros

Q[n h d] = X[n f] WQ[f h d] + bq[h d]
K[m h d] = X[m f] WK[f h d] + bk[h d]
V[m h e] = X[m f] WV[f h e] + bv[h e]
A[h n m] = softmax[m, scale = 1 / sqrt(D), mask = pad[m]](Q[n h d] K[m h d])
Z[n g]   = A[h n m] V[m h e] WO[h e g] + bo[g] + X[n g]
C[n g]   = Z[n g] - mean[g](Z[n g])
Y[n g]   = ln_w[g] C[n g] (mean[g](C[n g] ^ 2) + 1e-12) ^ -0.5 + ln_b[g]

output Y
