"""The compiled module is exactly the design (spec tuformer.md §6): against torch's attention,
against the reference evaluation of the same graph, and against the paper's identities."""

import math
import re
import shutil

import pytest
import sympy
import torch
import torch.nn.functional as functional
from conftest import DESIGN_FILES, DESIGNS, gradcheck_parameters, order_variants, standalone_module

import tdiag
from tdiag.plan import reads
from tdiag.thsa import core_matrix, init_from_mhsa, stable_rank

TOL = 1e-10
SMALL = {"F": 8, "H": 2}
TUFORMER = ["mhsa", "single_head", "thsa", "skip_left", "skip_right", "kronecker", "heads_only",
            "trainable_heads_only", "thsa_elu", "thsa_poly"]  # fmt: skip


def small_sizes(name: str) -> dict[str, int]:
    sizes = dict(SMALL)
    if "mgk" in name or "mlk" in name:
        sizes["D"] = 4
    if name == "mgk_softe":
        sizes["N"] = 5
    return sizes


def build(name: str, *, causal: bool = False, seed: int = 0, **sizes):
    design = tdiag.load(DESIGNS / f"{name}.td", **(small_sizes(name) | sizes))
    if causal:
        design = design.with_causal_mask()
    return design.module(dtype=torch.float64, seed=seed, N=5)


def reference_of(design_name: str, module, *, causal: bool = False, **sizes):
    design = tdiag.load(DESIGNS / f"{design_name}.td", **(small_sizes(design_name) | sizes))
    if causal:
        design = design.with_causal_mask()
    reference = design.module(impl="reference", dtype=torch.float64, N=5)
    reference.load_state_dict(module.state_dict(), strict=False)
    for name, value in module.named_parameters():
        getattr(reference, name).data.copy_(value)
    return reference


