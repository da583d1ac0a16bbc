"""The reference evaluator (tdiag/reference.py), the compiler's test oracle: it agrees with
torch.nn.MultiheadAttention and with hand-written einsums, runs every design with batch dims,
reproduces THSA ⊇ MHSA (spec tuformer.md P1, P17), updates buffers in training only, draws noise
as the random tensors' modes say, and rejects inputs of the wrong shape."""

import math

import pytest
import torch
from conftest import DESIGN_FILES, DESIGNS

import tdiag
from tdiag.reference_module import ReferenceModule

F, H, N = 8, 2, 5
D = F // H
F64 = torch.float64


def reference(path, sizes=None, **load_sizes):
    load_sizes = {"F": F, "H": H} | load_sizes
    return ReferenceModule(tdiag.load(path, **load_sizes).graph, sizes, dtype=F64)


def inputs(*batch, n=N, f=F, seed=1):
    return torch.randn(*batch, n, f, dtype=F64, generator=torch.Generator().manual_seed(seed))


def mhsa_text(*options: str, extra: str = "") -> str:
    """mhsa.td with box options added (a variant that extends nothing)."""
    text = (DESIGNS / "mhsa.td").read_text()
    box = "softmax[m, scale = 1 / sqrt(D)]"
    assert box in text
    text = text.replace(box, "softmax[m, scale = 1 / sqrt(D)" + "".join(f", {o}" for o in options) + "]")
    return text.replace("param WQ", extra + "\nparam WQ", 1) if extra else text


def torch_mha(module: ReferenceModule) -> torch.nn.MultiheadAttention:
    """nn.MultiheadAttention with mhsa's weights: its projections' output axis is (h d), head-major."""
    mha = torch.nn.MultiheadAttention(F, H, bias=False, batch_first=True).to(F64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([module.get_parameter(w).reshape(F, F).T for w in ("WQ", "WK", "WV")]))
        mha.out_proj.weight.copy_(module.WO.reshape(F, F).T)
    return mha


# ---- agreement with torch and with hand-written attention ---------------------------------


