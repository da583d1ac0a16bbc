"""FiSH and MGK compiled modules against the papers' equations (spec fishformer.md §7, mgk.md §5),
each property checked against a direct formula in float64."""

import math

import pytest
import sympy
import torch
import torch.nn.functional as functional
from conftest import DESIGNS, gradcheck_parameters

import tdiag
from tdiag.plan import BATCH_SIZE

TOL = 1e-10
F, N = 8, 5


def small_sizes(name: str) -> dict[str, int]:
    if "mgk" in name or "mlk" in name:
        return {"F": F, "H": 2, "D": 3}
    return {"F": F, "H": 4} if name == "mhsa" else {"F": F, "H": 4, "M": 2}


def build(name: str, *, seed: int = 0, **sizes):
    design = tdiag.load(DESIGNS / f"{name}.td", **(small_sizes(name) | sizes))
    return design.module(dtype=torch.float64, seed=seed, N=N)


def x_input(batch=2, scale=1.0):
    return scale * torch.randn(batch, N, F, dtype=torch.float64, generator=torch.Generator().manual_seed(3))


def copy_shared(source, target):
    with torch.no_grad():
        for name, value in target.named_parameters():
            if hasattr(source, name) and getattr(source, name).shape == value.shape:
                value.copy_(getattr(source, name))


def projections(module, x, names=("WQ", "WK", "WV")):
    return [torch.einsum("bnf,f...->bn...", x, getattr(module, n)) for n in names]


# ---- FiSH (spec fishformer.md §7) ------------------------------------------------------------


def test_t1_hard_fish_with_identity_mixing_is_mhsa():
    hard, mhsa = build("hard_fish", M=4), build("mhsa", H=4)
    copy_shared(mhsa, hard)
    with torch.no_grad():
        hard.P.copy_(torch.eye(4))
    assert torch.allclose(hard(x_input()), mhsa(x_input()), atol=TOL, rtol=0)


def test_t1_fish_in_eval_mode_is_hard_fish():
    fish, hard = build("fish"), build("hard_fish")
    copy_shared(fish, hard)
    assert torch.allclose(fish.eval()(x_input()), hard(x_input()), atol=TOL, rtol=0)


@pytest.mark.parametrize(("noisy", "hard"), [("fish", "hard_fish"), ("gfish", "hard_gfish")])
def test_t3_zero_noise_in_training_is_the_hard_variant(noisy, hard):
    noisy_module, hard_module = build(noisy).train(), build(hard)
    copy_shared(noisy_module, hard_module)
    with torch.no_grad():
        noisy_module.sigma.zero_()
    assert torch.allclose(noisy_module(x_input()), hard_module(x_input()), atol=TOL, rtol=0)


def test_noise_is_on_in_training_off_in_eval_and_reproducible_with_a_seed():
    fish = build("fish")
    x = x_input()
    torch.manual_seed(5)
    a = fish.train()(x)
    torch.manual_seed(5)
    b = fish(x)
    assert torch.equal(a, b) and not torch.equal(a, fish(x))
    assert torch.equal(fish.eval()(x), fish(x))


@pytest.mark.parametrize("name", ["fish", "gfish", "mish"])
def test_eval_mode_draws_no_noise_and_computes_no_noise_term(name, monkeypatch):
    module, x = build(name).eval(), x_input()
    expected = module(x)
    for draw in ("randn", "zeros", "randn_like", "zeros_like"):
        monkeypatch.setattr(torch, draw, lambda *a, **k: pytest.fail("eval mode allocated noise"))
    assert torch.equal(module(x), expected)


@pytest.mark.slow
def test_fish_compiles_fullgraph_in_eval_and_in_training():
    module, x = build("fish"), x_input()
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    assert torch.allclose(compiled.eval()(x), module.eval()(x), atol=TOL, rtol=0)
    assert compiled.train()(x).shape == x.shape


def test_t4_and_t5_hard_mish_is_hard_fish_with_shared_weights_and_one_attention_map():
    mish, hard = build("mish").eval(), build("hard_fish")
    copy_shared(mish, hard)
    with torch.no_grad():
        hard.P.copy_(mish.P[:, None].expand(2, 4))
    x = x_input()
    assert torch.allclose(mish(x), hard(x), atol=TOL, rtol=0)
    q, k, v = projections(mish, x)
    scores = torch.einsum("k,bnkd,bmkd->bnm", mish.P, q, k) / math.sqrt(2)
    expected = torch.einsum("bnm,bmhe,heg->bng", scores.softmax(-1), v, mish.WO)
    assert torch.allclose(mish(x), expected, atol=TOL, rtol=0)


