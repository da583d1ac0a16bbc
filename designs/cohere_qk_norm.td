# Cohere's self-attention block with QK-norm (Command R+): designs/cohere.td with a layer norm
# (centred, no bias) over each head's query and key features, each head with its own weight.
# Paper: none describes Command R+'s block (HF's CohereForCausalLM is the reference); QK-norm
# after Dehghani et al., "Scaling Vision Transformers to 22 Billion Parameters" (2023), Sec. 2;
# layer norm of Ba et al. (2016), eq. (4): (x − μ) / sqrt(σ² + eps) · g, μ and σ² the mean and
# variance over the normalized features.
# Module: Hugging Face transformers' CohereAttention with use_qk_norm = True: q_norm and k_norm are
# CohereLayerNorm(hidden_size = (heads, head_dim)), applied to q_proj(x), k_proj(x) viewed as
# [..., heads, head_dim]: mean and variance over head_dim, weight [heads, head_dim], no bias;
# then the rotation as in cohere.td.
# Readings:
# - Extends cohere.td: Q[n g r d] = nq[g r d] C / sqrt(mean_d C² + eps), C = Qp − mean_d Qp (the
#   variance is the mean of the centred squares, as HF computes it); K likewise with nk[g d]. The
#   weight is per head (HF's q_norm.weight [H, D] viewed head-major as (g r d)), unlike Qwen3's
#   shared one; the mean is over d alone, unlike OLMo 2's (olmo2.td).
# - eps = 1e-5 (CohereConfig.layer_norm_eps). HF computes the norm in float32 and casts back; here
#   it is computed in the compute dtype.
# family: production
design cohere_qk_norm extends cohere

param nq[g: G, r: R, d: D] = ones
param nk[g: G, d: D] = ones

Qp[n g r d] = X[n f] WQ[f g r d]
Kp[m g d]   = X[m f] WK[f g d]
Qc[n g r d] = Qp[n g r d] - mean[d](Qp[n g r d])
Kc[m g d]   = Kp[m g d] - mean[d](Kp[m g d])
replace Q[n g r d] = nq[g r d] Qc[n g r d] (mean[d](Qc[n g r d] ^ 2) + 1e-5) ^ -0.5
replace K[m g d]   = nk[g d] Kc[m g d] (mean[d](Kc[m g d] ^ 2) + 1e-5) ^ -0.5