def x_input(*batch, n=5, f=8):
    return torch.randn(*batch, n, f, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def multihead_attention(mhsa) -> torch.nn.MultiheadAttention:
    width, heads = mhsa.WQ.shape[0], mhsa.WQ.shape[1]
    mha = torch.nn.MultiheadAttention(width, heads, bias=False, batch_first=True, dtype=torch.float64)
    with torch.no_grad():
        mha.in_proj_weight.copy_(torch.cat([w.reshape(width, width).T for w in (mhsa.WQ, mhsa.WK, mhsa.WV)]))
        mha.out_proj.weight.copy_(mhsa.WO.reshape(width, width).T)
    return mha


# ---- MHSA against torch ---------------------------------------------------------------------


def test_mhsa_equals_torch_multihead_attention_float64():
    mhsa, x = build("mhsa"), x_input(3)
    expected, _ = multihead_attention(mhsa)(x, x, x, need_weights=False)
    assert torch.allclose(mhsa(x), expected, atol=TOL, rtol=0)


def test_causal_mhsa_equals_torch_multihead_attention_with_causal_mask():
    mhsa, x = build("mhsa", causal=True), x_input(3)
    mask = torch.nn.Transformer.generate_square_subsequent_mask(5, dtype=torch.float64)
    expected, _ = multihead_attention(mhsa)(x, x, x, attn_mask=mask, need_weights=False)
    assert torch.allclose(mhsa(x), expected, atol=TOL, rtol=0)


@pytest.mark.parametrize("causal", [False, True])
def test_mhsa_equals_an_sdpa_formulation(causal):
    mhsa, x = build("mhsa", causal=causal), x_input(2)
    q, k, v = (torch.einsum("bnf,fhd->bhnd", x, w) for w in (mhsa.WQ, mhsa.WK, mhsa.WV))
    heads = functional.scaled_dot_product_attention(q, k, v, is_causal=causal)
    assert torch.allclose(mhsa(x), torch.einsum("bhnd,hdg->bng", heads, mhsa.WO), atol=TOL, rtol=0)


def test_mhsa_box_is_lowered_to_scaled_dot_product_attention():
    plan = tdiag.load(DESIGNS / "mhsa.td").plan()
    assert plan.lowered == ["softmax box over m lowered to scaled_dot_product_attention"]
    assert "scaled_dot_product_attention" in tdiag.load(DESIGNS / "mhsa.td").source()


def test_module_accepts_any_leading_batch_dims():
    mhsa = build("mhsa")
    x = x_input(2, 3)
    assert mhsa(x).shape == (2, 3, 5, 8)
    assert torch.allclose(mhsa(x)[1, 2], mhsa(x[1, 2]), atol=TOL, rtol=0)


@pytest.mark.parametrize("impl", ["compiled", "reference"])
def test_an_input_named_as_an_output_is_given_back_beside_a_computed_output(impl):
    design = tdiag.loads(
        "design echo\nsize N, F = 3\ninput X[n: N, f: F]\nparam W[f: F, g: F]\nY[n g] = X[n f] W[f g]\noutput X, Y\n"
    )
    module = design.module(seed=0, impl=impl, dtype=torch.float64)
    x = torch.randn(2, 4, 3, dtype=torch.float64, requires_grad=True)
    echoed, y = module(x)
    torch.testing.assert_close(echoed, x, rtol=0, atol=0)
    torch.testing.assert_close(y, x @ module.W, rtol=0, atol=1e-12)
    echoed.sum().backward()
    torch.testing.assert_close(x.grad, torch.ones_like(x), rtol=0, atol=0)


@pytest.mark.parametrize("construct", ["causal factor", "gather position", "slice", "reshape", "map mask"])
def test_the_order_of_factors_does_not_change_the_value(construct):
    x = torch.randn(2, 5, 6, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    first, second = (tdiag.loads(t).module(seed=0, dtype=torch.float64)(x) for t in order_variants(construct))
    torch.testing.assert_close(first, second, rtol=0, atol=1e-12)


# ---- the plan computes each value once and reads everything it computes ----------------------


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_every_planned_step_is_read_by_a_later_step_or_the_output(path, causal):
    design = tdiag.load(path)
    plan = (design.with_causal_mask() if causal else design).plan()
    steps = [*plan.steps, *plan.update_steps]
    outputs = {value.var for _, value in plan.outputs}
    for k, step in enumerate(steps):
        if step.out is None or step.out.var in outputs:
            continue
        later = {value.var for s in steps[k + 1 :] for value in reads(s.op)}
        assert step.out.var in later, f"{path.stem}: step {k} ({step.description}) is never read"


@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_no_two_planned_steps_compute_the_same_thing(path):
    plan = tdiag.load(path).plan()
    names = {step.out.var: f"v{k}" for k, step in enumerate(plan.steps) if step.out is not None}
    seen = set()
    for step in plan.steps:
        canonical = re.sub(r"\b\w+\b", lambda m: names.get(m.group(0), m.group(0)), repr(step.op))
        assert canonical not in seen, f"{path.stem}: {step.description} is computed twice"
        seen.add(canonical)


# ---- the plan equals the plain evaluation of the same graph ---------------------------------


@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_compiled_plan_equals_reference_evaluation(path):
    module = build(path.stem).eval()
    reference = reference_of(path.stem, module).eval()
    x = [x_input(2)] * len(module.tdiag_plan.graph.inputs)  # a cross-attention's memory: X again
    assert torch.allclose(module(*x), reference(*x), atol=TOL, rtol=0)


@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_causal_compiled_plan_equals_reference_and_ignores_the_future(path):
    module = build(path.stem, causal=True).eval()
    reference = reference_of(path.stem, module, causal=True).eval()
    count = len(module.tdiag_plan.graph.inputs)  # a cross-attention's memory: X again
    x = x_input(2)
    later = x.clone()
    later[:, 3:] += 1.0
    assert torch.allclose(module(*[x] * count), reference(*[x] * count), atol=TOL, rtol=0)
    assert torch.allclose(module(*[later] * count)[:, :3], module(*[x] * count)[:, :3], atol=TOL, rtol=0)


@pytest.mark.parametrize("name", ["thsa_elu", "mlk", "smlk", "lfish"])
def test_causal_linear_attention_in_chunks_equals_the_masked_quadratic_form(name):
    design = tdiag.load(DESIGNS / f"{name}.td", **small_sizes(name)).with_causal_mask()
    module = design.module(dtype=torch.float64, N=64)  # planned for 64: chunks of 16
    assert any(step.kind == "prefix" for step in module.tdiag_plan.steps)
    reference = design.module(impl="reference", dtype=torch.float64, N=37)  # 3 chunks, the last one padded
    reference.load_state_dict(module.state_dict())
    x = x_input(2, n=37)
    assert torch.allclose(module(x), reference(x), atol=TOL, rtol=0)


def test_standalone_file_equals_in_process_module(tmp_path):
    design = tdiag.load(DESIGNS / "thsa.td", **SMALL)
    generated = standalone_module(design.source(N=5), "thsa_module", tmp_path)
    standalone = generated.Thsa(seed=7, dtype=torch.float64)
    in_process = design.module(seed=7, dtype=torch.float64, N=5)
    x = x_input(2)
    assert torch.equal(standalone(x), in_process(x))


@pytest.mark.parametrize(
    ("name", "objective", "planned"),
    [("mgk", "memory", 5), ("mlk", "flops", 64)],
    ids=["mgk-p17-sdpa", "mlk-chunked-prefix"],
)
def test_standalone_file_equals_in_process_module_for_fused_and_chunked_plans(tmp_path, name, objective, planned):
    design = tdiag.load(DESIGNS / f"{name}.td", **small_sizes(name)).with_causal_mask()
    generated = standalone_module(design.source(N=planned, objective=objective), f"{name}_module", tmp_path)
    standalone = getattr(generated, name.capitalize())(seed=7, dtype=torch.float64)
    in_process = design.module(seed=7, dtype=torch.float64, N=planned, objective=objective)
    kinds = {step.kind for step in in_process.tdiag_plan.steps}
    assert kinds & {"sdpa", "prefix"}
    x = x_input(2, n=37)
    assert torch.equal(standalone(x), in_process(x))


def test_standalone_file_imports_only_torch_and_the_standard_library():
    source = tdiag.load(DESIGNS / "fish.td").source()
    imports = {line.split()[1] for line in source.splitlines() if line.startswith(("import ", "from "))}
    assert imports <= {"hashlib", "math", "torch"}


def test_generated_code_names_parameters_after_the_td_tensors_in_declared_axis_order():
    module = tdiag.load(DESIGNS / "thsa.td").module()
    assert {n: tuple(p.shape) for n, p in module.named_parameters()} == {
        "WQ": (512, 512), "WK": (512, 512), "WV": (512, 512), "WO": (512, 512), "C": (512, 512)
    }  # fmt: skip
    assert tuple(tdiag.load(DESIGNS / "mhsa.td").module().WO.shape) == (8, 64, 512)


def test_initialization_is_deterministic_for_a_seed():
    a, b, c = (tdiag.load(DESIGNS / "mhsa.td", **SMALL).module(seed=s) for s in (3, 3, 4))
    assert torch.equal(a.WQ, b.WQ) and not torch.equal(a.WQ, c.WQ)
    assert a.WQ.std().item() == pytest.approx(1 / math.sqrt(8), rel=0.3)


@pytest.mark.slow
@pytest.mark.parametrize("name", TUFORMER)
def test_gradcheck(name):
    module = build(name).eval()
    x = x_input(1, n=3).requires_grad_()
    assert gradcheck_parameters(module, (x,))


# ---- Tuformer identities (spec tuformer.md §6) ----------------------------------------------


def test_p1_thsa_initialized_from_mhsa_equals_mhsa():
    mhsa, thsa, x = build("mhsa", H=4), build("thsa", H=4), x_input(2)
    init_from_mhsa(thsa, mhsa)
    assert torch.allclose(thsa(x), mhsa(x), atol=TOL, rtol=0)


def test_p1_init_from_torch_multihead_attention():
    thsa, x = build("thsa", H=4), x_input(2)
    mha = torch.nn.MultiheadAttention(8, 4, bias=False, batch_first=True, dtype=torch.float64)
    init_from_mhsa(thsa, mha)
    assert torch.allclose(thsa(x), mha(x, x, x, need_weights=False)[0], atol=TOL, rtol=0)


def test_p1_negative_control_unscaled_core_is_not_mhsa():
    mhsa, thsa, x = build("mhsa", H=4), build("thsa", H=4), x_input(2)
    init_from_mhsa(thsa, mhsa)
    with torch.no_grad():
        thsa.C.div_(2.0)  # √H = 2: C = I_H ⊗ J_D at THSA's 1/√R is MHSA at the wrong temperature
    assert not torch.allclose(thsa(x), mhsa(x), atol=1e-6)


def test_p2_kron_in_the_other_order_is_not_mhsa():
    mhsa, thsa, x = build("mhsa", H=4), build("thsa", H=4), x_input(2)
    init_from_mhsa(thsa, mhsa)
    with torch.no_grad():
        thsa.C.copy_(2.0 * torch.kron(torch.ones(2, 2), torch.eye(4)))
    assert not torch.allclose(thsa(x), mhsa(x), atol=1e-6)


def test_p3_thsa_with_all_ones_core_equals_single_head():
    thsa, single, x = build("thsa"), build("single_head"), x_input(2)
    with torch.no_grad():
        for name in ("WQ", "WK", "WV", "WO"):
            getattr(single, name).copy_(getattr(thsa, name))
        thsa.C.fill_(1.0)
    assert torch.allclose(thsa(x), single(x), atol=TOL, rtol=0)


def test_p4_heads_only_is_attention_with_one_dimensional_heads():
    """C = I_H with R = H (D = 1): per-head rank-1 scores q_r k_r at THSA's 1/√R (spec §2.4)."""
    heads_only, x = build("heads_only", H=4), x_input(2)
    q, k, v = (x @ w for w in (heads_only.WQ, heads_only.WK, heads_only.WV))
    scores = torch.einsum("bnr,bmr->brnm", q, k) / math.sqrt(4)
    expected = torch.einsum("brnm,bmr,rg->bng", scores.softmax(-1), v, heads_only.WO)
    assert torch.allclose(heads_only(x), expected, atol=TOL, rtol=0)


def test_p5_stable_rank_counts_heads():
    h, d = 4, 3
    core = torch.kron(torch.eye(h), torch.ones(d, d))
    assert stable_rank(core) == pytest.approx(h)
    assert stable_rank(torch.ones(12, 12)) == pytest.approx(1)
    assert stable_rank(torch.eye(h)) == pytest.approx(h)
    a, b = torch.randn(3, 3), torch.randn(2, 2)
    assert stable_rank(5 * a) == pytest.approx(stable_rank(a))
    assert stable_rank(torch.kron(a, b)) == pytest.approx(stable_rank(a) * stable_rank(b))


@pytest.mark.parametrize(
    ("name", "heads"), [("single_head", 1), ("skip_left", 2), ("skip_right", 2), ("heads_only", 2)]
)
def test_p5_stable_rank_of_design_cores_at_init(name, heads):
    assert stable_rank(build(name)) == pytest.approx(heads)


def test_p6_box_rows_sum_to_one_and_thsa_box_has_legs_r_n_m():
    reference = tdiag.load(DESIGNS / "thsa.td", **SMALL).module(impl="reference", dtype=torch.float64, N=5)
    _, values = reference(x_input(2), return_intermediates=True)
    assert values["A"].shape == (2, 8, 5, 5)  # [r n m]
    assert torch.allclose(values["A"].sum(-1), torch.ones(2, 8, 5, dtype=torch.float64))


def test_p7_identity_core_folds_to_the_mhsa_plan(tmp_path):
    """THSA with C = √H·(I_H ⊗ J_D) written with constants costs what MHSA costs: the identity
    and all-ones nodes never reach the code (spec §1.6, P7)."""
    shutil.copy(DESIGNS / "thsa.td", tmp_path / "thsa.td")
    (tmp_path / "thsa_mhsa.td").write_text(
        "# Paper: Tuformer eq. 2a-2c (Prop. 1)\ndesign thsa_mhsa extends thsa\n"
        "const I[h: H, k: H] = identity(scale = sqrt(H))\nconst J[d: D, e: D] = ones\n"
        "replace C[(h d) (k e)] = I[h k] J[d e]\n"
    )
    folded, mhsa = tdiag.load(tmp_path / "thsa_mhsa.td"), tdiag.load(DESIGNS / "mhsa.td")
    assert sympy.simplify(folded.cost().flops - mhsa.cost().flops) == 0
    assert "torch.eye" not in folded.source() and "self.I" not in folded.source()
    small = tdiag.load(tmp_path / "thsa_mhsa.td", **SMALL).module(dtype=torch.float64, N=5)
    reference = tdiag.load(tmp_path / "thsa_mhsa.td", **SMALL).module(impl="reference", dtype=torch.float64, N=5)
    reference.load_state_dict(small.state_dict(), strict=False)
    assert torch.allclose(small(x_input(2)), reference(x_input(2)), atol=TOL, rtol=0)


def test_p8_diagonal_rescaling_of_core_and_query_is_a_symmetry():
    thsa, x = build("thsa"), x_input(2)
    before = thsa(x)
    a = torch.rand(8, dtype=torch.float64) + 0.5
    with torch.no_grad():
        thsa.C.mul_(a)  # C diag(a): scales column s
        thsa.WQ.div_(a)  # W^Q diag(a)^-1
    assert torch.allclose(thsa(x), before, atol=TOL, rtol=0)


def test_p8_value_output_rescaling_is_a_symmetry():
    thsa, x = build("thsa"), x_input(2)
    before = thsa(x)
    g = torch.rand(8, dtype=torch.float64) + 0.5
    with torch.no_grad():
        thsa.WV.mul_(g)
        thsa.WO.div_(g[:, None])
    assert torch.allclose(thsa(x), before, atol=TOL, rtol=0)


def test_p8_permuting_the_rank_index_everywhere_is_a_symmetry():
    thsa, x = build("thsa"), x_input(2)
    before = thsa(x)
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        for name in ("WQ", "WK", "WV"):
            getattr(thsa, name).copy_(getattr(thsa, name)[:, perm])
        thsa.WO.copy_(thsa.WO[perm])
        thsa.C.copy_(thsa.C[perm][:, perm])
    assert torch.allclose(thsa(x), before, atol=TOL, rtol=0)


def test_p10_skip_right_is_pre_softmax_head_mixing():
    skip, x = build("skip_right", H=4), x_input(2)
    heads, width = 4, 8
    with torch.no_grad():
        skip.C1.copy_(torch.randn(heads, heads, dtype=torch.float64))
    q, k, v = (torch.einsum("bnf,fhd->bhnd", x, w.reshape(width, heads, -1)) for w in (skip.WQ, skip.WK, skip.WV))
    scores = torch.einsum("bhnd,bhmd->bhnm", q, k)
    mixed = torch.einsum("gh,bhnm->bgnm", skip.C1, scores) / math.sqrt(width)
    out = torch.einsum("bgnm,bgmd,gdf->bnf", mixed.softmax(-1), v, skip.WO.reshape(heads, -1, width))
    assert torch.allclose(skip(x), out, atol=TOL, rtol=0)


def test_p12_official_linear_on_the_score_tensor_equals_the_core_contraction():
    r, n, m = 6, 4, 5
    q, k, c = (
        torch.randn(n, r, dtype=torch.float64),
        torch.randn(m, r, dtype=torch.float64),
        torch.randn(r, r, dtype=torch.float64),
    )
    linear = torch.nn.functional.linear(torch.einsum("nr,mr->nmr", q, k), c)
    assert torch.allclose(linear.permute(2, 0, 1), torch.einsum("rs,ns,ms->rnm", c, q, k), atol=TOL)


def test_p16_thsa_output_rank_is_bounded():
    out = build("thsa", F=8)(x_input(n=12))
    assert torch.linalg.matrix_rank(out) <= min(12, 8, 8)


def test_p17_skip_left_and_skip_right_at_init_equal_mhsa():
    mhsa = build("mhsa", H=4)
    x = x_input(2)
    for name in ("skip_left", "skip_right", "kronecker"):
        variant = build(name, H=4)
        with torch.no_grad():
            for w in ("WQ", "WK", "WV"):
                getattr(variant, w).copy_(getattr(mhsa, w).reshape(8, 8))
            variant.WO.copy_(mhsa.WO.reshape(8, 8))
        assert torch.allclose(variant(x), mhsa(x), atol=TOL, rtol=0), name


def test_p17_thsa_with_a_kronecker_core_equals_the_kronecker_design():
    kron, thsa, x = build("kronecker", H=4), build("thsa", H=4), x_input(2)
    with torch.no_grad():
        kron.C1.copy_(torch.randn(4, 4, dtype=torch.float64))
        for w in ("WQ", "WK", "WV", "WO"):
            getattr(thsa, w).copy_(getattr(kron, w))
        thsa.C.copy_(core_matrix(kron))
    assert torch.allclose(thsa(x), kron(x), atol=TOL, rtol=0)


def test_p18_declaring_the_input_transposed_gives_the_same_output(write_td):
    text = (DESIGNS / "mhsa.td").read_text().replace("input X[n: N, f: F]", "input X[f: F, n: N]")
    text = text.replace("X[n f]", "X[f n]").replace("X[m f]", "X[f m]")
    transposed = tdiag.load(write_td(text, "mhsa.td"), **SMALL).module(dtype=torch.float64, N=5)
    mhsa, x = build("mhsa"), x_input(2)
    transposed.load_state_dict(mhsa.state_dict())
    assert torch.allclose(transposed(x.transpose(-1, -2)), mhsa(x), atol=TOL, rtol=0)


# ---- costs (spec tuformer.md §3.5, P13, P14) -------------------------------------------------


def symbols(names: str):
    return sympy.symbols(names, positive=True)


def test_mhsa_flops_are_twice_the_spec_multiply_adds():
    F_, H, D, N = symbols("F H D N")
    R = H * D
    macs = 2 * F_ * R * (N + N) + N * N * R + N * N * R  # projections, scores, AV (N = M)
    assert sympy.simplify(tdiag.load(DESIGNS / "mhsa.td").cost().flops - 2 * macs) == 0


def test_thsa_flops_are_the_spec_formula_with_the_smaller_first_pairwise_step():
    F_, N, R = symbols("F N R")
    flops = tdiag.load(DESIGNS / "thsa.td").cost(N=1024).flops
    macs = 2 * F_ * R * 2 * N + N * N * R**2 + N * N * R
    outer = N * R**2  # C·Q first (N·R² < N·M·R at N > R), a product that sums nothing: 1 multiply each
    assert sympy.simplify(flops - 2 * macs - outer) == 0


def test_p14_thsa_box_holds_d_times_the_mhsa_entries():
    thsa, mhsa = (tdiag.load(DESIGNS / f"{n}.td").cost() for n in ("thsa", "mhsa"))
    H, D, R = symbols("H D R")
    ratio = thsa.softmax_entries.subs(R, H * D) / mhsa.softmax_entries
    assert sympy.simplify(ratio - D) == 0


@pytest.mark.parametrize(("name", "entries"), [("skip_right", "H*N**2"), ("single_head", "N**2")])
def test_structured_cores_never_materialize_an_r_n_m_score_tensor(name, entries):
    """Spec §3.4: skip-right's and single-head's boxes are constant along d (resp. r)."""
    report = tdiag.load(DESIGNS / f"{name}.td").cost()
    H, N = symbols("H N")
    assert sympy.simplify(report.softmax_entries - sympy.sympify(entries, locals={"H": H, "N": N})) == 0


@pytest.mark.parametrize(
    ("name", "count"),
    [("mhsa", 1_048_576), ("thsa", 1_310_720), ("skip_right", 1_048_640), ("skip_left", 1_048_704),
     ("heads_only", 16_384), ("trainable_heads_only", 16_448)],
)  # fmt: skip
def test_p13_cost_reports_spec_parameter_counts(name, count):
    assert tdiag.load(DESIGNS / f"{name}.td").cost().at(F=512, H=8)["params"] == count


def test_p13_thsa_with_twice_the_rank_has_150_percent_of_mhsa_at_that_rank():
    thsa = tdiag.load(DESIGNS / "thsa.td", R=1024)
    mhsa = tdiag.load(DESIGNS / "mhsa.td", D=128)  # H·D = 1024
    assert thsa.parameter_count() / mhsa.parameter_count() == pytest.approx(1.5)


# ---- what a training script relies on --------------------------------------------------------


REGROUPED = {
    # grouped-query heads: a computed tensor's head axis h read as (key head g, query head i)
    "computed": """
design regrouped
size F = 8, G = 2, Hg = 2, H = G * Hg, D = 4
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, g: G, d: D]
param WV[f: F, g: G, e: D]
param WO[g: G, i: Hg, e: D, o: F]
E[n h d]   = exp(X[n f] WQ[f h d])
A[g i n m] = softmax[m](E[n (g i) d] X[m f] WK[f g d])
Y[n o]     = A[g i n m] X[m f] WV[f g e] WO[g i e o]
output Y
""",
    # the same with a single-use product, which is otherwise folded into its consumer
    "inlined": """
design regrouped
size F = 8, G = 2, Hg = 2, H = G * Hg, D = 4
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D]
param WK[f: F, g: G, d: D]
param WV[f: F, g: G, e: D]
param WO[g: G, i: Hg, e: D, o: F]
Q[n h d]   = X[n f] WQ[f h d]
A[g i n m] = softmax[m](Q[n (g i) d] X[m f] WK[f g d])
Y[n o]     = A[g i n m] X[m f] WV[f g e] WO[g i e o]
output Y
""",
    # values constant along a regrouped axis (all of it, and one piece of it)
    "broadcast": """
design regrouped
size F = 8, G = 2, I = 2, H = G * I, C = 3, E = I * C
size N
input X[n: N, f: F]
param w[f: F]
param u[c: C]
param P[g: G, i: I, e: E]
const J[h: H] = ones
S[n h]        = relu(X[n f] w[f]) J[h]
T[n (a c)]    = relu(X[n f] w[f] u[c]) J[a]
Y[n g i e k]  = S[n (g i)] T[n (g e)] P[g i e] X[n k]
output Y
""",
}


@pytest.mark.parametrize("case", sorted(REGROUPED))
def test_computed_tensor_used_with_its_axis_grouped_otherwise_equals_reference(case, write_td):
    design = tdiag.load(write_td(REGROUPED[case]))
    module = design.module(N=5, dtype=torch.float64)
    reference = design.module(dtype=torch.float64, impl="reference")
    reference.load_state_dict(module.state_dict(), strict=False)
    x = x_input(2)
    torch.testing.assert_close(module(x), reference(x), rtol=0, atol=TOL)


def test_state_dict_round_trip():
    a, b = build("fish", seed=1), build("fish", seed=2)
    b.load_state_dict(a.state_dict())
    x = x_input(2)
    assert torch.equal(a.eval()(x), b.eval()(x))


def test_autocast_bfloat16_runs_close_to_float32():
    design = tdiag.load(DESIGNS / "mhsa.td", F=32, H=4)
    module = design.module(N=16)
    x = torch.randn(2, 16, 32)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        low = module(x)
    assert low.dtype == torch.bfloat16
    assert torch.allclose(low.float(), module(x), atol=5e-2, rtol=5e-2)


def bfloat16_error(design: tdiag.Design, n: int, width: int, seed: int = 1) -> float:
    """‖y_bf16 − y_f32‖ / ‖y_f32‖ of the module under CPU bfloat16 autocast, for a standard
    normal input."""
    module = design.module(N=n, seed=0).eval()
    x = [torch.randn(2, n, width, generator=torch.Generator().manual_seed(seed))] * len(design.graph.inputs)
    with torch.no_grad():
        exact = module(*x)
        with torch.autocast("cpu", dtype=torch.bfloat16):
            low = module(*x)
    return float((low.float() - exact).norm() / exact.norm())


def test_normalize_box_is_computed_in_float32_under_autocast():
    """A ratio of sums of a polynomial kernel, (q·k)² / Σ (q·k)², needs the relative precision of
    small scores that bfloat16 projections do not carry (this case was 4.4% off float32)."""
    design = tdiag.load(DESIGNS / "thsa_poly.td", F=16, H=2).with_causal_mask()
    assert "torch.autocast(X.device.type, enabled=False)" in design.source(N=32)
    assert bfloat16_error(design, n=32, width=16) <= 0.02


def test_softmax_box_stays_under_autocast():
    assert "enabled=False" not in tdiag.load(DESIGNS / "mhsa.td", **SMALL).source(N=8)


def numerics_design(path, causal: bool) -> tdiag.Design:
    """A bundled design at width 32 with 4 heads, plain or causal."""
    sizes = {"F": 32, "H": 4, **({"D": 4} if "mgk" in path.stem or "mlk" in path.stem else {})}
    # Lightning's SRMSNorm over a head of D = 8 entries amplifies bfloat16's rounding of q, k and v
    # (2.8-5%, as much when only the projections of a float32 computation are rounded): D = 16
    sizes |= {"H": 2} if path.stem == "lightning" else {}
    sizes |= {"N": 16} if path.stem == "mgk_softe" else {}
    design = tdiag.load(path, **sizes)
    return design.with_causal_mask() if causal else design


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_design_under_bfloat16_autocast_is_within_two_percent_of_float32(path, causal):
    assert bfloat16_error(numerics_design(path, causal), n=16, width=32) <= 0.02


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_design_is_finite_at_inputs_times_1e4_where_its_formula_is(path, causal):
    """Finite wherever the paper's formula (the reference evaluator, float64) is; plain Performer,
    whose formula overflows there, is finite too (its shifts, stabilize.py)."""
    design = numerics_design(path, causal)
    module = design.module(N=16, seed=0).eval()
    reference = design.module(N=16, seed=0, impl="reference", dtype=torch.float64).eval()
    x = [1e4 * torch.randn(2, 16, 32, generator=torch.Generator().manual_seed(1))] * len(design.graph.inputs)
    with torch.no_grad():
        formula_finite = torch.isfinite(reference(*(v.double() for v in x))).all()
        assert torch.isfinite(module(*x)).all() or not formula_finite
        if path.stem == "performer" and not causal:
            assert torch.isfinite(module(*x)).all()


@pytest.mark.slow
@pytest.mark.parametrize(
    ("name", "causal", "objective", "planned"),
    [("mhsa", False, "flops", 5), ("mgk", True, "memory", 5), ("mlk", True, "flops", 64)],
    ids=["mhsa", "mgk-p17-sdpa", "mlk-chunked-prefix"],
)
def test_torch_compile_fullgraph(name, causal, objective, planned):
    design = tdiag.load(DESIGNS / f"{name}.td", **small_sizes(name))
    design = design.with_causal_mask() if causal else design
    module = design.module(N=planned, objective=objective)
    compiled = torch.compile(module, fullgraph=True, backend="eager")
    x = torch.randn(2, 37, 8)
    assert torch.allclose(compiled(x), module(x), atol=1e-6)


DDP_SCRIPT = """
import json, sys, torch, torch.distributed as dist, tdiag
from tdiag.train import leave_process
dist.init_process_group("gloo", init_method="file://" + sys.argv[1], rank=0, world_size=1)
design = tdiag.load(sys.argv[2], **json.loads(sys.argv[3]))
ddp = torch.nn.parallel.DistributedDataParallel(design.module(dtype=torch.float64, seed=0, N=5))
ddp(torch.randn(2, 5, 8, dtype=torch.float64)).square().sum().backward()
print(all(p.grad is not None for p in ddp.module.parameters()))
dist.destroy_process_group()
leave_process(0)  # no interpreter finalization for gloo's threads to hang or abort in
"""


def test_distributed_data_parallel_wraps_a_compiled_module(tmp_path):
    """In a process of its own (as torchrun runs a worker), with a time limit: in-process, gloo's
    threads can hang the process group's destructor once the test has returned (torch 2.13, CPU)."""
    import json
    import subprocess
    import sys

    arguments = [str(tmp_path / "rendezvous"), str(DESIGNS / "thsa.td"), json.dumps(small_sizes("thsa"))]
    done = subprocess.run(
        [sys.executable, "-c", DDP_SCRIPT, *arguments],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip() == "True"


# ---- bad sizes and inputs --------------------------------------------------------------------


def test_input_of_the_wrong_width_names_the_leg_and_sizes():
    with pytest.raises(ValueError, match=r"input X: leg f has size F = 8, got 7"):
        build("mhsa")(torch.randn(2, 5, 7, dtype=torch.float64))


def test_input_without_enough_axes_is_explained():
    with pytest.raises(ValueError, match=r"input X needs 2 trailing axes \(n f\)"):
        build("mhsa")(torch.randn(8, dtype=torch.float64))


@pytest.mark.parametrize("impl", ["compiled", "reference"])
def test_an_integer_input_is_refused_by_name(impl):
    module = tdiag.load(DESIGNS / "mhsa.td", F=8, H=2).module(impl=impl)
    with pytest.raises(TypeError, match=r"input X must be a floating-point tensor, got torch.int64"):
        module(torch.ones(2, 5, 8, dtype=torch.long))


@pytest.mark.parametrize("impl", ["compiled", "reference"])
def test_an_empty_sequence_is_refused_naming_the_leg(impl):
    module = tdiag.load(DESIGNS / "mhsa.td", F=8, H=2).module(impl=impl)
    with pytest.raises(ValueError, match=r"input X: leg n \(size N\) has no entries"):
        module(torch.ones(2, 0, 8))


@pytest.mark.parametrize("impl", ["compiled", "reference"])
@pytest.mark.parametrize("dtype", [torch.int32, torch.uint8, torch.float64])
def test_a_mask_that_is_not_bool_is_refused_by_name(impl, dtype):
    # the compiled module hid entries with `~pad`: on an int mask that flips bits, hiding every key
    module = tdiag.load(DESIGNS / "cross_attention.td", F=8, H=2).module(impl=impl, dtype=torch.float64)
    x, z = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 4, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=rf"mask pad must be a bool tensor \(True = attend\), got {dtype}"):
        module(x, z, pad=torch.ones(2, 4, dtype=dtype))


@pytest.mark.parametrize("impl", ["compiled", "reference"])
def test_a_mask_of_the_wrong_length_names_the_leg_and_sizes(impl):
    module = tdiag.load(DESIGNS / "cross_attention.td", F=8, H=2).module(impl=impl, dtype=torch.float64)
    x, z = torch.randn(2, 3, 8, dtype=torch.float64), torch.randn(2, 4, 8, dtype=torch.float64)
    with pytest.raises(ValueError, match=r"mask pad: leg m has size M = 4, got 5"):
        module(x, z, pad=torch.ones(2, 5, dtype=torch.bool))


@pytest.mark.parametrize("impl", ["compiled", "reference"])
@pytest.mark.parametrize("batch", [(3,), ()])
def test_a_scalar_input_keeps_its_batch_dims(impl, batch):
    # `input s[]` has no trailing axes: its batch dims were read as s.shape[:-0], which is empty
    module = tdiag.loads("design scalar\ninput s[]\nY[] = 2 s[] + exp(s[])\noutput Y\n").module(impl=impl)
    s = torch.randn(batch, dtype=torch.float64)
    torch.testing.assert_close(module(s), 2 * s + s.exp(), rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("impl", ["compiled", "reference"])
def test_a_scalar_mask_hides_whole_sequences(impl):
    # `mask p[]`, one flag per batch element: the generated code read torch.ones(B, , ...)
    text = "design flag\nsize F = 3\nsize N\ninput X[n: N, f: F]\nmask p[]\nY[n f] = X[n f] p[]\noutput Y\n"
    module = tdiag.loads(text).module(impl=impl, dtype=torch.float64)
    x, p = torch.randn(2, 4, 3, dtype=torch.float64), torch.tensor([True, False])
    torch.testing.assert_close(module(x, p=p), x * p[:, None, None], rtol=0, atol=0)
    torch.testing.assert_close(module(x), x, rtol=0, atol=0)


@pytest.mark.parametrize("given", [[[1.0] * 8], "X", None], ids=["list", "str", "None"])
def test_an_input_that_is_not_a_tensor_is_refused_by_name(given):
    module = tdiag.load(DESIGNS / "mhsa.td", F=8, H=2).module()
    with pytest.raises(TypeError, match=r"input X must be a torch.Tensor, got (list|str|NoneType)"):
        module(given)


def test_an_input_of_another_dtype_than_the_parameters_is_refused_naming_both():
    module = tdiag.load(DESIGNS / "mhsa.td", F=8, H=2).module()
    with pytest.raises(TypeError, match=r"input X is torch.float64 but param WQ is torch.float32"):
        module(torch.randn(2, 5, 8, dtype=torch.float64))


def test_an_input_on_another_device_than_the_parameters_is_refused_naming_both():
    module = tdiag.load(DESIGNS / "mhsa.td", F=8, H=2).module()
    with pytest.raises(ValueError, match=r"input X is on meta but param WQ is on cpu"):
        module(torch.randn(2, 5, 8, device="meta"))


def test_inputs_whose_batch_axes_do_not_broadcast_are_refused_naming_the_input():
    module = tdiag.load(DESIGNS / "cross_attention.td", F=8, H=2).module()
    with pytest.raises(ValueError, match=r"input Z: batch axes \(3,\) do not broadcast with the inputs' \(2,\)"):
        module(torch.randn(2, 5, 8), torch.randn(3, 7, 8))


MASK_MISTAKES = [  # the mask, the error and its message
    (
        "short",
        torch.ones(2, 6, dtype=torch.bool),
        ValueError,
        r"mask pad: leg m has size M = 7, got 6",
    ),
    ("scalar", torch.tensor(True), ValueError, r"mask pad needs 1 trailing axes \(m\), got shape \(\)"),
    ("float", torch.ones(2, 7), ValueError, r"mask pad must be a bool tensor \(True = attend\), got torch.float32"),
    (
        "int",
        torch.ones(2, 7, dtype=torch.long),
        ValueError,
        r"mask pad must be a bool tensor \(True = attend\), got torch.int64",
    ),
    ("list", [True] * 7, TypeError, r"mask pad must be a torch.Tensor of booleans \(True = attend\), got list"),
    (
        "batch",
        torch.ones(3, 7, dtype=torch.bool),
        ValueError,
        r"mask pad: batch axes \(3,\) do not broadcast with the inputs' \(2,\)",
    ),
    (
        "device",
        torch.ones(2, 7, dtype=torch.bool, device="meta"),
        ValueError,
        r"mask pad is on meta but the inputs are on cpu",
    ),
]


@pytest.mark.parametrize(
    ("pad", "error", "message"), [case[1:] for case in MASK_MISTAKES], ids=[c[0] for c in MASK_MISTAKES]
)
def test_a_mask_of_the_wrong_length_dtype_batch_or_device_is_refused_by_name(pad, error, message):
    module = tdiag.load(DESIGNS / "cross_attention.td", F=8, H=2).module()
    with pytest.raises(error, match=message):
        module(torch.randn(2, 5, 8), torch.randn(2, 7, 8), pad=pad)


def test_a_mask_broadcast_over_the_batch_is_accepted():
    module = tdiag.load(DESIGNS / "cross_attention.td", F=8, H=2).module()
    X, Z, pad = torch.randn(2, 5, 8), torch.randn(2, 7, 8), torch.tensor([True] * 6 + [False])
    assert torch.equal(module(X, Z, pad=pad), module(X, Z, pad=pad.expand(2, 7)))


def test_the_standalone_file_checks_its_inputs_without_tdiag(tmp_path):
    design = tdiag.load(DESIGNS / "cross_attention.td", F=8, H=2)
    module = standalone_module(design.source(), "cross_attention_checks", tmp_path).CrossAttention()
    with pytest.raises(ValueError, match=r"mask pad must be a bool tensor"):
        module(torch.randn(2, 5, 8), torch.randn(2, 7, 8), pad=torch.ones(2, 7))


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"seed": "a"}, TypeError, r"seed must be a whole number, got 'a'"),
        ({"seed": 1.5}, TypeError, r"seed must be a whole number, got 1.5"),
        (
            {"dtype": "float32"},
            TypeError,
            r"dtype must be a floating-point torch.dtype such as torch.float32, got 'float32'",
        ),
        ({"dtype": torch.int64}, TypeError, r"dtype must be a floating-point torch.dtype"),
        ({"device": "nowhere"}, ValueError, r"device 'nowhere' cannot hold tensors here: "),
    ],
    ids=["seed-str", "seed-float", "dtype-str", "dtype-int", "device-unknown"],
)
def test_module_options_of_the_wrong_kind_are_refused_by_name(options, error, message):
    with pytest.raises(error, match=message):
        tdiag.load(DESIGNS / "mhsa.td", F=8, H=2).module(**options)