def test_mhsa_matches_torch_multihead_attention():
    module = reference(DESIGNS / "mhsa.td")
    x = inputs(3)
    y, values = module(x, return_intermediates=True)
    expected, weights = torch_mha(module)(x, x, x, need_weights=True, average_attn_weights=False)
    torch.testing.assert_close(y, expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(values["A"], weights, rtol=0, atol=1e-10)  # A[h n m] per head


def test_causal_mhsa_matches_torch_multihead_attention(write_td):
    module = reference(write_td(mhsa_text("mask = causal(n, m)")))
    x = inputs(3)
    forbidden = torch.ones(N, N, dtype=torch.bool).triu(1)  # torch: True = not allowed
    expected, _ = torch_mha(module)(x, x, x, attn_mask=forbidden)
    torch.testing.assert_close(module(x), expected, rtol=0, atol=1e-10)


def test_padding_mask_matches_torch_and_a_missing_mask_attends_everywhere(write_td):
    module = reference(write_td(mhsa_text("mask = pad[m]", extra="mask pad[m: N]")))
    x = inputs(3)
    pad = torch.tensor([[1, 1, 1, 0, 0], [1, 0, 1, 1, 1], [1, 1, 1, 1, 1]], dtype=torch.bool)
    mha = torch_mha(module)
    expected, _ = mha(x, x, x, key_padding_mask=~pad)
    torch.testing.assert_close(module(x, pad=pad), expected, rtol=0, atol=1e-10)
    torch.testing.assert_close(module(x), mha(x, x, x)[0], rtol=0, atol=1e-10)


def test_fully_masked_row_is_uniform_over_the_keys_it_may_see_not_nan(write_td):
    module = reference(write_td(mhsa_text("mask = causal(n, m)", "mask = pad[m]", extra="mask pad[m: N]")))
    pad = torch.tensor([False, False, True, True, True])  # queries 0 and 1 may see only padding
    y, values = module(inputs(2), pad=pad, return_intermediates=True)
    assert torch.isfinite(y).all()
    past = torch.tensor([[1, 0, 0, 0, 0], [0.5, 0.5, 0, 0, 0]], dtype=F64)  # never the future
    torch.testing.assert_close(values["A"][..., :2, :], past.expand(2, H, 2, N))
    assert (values["A"][..., 2:, :2] == 0).all()


def test_mgk_matches_hand_written_gaussian_attention():
    """Joint softmax over (m, r), log prior, sqdist with the key-norm term (mgk.td)."""
    module = reference(DESIGNS / "mgk.td")
    x = inputs(2)
    D_mgk = module.WQ.shape[-1]
    q = torch.einsum("bnf,fhd->bhnd", x, module.WQ)
    k = torch.einsum("bmf,fhrd->bhmrd", x, module.WK)
    v = torch.einsum("bmf,fhe->bhme", x, module.WV)
    distance = ((q[:, :, :, None, None, :] - k[:, :, None, :, :, :]) ** 2).sum(-1)  # b h n m r
    logits = module.pi.clamp(1e-6, 1).log()[None, :, None, None, :] - distance / (2 * math.sqrt(D_mgk))
    a = logits.flatten(-2).softmax(-1).unflatten(-1, logits.shape[-2:])
    expected = torch.einsum("bhnmr,bhme,heg->bng", a, v, module.WO)
    torch.testing.assert_close(module(x), expected, rtol=0, atol=1e-10)


def test_mlk_matches_hand_written_linear_attention():
    """The normalize box with eps, elu + 1 features, prior mixing after phi (mlk.td)."""
    module = reference(DESIGNS / "mlk.td")
    x = inputs(2)
    phi = torch.nn.functional.elu
    q = phi(torch.einsum("bnf,fhd->bhnd", x, module.WQ)) + 1
    k = phi(torch.einsum("bmf,fhrd->bhmrd", x, module.WK)) + 1
    kbar = torch.einsum("hr,bhmrd->bhmd", module.pi.clamp(0, 1), k)
    kernel = torch.einsum("bhnd,bhmd->bhnm", q, kbar)
    a = kernel / (kernel.sum(-1, keepdim=True) + 1e-6)
    v = torch.einsum("bmf,fhe->bhme", x, module.WV)
    expected = torch.einsum("bhnm,bhme,heg->bng", a, v, module.WO)
    torch.testing.assert_close(module(x), expected, rtol=0, atol=1e-10)


# ---- every design, batch dims ----------------------------------------------------------------


@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_every_design_runs_with_batch_dims(path):
    module = reference(path, N=N) if path.stem == "mgk_softe" else reference(path)
    count = len(module.tdiag_graph.inputs)  # a cross-attention's memory: a second sequence of width F
    y = module(*[inputs(2, 3)] * count)
    assert y.shape == (2, 3, N, F) and torch.isfinite(y).all()
    module.eval()
    assert torch.isfinite(module(*[inputs(2, 3)] * count)).all()


def test_mgk_softe_runs_at_its_default_n():
    module = reference(DESIGNS / "mgk_softe.td")  # N = 256 from the file
    assert module.pi.shape == (H, 256, 2)
    assert module(inputs(1, n=256)).shape == (1, 256, F)


def test_batch_dims_are_independent_and_optional():
    module = reference(DESIGNS / "mhsa.td")
    x = inputs(2, 3)
    y = module(x)
    for i in range(2):
        for j in range(3):
            torch.testing.assert_close(y[i, j], module(x[i, j]), rtol=0, atol=1e-12)
    assert module(x[0, 0]).shape == (N, F)


def test_free_size_is_bound_at_run_time():
    module = reference(DESIGNS / "mhsa.td")
    assert module(inputs(n=3)).shape == (3, F) and module(inputs(n=7)).shape == (7, F)


# ---- THSA ⊇ MHSA ---------------------------------------------------------------------------


def copy_mhsa_weights_into_thsa(mhsa: ReferenceModule, thsa: ReferenceModule) -> None:
    """WQ[f h d] -> WQ[f (h d)] etc.: r = h*D + d, head-major (spec A3)."""
    with torch.no_grad():
        for name in ("WQ", "WK", "WV"):
            target = thsa.get_parameter(name)
            target.copy_(mhsa.get_parameter(name).reshape(target.shape))
        thsa.WO.copy_(mhsa.WO.reshape(F, F))


def test_thsa_with_core_sqrt_h_kron_identity_ones_equals_mhsa():
    """P1: THSA(C = sqrt(H) (I_H kron J_D), 1/sqrt(R)) = MHSA(1/sqrt(D))."""
    mhsa, thsa = reference(DESIGNS / "mhsa.td"), reference(DESIGNS / "thsa.td")
    copy_mhsa_weights_into_thsa(mhsa, thsa)
    with torch.no_grad():
        core = math.sqrt(H) * torch.kron(torch.eye(H, dtype=F64), torch.ones(D, D, dtype=F64))
        thsa.C.copy_(core)
    x = inputs(2, 3)
    torch.testing.assert_close(thsa(x), mhsa(x), rtol=0, atol=1e-10)
    thsa.C.data[0, -1] = 1.0  # a negative control: another core gives another output
    assert not torch.allclose(thsa(x), mhsa(x))


@pytest.mark.parametrize("name", ["skip_right", "skip_left", "kronecker"])
def test_structured_cores_equal_mhsa_at_init(name):
    """P17: C = C1[h k] J[d e] merged into C[(h d) (k e)] is sqrt(H) (I_H kron J_D) at init."""
    mhsa, variant = reference(DESIGNS / "mhsa.td"), reference(DESIGNS / f"{name}.td")
    copy_mhsa_weights_into_thsa(mhsa, variant)
    x = inputs(2)
    y, values = variant(x, return_intermediates=True)
    core = math.sqrt(H) * torch.kron(torch.eye(H, dtype=F64), torch.ones(D, D, dtype=F64))
    torch.testing.assert_close(values["C"], core)
    torch.testing.assert_close(y, mhsa(x), rtol=0, atol=1e-10)


# ---- stored tensors, buffers, noise --------------------------------------------------------


def test_parameters_are_registered_by_name_in_declaration_order_and_seeded():
    a, b = reference(DESIGNS / "mhsa.td"), reference(DESIGNS / "mhsa.td")
    assert [name for name, _ in a.named_parameters()] == ["WQ", "WK", "WV", "WO"]
    assert a.WQ.shape == (F, H, D) and a.WO.shape == (H, D, F) and a.WQ.dtype == F64
    assert all(torch.equal(p, q) for p, q in zip(a.parameters(), b.parameters(), strict=True))
    other = ReferenceModule(tdiag.load(DESIGNS / "mhsa.td", F=F, H=H).graph, seed=1)
    assert not torch.allclose(other.WQ.double(), a.WQ)


def test_constants_are_non_persistent_buffers():
    module = reference(DESIGNS / "skip_right.td")
    assert torch.equal(module.J, torch.ones(D, D, dtype=F64))
    assert "J" not in module.state_dict() and "C1" in module.state_dict()


def test_mgk_softe_buffer_updates_in_training_only_without_gradient():
    module = reference(DESIGNS / "mgk_softe.td", N=N)
    assert "pi" in module.state_dict() and "pi" not in dict(module.named_parameters())
    start = module.pi.clone()
    module.eval()
    module(inputs(2, 3))
    assert torch.equal(module.pi, start)
    module.train()
    y, values = module(inputs(2, 3), return_intermediates=True)
    y.square().sum().backward()  # the in-place update must not break the backward pass
    assert module.pi.grad is None and not module.pi.requires_grad
    assert module.WQ.grad is not None
    assert not torch.allclose(module.pi, start)
    # M-step: mean over the batch dims and the queries n of gamma[h n m r]
    torch.testing.assert_close(module.pi, values["gamma"].mean(dim=(0, 1, 3)))
    torch.testing.assert_close(module.pi.sum(-1), torch.ones(H, N, dtype=F64))


def test_fish_noise_is_drawn_in_training_only_and_eval_equals_hard_fish():
    fish, hard = reference(DESIGNS / "fish.td"), reference(DESIGNS / "hard_fish.td")
    with torch.no_grad():
        for name, value in hard.named_parameters():
            fish.get_parameter(name).copy_(value + 0.01)  # shared ones; different from fish's own
            value.add_(0.01)
    x = inputs(2, 3)
    fish.train()
    assert not torch.allclose(fish(x), fish(x))
    torch.manual_seed(0)
    first = fish(x)
    torch.manual_seed(0)
    torch.testing.assert_close(fish(x), first, rtol=0, atol=0)  # the global RNG
    fish.eval()
    torch.testing.assert_close(fish(x), fish(x), rtol=0, atol=0)
    torch.testing.assert_close(fish(x), hard(x), rtol=0, atol=1e-12)


@pytest.mark.parametrize(("mode", "train_noisy", "eval_noisy"), [("always", True, True), ("never", False, False)])
def test_random_modes(write_td, mode, train_noisy, eval_noisy):
    path = write_td(
        "design noisy\nsize F = 4\nsize N\ninput X[n: N, f: F]\n"
        f"random eps[n: N, f: F] = normal(mode = {mode})\nY[n f] = X[n f] + eps[n f]\noutput Y\n"
    )
    module = ReferenceModule(tdiag.load(path).graph, dtype=F64)
    x = inputs(2, 3, f=4)
    for training, noisy in ((True, train_noisy), (False, eval_noisy)):
        module.train(training)
        noise = module(x) - x
        assert noise.shape == (2, 3, N, 4)
        assert bool((noise != 0).all()) is noisy
        if noisy:  # fresh per batch element
            assert not torch.allclose(noise[0, 0], noise[1, 2])


# ---- wrong inputs ----------------------------------------------------------------------------


def test_wrong_input_width_names_the_leg_and_both_sizes():
    module = reference(DESIGNS / "mhsa.td")
    with pytest.raises(ValueError, match=r"input X: leg f has size F = 8, got 7"):
        module(inputs(2, f=7))


def test_too_low_rank_and_wrong_input_count_are_rejected():
    module = reference(DESIGNS / "mhsa.td")
    with pytest.raises(ValueError, match=r"input X: expected at least 2 dims"):
        module(torch.randn(F, dtype=F64))
    with pytest.raises(ValueError, match=r"takes 1 input\(s\) \(X\), got 2"):
        module(inputs(), inputs())


def test_fixed_n_is_checked():
    module = reference(DESIGNS / "mgk_softe.td", N=N)
    with pytest.raises(ValueError, match=r"input X: leg n has size N = 5, got 4"):
        module(inputs(n=4))


def test_mask_is_checked_against_the_bound_size_and_dtype(write_td):
    module = reference(write_td(mhsa_text("mask = pad[m]", extra="mask pad[m: N]")))
    with pytest.raises(ValueError, match=r"mask pad: leg m has size N = 5, got 4"):
        module(inputs(2), pad=torch.ones(2, 4, dtype=torch.bool))
    with pytest.raises(ValueError, match=r"mask pad must be a bool tensor"):
        module(inputs(2), pad=torch.ones(2, N))
    with pytest.raises(ValueError, match=r"no mask input 'padding'"):
        module(inputs(2), padding=torch.ones(2, N, dtype=torch.bool))


def test_module_sizes_bind_free_sizes_and_reject_unknown_ones():
    graph = tdiag.load(DESIGNS / "mhsa.td", F=F, H=H).graph
    assert ReferenceModule(graph, {"N": 6}).tdiag_sizes == {"F": F, "H": H, "D": D, "N": 6}
    with pytest.raises(ValueError, match="no size Q"):
        ReferenceModule(graph, {"Q": 3})


SPLIT_MHSA = """design split_mhsa
size F = 8, H = 2, D = F / H, R = H * D
size N
input X[n: N, f: F]
param WQ[f: F, s: R]
param WK[f: F, s: R]
param WV[f: F, h: H, e: D]
param WO[r: R, g: F]
Q[n h d] = X[n f] WQ[f (h d)]
K[m h d] = X[m f] WK[f (h d)]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, scale = 1 / sqrt(D)](Q[n h d] K[m h d])
Y[n g] = A[h n m] V[m h e] WO[(h e) g]
output Y
"""


def test_a_grouped_reference_splits_its_axis_head_major(write_td):
    """WQ[f (h d)] views the R axis as (h, d) with r = h*D + d: mhsa with reshaped weights."""
    mhsa = reference(DESIGNS / "mhsa.td")
    split = ReferenceModule(tdiag.load(write_td(SPLIT_MHSA)).graph, dtype=F64)
    copy_mhsa_weights_into_thsa(mhsa, split)
    x = inputs(2)
    torch.testing.assert_close(split(x), mhsa(x), rtol=0, atol=1e-10)


def test_a_reference_module_cast_with_double_computes_positions_in_the_inputs_dtype():
    design = tdiag.load(DESIGNS / "rope.td", F=F, H=H)  # the angles index(n) θ_p meet Q in a product
    compiled = design.module(dtype=F64)
    reference_module = design.module(impl="reference").double()
    reference_module.load_state_dict(compiled.state_dict())
    x = inputs(2)
    torch.testing.assert_close(reference_module(x), compiled(x), atol=1e-12, rtol=0)


def test_an_empty_batch_gives_an_empty_output_like_the_compiled_module():
    design = tdiag.load(DESIGNS / "mgk.td", F=F, H=H, D=D)  # a joint softmax over (m, r)
    x = torch.randn(0, N, F, dtype=F64)
    assert design.module(impl="reference", dtype=F64)(x).shape == design.module(dtype=F64)(x).shape == (0, N, F)