def test_t10_gfish_with_positive_preactivations_is_hard_fish_with_folded_mixing():
    gfish, hard = build("hard_gfish"), build("hard_fish")
    copy_shared(gfish, hard)
    with torch.no_grad():
        gfish.b1.fill_(1e3)  # every hidden pre-activation positive: the ReLU is the identity
        hard.P.copy_(gfish.P @ gfish.W2)
    assert torch.allclose(gfish(x_input()), hard(x_input()), atol=1e-8, rtol=0)


def test_t11_the_output_bias_b2_is_inert():
    gfish, x = build("hard_gfish"), x_input()
    before = gfish(x)
    before.sum().backward()
    assert torch.allclose(gfish.b2.grad, torch.zeros(4, dtype=torch.float64), atol=1e-12)
    with torch.no_grad():
        gfish.b2.normal_()
    assert torch.allclose(gfish(x), before, atol=TOL, rtol=0)


def test_t18_every_local_softmax_map_is_row_stochastic():
    for name in ("fish", "mish", "gfish", "hard_gfish"):
        design = tdiag.load(DESIGNS / f"{name}.td", F=F, H=4, M=2)
        reference = design.module(impl="reference", dtype=torch.float64, N=N)
        _, values = reference(x_input(), return_intermediates=True)
        assert torch.allclose(values["A"].sum(-1), torch.ones_like(values["A"][..., 0]), atol=TOL), name


def test_t19_permuting_global_heads_everywhere_changes_nothing():
    fish, x = build("fish").eval(), x_input()
    before = fish(x)
    perm = torch.tensor([1, 0])
    with torch.no_grad():
        fish.WQ.copy_(fish.WQ[:, perm])
        fish.WK.copy_(fish.WK[:, perm])
        fish.P.copy_(fish.P[perm])
        fish.sigma.copy_(fish.sigma[perm])
    assert torch.allclose(fish(x), before, atol=TOL, rtol=0)


@pytest.mark.parametrize(
    ("name", "count"),
    [("hard_fish", 8208), ("fish", 8210), ("mish", 8196), ("hard_gfish", 8288), ("gfish", 8290), ("mhsa", 32768)],
)
def test_t21_attention_matrix_parameters_match_the_spec(name, count):
    """D = 16, D_x = 128, H = 8, M = 2 (spec §4.4): Q/K projections, mixing, σ (and b1, W2, b2)."""
    sizes = {"F": 128, "H": 8} | ({"M": 2} if name != "mhsa" else {})
    module = tdiag.load(DESIGNS / f"{name}.td", **sizes).module()
    counted = {"WQ", "WK", "P", "sigma", "b1", "W2", "b2"}
    assert sum(p.numel() for n, p in module.named_parameters() if n in counted) == count


def test_hard_lfish_with_identity_mixing_is_linear_attention():
    lfish = build("lfish", M=4)
    with torch.no_grad():
        lfish.P.copy_(1e3 * torch.eye(4))  # simplex logits: softmax over k is exactly the identity
    x = x_input()
    q, k, v = projections(lfish, x)
    phi_q, phi_k = functional.elu(q) + 1, functional.elu(k) + 1
    kernel = torch.einsum("bnhd,bmhd->bhnm", phi_q, phi_k)
    heads = torch.einsum("bhnm,bmhe->bnhe", kernel / (kernel.sum(-1, keepdim=True) + 1e-6), v)
    assert torch.allclose(lfish(x), torch.einsum("bnhe,heg->bng", heads, lfish.WO), atol=1e-8, rtol=0)


def test_t14_folded_hard_fish_costs_h_d_m_per_score_and_is_taken_only_for_memory():
    design = tdiag.load(DESIGNS / "hard_fish.td")
    n, d, h, m = (design.graph.sizes[s].symbol for s in ("N", "D", "H", "M"))
    default, folded = design.cost(), design.cost(objective="memory")
    assert "sdpa" not in [s.kind for s in design.plan().steps]
    assert sympy.expand(default.score_flops).coeff(n, 2) == sympy.expand(2 * m * (d + h))  # spec §8.2
    assert sympy.expand(folded.score_flops).coeff(n, 2) == 2 * h * m * d  # the MQA form, T14