def test_width_not_divisible_by_heads_is_a_tdiag_error():
    with pytest.raises(tdiag.TdiagError, match=r"size D = F/H is 512/3"):
        tdiag.load(DESIGNS / "mhsa.td", H=3).module()


def test_buffer_over_a_run_time_size_needs_that_size_when_loaded(tmp_path):
    shutil.copy(DESIGNS / "mgk.td", tmp_path / "mgk.td")
    text = (DESIGNS / "mgk_softe.td").read_text()
    (tmp_path / "mgk_softe.td").write_text(text.replace("size N = 256", "size N"))
    with pytest.raises(tdiag.TdiagError, match="buffer 'pi' has an axis of run-time size N") as error:
        tdiag.load(tmp_path / "mgk_softe.td")
    buffer_line = next(i for i, line in enumerate(text.splitlines(), 1) if "buffer pi[" in line)
    assert error.value.diagnostics[0].spans[0].line == buffer_line
    assert tdiag.load(tmp_path / "mgk_softe.td", N=16, F=8, H=2, D=4).module(impl="reference") is not None


# ---- options ---------------------------------------------------------------------------------


def test_checkpointed_boxes_give_the_same_values_and_gradients():
    design = tdiag.load(DESIGNS / "thsa.td", **SMALL)
    plain = design.module(dtype=torch.float64, N=5)
    # the FLOPs plan materializes the box (the time plan may fuse it into SDPA: nothing to recompute)
    checkpointed = design.module(dtype=torch.float64, N=5, checkpoint_boxes=True, objective="flops")
    assert "torch.utils.checkpoint.checkpoint" in checkpointed.tdiag_source
    x = x_input(2)
    plain(x).square().sum().backward()
    checkpointed(x).square().sum().backward()
    for a, b in zip(plain.parameters(), checkpointed.parameters(), strict=True):
        assert torch.allclose(a.grad, b.grad, atol=TOL, rtol=0)


