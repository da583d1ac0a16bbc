# Hard GFiSH self-attention: the linear mixing of Hard FiSH replaced by a small ReLU network over the
# head axis of the pre-softmax scores; zero noise.
# Paper: FiSHformer, eq. 12 (§2.4), with §4 "phi = a ReLU followed by a linear neural network".
# Spec: shared/specs/fishformer.md §3.6, §8.5, §6 (A8), §7 T10, T11, T12.
# Readings (besides those of hard_fish.td, which this extends):
# - GFiSH = R1 head-axis MLP (A8): A = W2^T relu(P^T G + b1) + b2, i.e. Linear(M -> H, bias) ->
#   ReLU -> Linear(H -> H, bias) along the head axis, as all the authors' code; P is its first layer,
#   so Hard GFiSH generalizes Hard FiSH (T10). Leg i is the hidden head (size H).
# - Scale 1/sqrt(D) applied after the MLP (the LM code; equivalent to pre-scaling, T12).
# - b2 is inert under the softmax (T11) but kept: it is in the code's parameter count (§3.6).
# - Hard = zero noise; nothing discrete (spec §3.8).
# - b1, W2, b2 init as PyTorch nn.Linear: U(-1/sqrt(fan_in), 1/sqrt(fan_in)), fan_in M then H.
# family: fish
design hard_gfish extends hard_fish

param b1[i: H] = uniform(low = -1 / sqrt(M), high = 1 / sqrt(M))
param W2[i: H, h: H] = uniform(low = -1 / sqrt(H), high = 1 / sqrt(H))
param b2[h: H] = uniform(low = -1 / sqrt(H), high = 1 / sqrt(H))
replace A[h n m] = softmax[m, scale = 1 / sqrt(D)](
    W2[i h] relu(P[k i] Q[n k d] K[m k d] + b1[i]) + b2[h])   # eq. 12, reading R1