def test_t14_folded_hard_fish_computes_the_same_function():
    design = tdiag.load(DESIGNS / "hard_fish.td", F=F, H=4, M=2)
    plain = design.module(dtype=torch.float64, N=N)
    folded = design.module(dtype=torch.float64, N=N, objective="memory")
    folded.load_state_dict(plain.state_dict())
    assert "sdpa" in [s.kind for s in folded.tdiag_plan.steps]
    assert torch.allclose(plain(x_input()), folded(x_input()), atol=TOL, rtol=0)


# ---- MGK (spec mgk.md §5) --------------------------------------------------------------------


def gaussian_logits(q, k, d):
    """ℓ = −‖q − k‖² / (2√D): q [b n h d], k [b m h r d] -> [b h n m r]."""
    return -((q[:, :, None, :, None, :] - k[:, None]) ** 2).sum(-1).permute(0, 3, 1, 2, 4) / (2 * math.sqrt(d))


def test_eq9_mgk_is_the_joint_softmax_over_keys_and_components_with_the_prior():
    mgk, x = build("mgk"), x_input()
    with torch.no_grad():
        mgk.pi.copy_(torch.tensor([[0.3, 0.7], [0.6, 0.4]]))
    q, k, v = projections(mgk, x)
    logits = gaussian_logits(q, k, 3) + mgk.pi.log()[None, :, None, None, :]
    attention = logits.flatten(-2).softmax(-1).unflatten(-1, (N, 2)).sum(-1)
    expected = torch.einsum("bhnm,bmhe,heg->bng", attention, v, mgk.WO)
    assert torch.allclose(mgk(x), expected, atol=TOL, rtol=0)


def test_p3_mgk_with_one_component_is_softmax_with_the_key_norm_bias():
    mgk, x = build("mgk", M=1), x_input()
    q, k, v = projections(mgk, x)
    k = k[..., 0, :]
    scores = torch.einsum("bnhd,bmhd->bhnm", q, k) / math.sqrt(3) - (k * k).sum(-1).transpose(1, 2)[:, :, None, :] / (
        2 * math.sqrt(3)
    )
    expected = torch.einsum("bhnm,bmhe,heg->bng", scores.softmax(-1), v, mgk.WO)
    assert torch.allclose(mgk(x), expected, atol=TOL, rtol=0)


def test_p5_mgk_is_invariant_to_rescaling_the_shared_prior():
    mgk, x = build("mgk"), x_input()
    before = mgk(x)
    with torch.no_grad():
        mgk.pi.mul_(0.5)
    assert torch.allclose(mgk(x), before, atol=TOL, rtol=0)


def test_p7_mgk_is_invariant_to_a_rotation_of_queries_and_keys():
    mgk, x = build("mgk"), x_input()
    before = mgk(x)
    rotation, _ = torch.linalg.qr(torch.randn(3, 3, dtype=torch.float64, generator=torch.Generator().manual_seed(1)))
    with torch.no_grad():
        mgk.WQ.copy_(mgk.WQ @ rotation)
        mgk.WK.copy_(mgk.WK @ rotation)
    assert torch.allclose(mgk(x), before, atol=TOL, rtol=0)


def test_p9_hard_e_takes_the_nearest_component():
    hard, x = build("mgk_harde"), x_input()
    q, k, v = projections(hard, x)
    attention = gaussian_logits(q, k, 3).amax(-1).softmax(-1)
    assert torch.allclose(hard(x), torch.einsum("bhnm,bmhe,heg->bng", attention, v, hard.WO), atol=TOL, rtol=0)


def test_p11_smgk_with_zero_shifts_is_single_key_gaussian_attention():
    smgk, mgk = build("smgk"), build("mgk", M=1)
    copy_shared(smgk, mgk)
    with torch.no_grad():
        smgk.b.zero_()
        mgk.WK.copy_(smgk.WK[:, :, None, :])
    assert torch.allclose(smgk(x_input()), mgk(x_input()), atol=TOL, rtol=0)