@pytest.mark.parametrize("name", ["thsa_elu", "mlk", "lfish"])
def test_kernel_designs_are_compiled_in_linear_time_order(name):
    """Spec tuformer §3.3, mgk P12: no N·M term in the plan's FLOPs."""
    report = tdiag.load(DESIGNS / f"{name}.td").cost()
    assert sympy.degree(sympy.expand(report.flops), sympy.Symbol("N", positive=True)) == 1
    assert sympy.Symbol("N", positive=True) not in report.softmax_entries.free_symbols


def test_polynomial_kernel_takes_the_linear_order_only_when_cheaper():
    design = tdiag.load(DESIGNS / "thsa_poly.td")
    assert design.plan(N=8192).lowered == ["normalize box over m evaluated in the linear-time order"]
    assert design.plan(N=64).lowered == []


def test_padding_mask_equals_torch_key_padding_mask(tmp_path):
    text = (DESIGNS / "mhsa.td").read_text().replace("input X[n: N, f: F]", "input X[n: N, f: F]\nmask keep[m: N]")
    text = text.replace("softmax[m, scale = 1 / sqrt(D)]", "softmax[m, scale = 1 / sqrt(D), mask = keep[m]]")
    (tmp_path / "padded.td").write_text(text)
    design = tdiag.load(tmp_path / "padded.td", **SMALL)
    module, mhsa = design.module(dtype=torch.float64, N=5), build("mhsa")
    module.load_state_dict(mhsa.state_dict())
    x = x_input(3)
    keep = torch.tensor([[1, 1, 1, 1, 1], [1, 1, 1, 0, 0], [1, 0, 1, 0, 1]], dtype=torch.bool)
    expected, _ = multihead_attention(mhsa)(x, x, x, key_padding_mask=~keep, need_weights=False)
    assert torch.allclose(module(x, keep=keep), expected, atol=TOL, rtol=0)
    reference = design.module(impl="reference", dtype=torch.float64, N=5)
    reference.load_state_dict(module.state_dict())
    assert torch.allclose(module(x, keep=keep), reference(x, keep=keep), atol=TOL, rtol=0)