def test_p11_smgk_with_shifts_is_gaussian_attention_to_the_shifted_keys():
    smgk, x = build("smgk"), x_input()
    with torch.no_grad():
        smgk.pi.copy_(torch.tensor([[0.3, 0.7], [0.6, 0.4]]))
    q, k0, v = projections(smgk, x)
    keys = k0[:, :, :, None, :] + smgk.b  # k_jr = k_j + b_r
    logits = gaussian_logits(q, keys, 3) + smgk.pi.log()[None, :, None, None, :]
    attention = logits.flatten(-2).softmax(-1).unflatten(-1, (N, 2)).sum(-1)
    expected = torch.einsum("bhnm,bmhe,heg->bng", attention, v, smgk.WO)
    assert torch.allclose(smgk(x), expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("components", [2, 4])
def test_p11_smgk_pays_one_n_squared_contraction_whatever_the_number_of_shifts(components):
    design = tdiag.load(DESIGNS / "smgk.td", M=components)
    plan = design.plan(objective="flops")  # P11 is a FLOPs rewrite (the time objective may fuse the box)
    n, d, h, m = (design.graph.sizes[s].symbol for s in ("N", "D", "H", "M"))
    scores = [s for s in plan.steps if s.in_box and sympy.expand(s.flops).coeff(n, 2) != 0]
    assert [sympy.expand(s.flops).coeff(n, 2) for s in scores] == [2 * d * h * BATCH_SIZE]
    assert any("P11" in note for note in plan.lowered)
    assert m not in sympy.expand(design.cost().flops).coeff(n, 2).coeff(d).free_symbols


def test_p11_expanded_distance_broadcasts_to_the_full_score_tensor_only_twice():
    design = tdiag.load(DESIGNS / "smgk.td")
    n, h, m = (design.graph.sizes[s].symbol for s in ("N", "H", "M"))
    (distance,) = [s for s in design.plan(objective="flops").steps if s.kind == "sqdist"]
    assert sympy.expand(distance.elementwise).coeff(n, 2) == 2 * h * m * BATCH_SIZE


def test_p11_expansion_is_not_taken_where_it_saves_nothing():
    plan = tdiag.load(DESIGNS / "smgk.td", M=1).plan(objective="flops")
    assert not any("P11" in note for note in plan.lowered)


def test_p12_mlk_is_linear_attention_with_mixed_key_features():
    mlk, x = build("mlk"), x_input()
    with torch.no_grad():
        mlk.pi.copy_(torch.tensor([[0.2, 0.8], [0.5, 0.5]]))
    q, k, v = projections(mlk, x)
    mixed = torch.einsum("hr,bmhrd->bmhd", mlk.pi, functional.elu(k) + 1)
    kernel = torch.einsum("bnhd,bmhd->bhnm", functional.elu(q) + 1, mixed)
    heads = torch.einsum("bhnm,bmhe->bnhe", kernel / (kernel.sum(-1, keepdim=True) + 1e-6), v)
    assert torch.allclose(mlk(x), torch.einsum("bnhe,heg->bng", heads, mlk.WO), atol=1e-8, rtol=0)


def causal_design(name: str, **sizes):
    return tdiag.load(DESIGNS / f"{name}.td", **(small_sizes(name) | sizes)).with_causal_mask()


def test_p12_causal_mlk_by_prefix_sums_equals_the_masked_quadratic_form():
    design = causal_design("mlk")
    assert any("causal prefix sums" in note for note in design.plan(N=64).lowered)  # planned for N = 64
    mlk, x = design.module(dtype=torch.float64, N=64), x_input()
    q, k, v = projections(mlk, x)
    mixed = torch.einsum("hr,bmhrd->bmhd", mlk.pi, functional.elu(k) + 1)
    kernel = torch.einsum("bnhd,bmhd->bhnm", functional.elu(q) + 1, mixed).tril()  # j <= i
    heads = torch.einsum("bhnm,bmhe->bnhe", kernel / (kernel.sum(-1, keepdim=True) + 1e-6), v)
    assert torch.allclose(mlk(x), torch.einsum("bnhe,heg->bng", heads, mlk.WO), atol=TOL, rtol=0)


@pytest.mark.parametrize("name", ["mlk", "smlk", "lfish"])
def test_causal_linear_designs_cost_no_n_squared_term(name):
    design = causal_design(name)
    n = design.graph.sizes["N"].symbol
    assert sympy.expand(design.cost().flops).coeff(n, 2) == 0
    assert sympy.expand(design.cost().peak_memory).coeff(n, 2) == 0


@pytest.mark.slow
@pytest.mark.parametrize("name", ["mlk", "lfish"])
def test_causal_prefix_sums_pass_gradcheck(name):
    design = causal_design(name)
    assert any("causal prefix sums" in note for note in design.plan(N=64).lowered)
    module = design.module(dtype=torch.float64, N=64)
    x = x_input(1).requires_grad_()
    assert torch.autograd.gradcheck(module, (x,), eps=1e-6, atol=1e-6)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", ["mgk", "smgk"])
def test_p17_memory_objective_runs_mgk_as_one_sdpa_over_n_times_m_keys(name, causal):
    design = tdiag.load(DESIGNS / f"{name}.td", F=F, H=2, D=3)
    design = design.with_causal_mask() if causal else design
    module = design.module(dtype=torch.float64, N=N, objective="memory").eval()
    reference = design.module(dtype=torch.float64, N=N, impl="reference")
    reference.load_state_dict(module.state_dict())
    kinds = [step.kind for step in module.tdiag_plan.steps]
    assert kinds.count("sdpa") == 1 and "softmax" not in kinds
    x = x_input()
    assert torch.allclose(module(x), reference(x), atol=TOL, rtol=0)


def test_p17_is_not_taken_for_flops_since_it_multiplies_the_value_contraction_by_m():
    design = tdiag.load(DESIGNS / "mgk.td")
    n = design.graph.sizes["N"].symbol
    default, memory = design.cost(), design.cost(objective="memory")
    assert "sdpa" not in [step.kind for step in design.plan(objective="flops").steps]
    assert memory.at(N=1024)["flops"] > default.at(N=1024)["flops"]
    assert sympy.expand(memory.peak_memory).coeff(n, 2) == 0 != sympy.expand(default.peak_memory).coeff(n, 2)


def test_p17_lowering_passes_gradcheck():
    design = tdiag.load(DESIGNS / "mgk.td", F=F, H=2, D=3).with_causal_mask()
    module = design.module(dtype=torch.float64, N=N, objective="memory")
    x = x_input(1).requires_grad_()
    assert torch.autograd.gradcheck(module, (x,), eps=1e-6, atol=1e-6)


def test_p14_mgk_attention_is_row_stochastic_over_keys_and_components():
    reference = tdiag.load(DESIGNS / "mgk.td", F=F, H=2, D=3).module(impl="reference", dtype=torch.float64, N=N)
    _, values = reference(x_input(), return_intermediates=True)
    assert torch.allclose(values["A"].sum((-1, -2)), torch.ones(2, 2, N, dtype=torch.float64), atol=TOL)


def test_p15_soft_e_prior_updates_in_training_only_and_stays_a_distribution():
    softe = build("mgk_softe", N=N).train()
    before = softe.pi.clone()
    softe(x_input())
    assert not torch.equal(softe.pi, before) and not softe.pi.requires_grad
    assert torch.allclose(softe.pi.sum(-1), torch.ones(2, N, dtype=torch.float64), atol=TOL)
    after = softe.pi.clone()
    softe.eval()(x_input())
    assert torch.equal(softe.pi, after)
    assert "pi" in softe.state_dict()


def test_p16_permuting_components_with_their_prior_changes_nothing():
    mgk, x = build("mgk"), x_input()
    with torch.no_grad():
        mgk.pi.copy_(torch.tensor([[0.3, 0.7], [0.6, 0.4]]))
    before = mgk(x)
    with torch.no_grad():
        mgk.WK.copy_(mgk.WK.flip(2))
        mgk.pi.copy_(mgk.pi.flip(1))
    assert torch.allclose(mgk(x), before, atol=TOL, rtol=0)


def test_p17_mgk_is_one_softmax_attention_over_n_times_m_augmented_keys():
    mgk, x = build("mgk"), x_input()
    with torch.no_grad():
        mgk.pi.copy_(torch.tensor([[0.3, 0.7], [0.6, 0.4]]))
    q, k, v = projections(mgk, x)
    variance = math.sqrt(3)
    q_hat = torch.cat([q, torch.ones_like(q[..., :2])], -1)  # [q, 1, 1]
    k_hat = torch.cat(
        [
            k,
            -0.5 * (k * k).sum(-1, keepdim=True),
            variance * mgk.pi.log()[None, None, :, :, None].expand_as(k[..., :1]),
        ],
        -1,
    )
    keys = k_hat.permute(0, 2, 1, 3, 4).flatten(2, 3)  # [b h (m r) d+2]
    values = v.permute(0, 2, 1, 3).repeat_interleave(2, dim=2)  # v_(jr) = v_j
    heads = functional.scaled_dot_product_attention(q_hat.transpose(1, 2), keys, values, scale=1 / variance)
    assert torch.allclose(mgk(x), torch.einsum("bhne,heg->bng", heads, mgk.WO), atol=TOL, rtol=0)


@pytest.mark.parametrize("name", ["mgk", "smgk", "mgk_harde", "mgk_softe", "fish", "gfish", "mlk"])
def test_p20_large_logits_in_float32_stay_finite(name):
    sizes = {"N": N} if name == "mgk_softe" else {}
    module = tdiag.load(DESIGNS / f"{name}.td", **(small_sizes(name) | sizes)).module(N=N).eval()
    with torch.no_grad():
        out = module(x_input(scale=100.0).float())  # ‖q − k‖² of order 1e4 and beyond
    assert torch.isfinite(out).all()


@pytest.mark.parametrize("name", ["mgk", "smgk"])
def test_p20_large_logits_stay_finite_and_agree_with_float64_under_the_p17_lowering(name):
    design = tdiag.load(DESIGNS / f"{name}.td", F=F, H=2, D=3).with_causal_mask()
    module = design.module(N=N, objective="memory").eval()
    exact = design.module(N=N, dtype=torch.float64).eval()
    exact.load_state_dict({k: v.double() for k, v in module.state_dict().items()})
    x = x_input(scale=100.0)
    with torch.no_grad():
        out, expected = module(x.float()), exact(x)
    assert torch.isfinite(out).all()
    assert torch.allclose(out.double(), expected, rtol=1e-3, atol=1e-3 * expected.abs().max().item())


@pytest.mark.slow
@pytest.mark.parametrize(
    "name", ["fish", "hard_fish", "mish", "gfish", "hard_gfish", "lfish", "mgk", "mgk_harde", "smgk", "mlk", "smlk"]
)
def test_gradcheck_with_noise_off(name):
    module = build(name).eval()
    x = x_input(1).requires_grad_()
    assert gradcheck_parameters(module, (x,), atol=1e-6)


@pytest.mark.parametrize("name", ["fish", "hard_gfish", "mgk", "mlk", "smgk"])
def test_bfloat16_autocast_stays_close_to_float64(name):
    design_sizes = {"F": 32, "H": 4, "M": 2} if "mgk" not in name and "mlk" not in name else {"F": 32, "H": 2, "D": 8}
    design = tdiag.load(DESIGNS / f"{name}.td", **design_sizes)
    exact = design.module(dtype=torch.float64, N=16).eval()
    module = design.module(N=16).eval()
    module.load_state_dict({k: v.float() for k, v in exact.state_dict().items()})
    x = torch.randn(2, 16, 32, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = module(x.float())
    assert torch.isfinite(low).all()
    assert (low.double() - exact(x)).abs().max() < 0.1 * exact(x).abs().max() + 0.05


def test_t23_fish_noise_moments_follow_the_global_noise_reading(tmp_path):
    """Spec A7a/T23: noise on the global maps gives local scores with mean P·G, variance
    Σ_k P[k,h]² σ_k² and cross-head covariance Σ_k P[k,h] P[k,h'] σ_k² (statistical, fixed seed)."""
    import shutil

    for base in ("fish", "hard_fish"):
        shutil.copy(DESIGNS / f"{base}.td", tmp_path / f"{base}.td")
    (tmp_path / "fish_scores.td").write_text(
        "# Paper: FiSH eq. 9, the local pre-softmax scores\ndesign fish_scores extends fish\n"
        "S[h n m] = P[k h] * (Q[n k d] K[m k d] + sigma[k] eps[k n m])\noutput S\n"
    )
    scores = tdiag.load(tmp_path / "fish_scores.td", F=F, H=4, M=2).module(dtype=torch.float64, N=3).train()
    with torch.no_grad():
        scores.sigma.copy_(torch.tensor([0.5, 1.5]))
    x = x_input(1)[:, :3].expand(20000, 3, F)
    torch.manual_seed(0)
    s = scores(x)  # [samples, h, n, m]
    with torch.no_grad():
        scores.sigma.zero_()
        hard = scores(x[:1])[0]
    p, sigma2 = scores.P.detach(), torch.tensor([0.25, 2.25], dtype=torch.float64)
    assert torch.allclose(s.mean(0), hard, atol=0.05)
    variance = (p**2 * sigma2[:, None]).sum(0)  # [h]
    assert torch.allclose(s.var(0).mean((-1, -2)), variance, rtol=0.05)
    centered = s - s.mean(0)
    covariance = torch.einsum("shnm,sgnm->hg", centered, centered) / (centered.shape[0] * 9)
    assert torch.allclose(covariance, p.T @ (sigma2[:, None] * p), atol=0.05 * variance.max())