def test_p9_a_per_channel_score_bias_changes_nothing(tmp_path):
    shutil.copy(DESIGNS / "thsa.td", tmp_path / "thsa.td")
    (tmp_path / "biased.td").write_text(
        "# Paper: Tuformer eq. 3b with the official c_proj bias (spec P9)\ndesign biased extends thsa\n"
        "param b[r: R] = normal(std = 1)\n"
        "replace A[r n m] = softmax[m, scale = 1 / sqrt(R)](C[r s] Q[n s] K[m s] + b[r])\n"
    )
    biased = tdiag.load(tmp_path / "biased.td", **SMALL).module(dtype=torch.float64, N=5)
    thsa = build("thsa")
    biased.load_state_dict(thsa.state_dict(), strict=False)
    assert torch.allclose(biased(x_input(2)), thsa(x_input(2)), atol=TOL, rtol=0)


def test_p11_skip_left_key_factor_folds_into_the_query_projection():
    skip = build("skip_left", H=4)
    x = x_input(2)
    with torch.no_grad():
        skip.C2.copy_(torch.rand(2, dtype=torch.float64) + 0.5)
        skip.C3.copy_(torch.rand(2, dtype=torch.float64) + 0.5)
        before = skip(x)
        skip.WQ.mul_(skip.C3.repeat(4))  # W^Q columns scaled by tile(c3, H)
        skip.C3.fill_(1.0)
    assert torch.allclose(skip(x), before, atol=TOL, rtol=0)


def test_p15_elu_thsa_linear_order_equals_its_quadratic_evaluation():
    design = tdiag.load(DESIGNS / "thsa_elu.td", **SMALL)
    assert design.plan(N=64).lowered == ["normalize box over m evaluated in the linear-time order"]
    module = design.module(dtype=torch.float64, N=64)
    reference = design.module(impl="reference", dtype=torch.float64, N=64)
    reference.load_state_dict(module.state_dict())
    x = torch.randn(2, 64, 8, dtype=torch.float64)
    assert torch.allclose(module(x), reference(x), atol=TOL, rtol=0)


def test_p15_elu_thsa_with_mhsa_core_is_per_head_linear_attention():
    elu, x, heads = build("thsa_elu", H=4), x_input(2), 4
    with torch.no_grad():
        elu.C.copy_(torch.block_diag(*[torch.ones(2, 2, dtype=torch.float64)] * heads))
    phi = lambda t: functional.elu(t) + 1  # noqa: E731
    q, k = (phi(x @ w).view(2, 5, heads, 2) for w in (elu.WQ, elu.WK))
    v = (x @ elu.WV).view(2, 5, heads, 2)
    kernel = torch.einsum("bnhd,bmhd->bhnm", q, k)
    heads_out = torch.einsum("bhnm,bmhe->bnhe", kernel / (kernel.sum(-1, keepdim=True) + 1e-6), v)
    assert torch.allclose(elu(x), heads_out.reshape(2, 5, 8) @ elu.WO, atol=1e-8, rtol=0)


def test_p15_polynomial_thsa_is_invariant_to_rescaling_the_core():
    poly, x = build("thsa_poly"), x_input(2)
    with torch.no_grad():
        poly.C.mul_(100.0)  # kernel sums far above the normalize box's eps
    before = poly(x)
    with torch.no_grad():
        poly.C.mul_(3.0)
    assert torch.allclose(poly(x), before, atol=1e-8, rtol=0)


def bfloat16_module_error(design: tdiag.Design, n: int, width: int) -> float:
    """Relative error of a module built in bfloat16 (parameters and input, no autocast) against
    the same module in float32, after a forward and a backward pass in bfloat16."""
    exact_module = design.module(N=n, seed=0).eval()
    low_module = design.module(N=n, seed=0, dtype=torch.bfloat16).eval()
    x = [torch.randn(2, n, width, generator=torch.Generator().manual_seed(1))] * len(design.graph.inputs)
    exact = exact_module(*x)
    low = low_module(*(v.bfloat16().requires_grad_() for v in x))
    assert low.dtype == torch.bfloat16
    low.float().square().sum().backward()
    grads = [p.grad for p in low_module.parameters() if p.grad is not None]  # eval: no noise scales
    assert grads and all(g.dtype == torch.bfloat16 and torch.isfinite(g).all() for g in grads)
    return float((low.detach().float() - exact.detach()).norm() / exact.detach().norm())


def test_a_module_built_in_bfloat16_runs_its_normalize_box_in_bfloat16_without_autocast():
    """Causal LFiSH's normalize box reads bfloat16 projections and bfloat16 parameters: outside
    autocast the box keeps the module's dtype (was: float32 operands against bfloat16 weights,
    'expected m1 and m2 to have the same dtype')."""
    assert bfloat16_module_error(numerics_design(DESIGNS / "lfish.td", True), n=16, width=32) <= 0.05


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_design_built_in_bfloat16_runs_forward_and_backward_within_five_percent_of_float32(path, causal):
    assert bfloat16_module_error(numerics_design(path, causal), n=16, width=32) <= 0.05
