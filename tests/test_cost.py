"""Cost formulas against the papers' own counts (FiSH App. D, MGK App. B) and the specs'
re-derived forms (spec fishformer.md §4, mgk.md §2), with each documented difference pinned."""

import subprocess
import sys

import pytest
import sympy
from conftest import DESIGNS

import tdiag

N, D, Dx, H, M = sympy.symbols("N D F H M", positive=True)


def paper(name: str, **sizes):
    return tdiag.load(DESIGNS / f"{name}.td", **sizes).cost(convention="paper", N=256)


def same(a: sympy.Expr, b: sympy.Expr) -> bool:
    return sympy.expand(a - b) == 0


# ---- FiSH App. D.1: the attention-score computation -----------------------------------------

F_MHA = N**2 * H * (2 * D - 1) + 2 * N * H * D * (2 * Dx - 1)
F_FISH = (2 * (D + H) * M - H) * N**2 + 2 * N * M * D * (2 * Dx - 1)
DERIVED = {  # spec §4.3, D.1 convention
    "hard_fish": (2 * (D + H) * M - H - M) * N**2 + 2 * N * M * D * (2 * Dx - 1),
    "hard_gfish": (M * (2 * D - 1) + 2 * H * M + 2 * H**2) * N**2 + 2 * N * M * D * (2 * Dx - 1),
    "gfish": (M * (2 * D - 1) + 2 * H * M + 2 * H**2 + M) * N**2 + 2 * N * M * D * (2 * Dx - 1),
}


def test_mhsa_score_flops_are_fish_d1_i():
    assert same(paper("mhsa").score_flops, F_MHA)


def test_fish_score_flops_are_fish_d1_ii():
    assert same(paper("fish").score_flops, F_FISH)


@pytest.mark.parametrize("name", sorted(DERIVED))
def test_fish_variants_score_flops_are_the_spec_derived_forms(name):
    assert same(paper(name).score_flops, DERIVED[name])


def test_mish_is_cheaper_than_the_paper_path_by_folding_the_weights_into_the_queries():
    """Spec T14: p has no local-head leg, so p·Q costs less than mixing M global maps;
    tdiag's plan saves M·N² − (2M − 1) over the spec's MiSH form."""
    spec = (M * (2 * D - 1) + (2 * M - 1) + H) * N**2 + 2 * N * M * D * (2 * Dx - 1)
    assert same(paper("mish").score_flops, spec - M * N**2 + (2 * M - 1))


def test_fish_saving_and_m_equals_h_identities():
    saving = (2 * (H - M) * D - 2 * M * H) * N**2 + 2 * (H - M) * D * (2 * Dx - 1) * N
    assert same(F_MHA - F_FISH, saving)
    assert same(F_FISH.subs(M, H) - F_MHA, 2 * H**2 * N**2)


VECTORS = [  # spec fishformer §4.4: (N, D, D_x, H, M) -> F_MHA, F_FiSH, F_HardFiSH, F_HardGFiSH, F_GFiSH
    ((256, 16, 128, 8, 2), (32_964_608, 9_945_088, 9_814_016, 18_726_912, 18_857_984)),
    ((256, 16, 128, 8, 4), (32_964_608, 20_414_464, 20_152_320, 29_065_216, 29_327_360)),
    ((4, 3, 5, 4, 2), (1_184, 816, 784, 1_360, 1_392)),
]


@pytest.mark.parametrize(("sizes", "counts"), VECTORS)
def test_fish_test_vectors(sizes, counts):
    n, d, dx, h, m = sizes
    for name, value in zip(("mhsa", "fish", "hard_fish", "hard_gfish", "gfish"), counts, strict=True):
        sizes = {"F": dx, "H": h, "D": d} | ({"M": m} if name != "mhsa" else {})
        report = tdiag.load(DESIGNS / f"{name}.td", **sizes).cost(convention="paper", N=n)
        assert report.at(N=n)["score_flops"] == value, name


# ---- MGK App. B: the whole layer -------------------------------------------------------------


def mgk_versions(heads):
    """The spec's three MGK counts for a baseline of `heads` heads (MGK has heads/M)."""
    verbatim_general = N**2 * heads * (2 * (M + 1) * D - 1) / M + N * heads * D * (
        2 * (M + 2) * Dx / M + 2 * heads * D / M - (3 * M + 2) / M
    )
    rederived = (heads / M) * (
        (M + 2) * N * D * (2 * Dx - 1) + M * N**2 * (2 * D - 1) + N * D * (2 * N - 1)
    ) + N * heads * D * (2 * (heads / M) * D - 1)
    return verbatim_general, rederived


def test_mhsa_paper_flops_are_mgk_flops_mha_when_the_output_width_is_h_d():
    flops = paper("mhsa").flops.subs(Dx, H * D)
    assert same(flops, N**2 * H * (4 * D - 1) + N * H * D * (6 * H * D + 2 * H * D - 5))
    general = paper("mhsa").flops - (N**2 * H * (4 * D - 1) + N * H * D * (6 * Dx + 2 * H * D - 5))
    assert same(general, 2 * N * D * H * (Dx - H * D) - N * (Dx - H * D))  # W^O maps to F, not H·D


def test_mgk_paper_flops_are_the_rederived_count_plus_the_prior_additions():
    """App. B excludes mixing; tdiag counts adding log π to each of the H'·M·N² logits."""
    report = tdiag.load(DESIGNS / "mgk.td").cost(convention="paper")
    heads_mgk = H  # the design's H is MGK's H' = H_baseline / M
    _, rederived = mgk_versions(M * heads_mgk)
    assert same(report.flops.subs(Dx, M * heads_mgk * D), rederived.subs(Dx, M * heads_mgk * D) + heads_mgk * M * N**2)


def test_mgk_printed_forms_differ_as_the_spec_documents():
    verbatim_general, rederived = mgk_versions(H)
    verbatim_m2 = N**2 * H * (3 * D - sympy.Rational(1, 2)) + N * H * D * (4 * Dx + H * D - 4)
    assert same(verbatim_general.subs(M, 2), verbatim_m2)
    assert same(rederived.subs(M, 2) - verbatim_m2, N * H * (D - N) / 2)


@pytest.mark.parametrize(
    ("n", "h", "d", "dx", "rederived"), [(256, 8, 16, 128, 45_498_368), (2000, 2, 32, 64, 800_512_000)]
)
def test_mgk_test_vectors(n, h, d, dx, rederived):
    report = tdiag.load(DESIGNS / "mgk.td", F=dx, H=h // 2, D=d, M=2).cost(convention="paper", N=n)
    assert report.at(N=n)["flops"] == rederived + (h // 2) * 2 * n**2


@pytest.mark.parametrize(("h", "d", "dx", "count"), [(8, 16, 128, 40_968), (2, 32, 64, 10_242)])
def test_mgk_parameter_counts_match_app_b(h, d, dx, count):
    """2HDD_x + 0.5(HD)² + H with H'= H/2 heads (rows where D_out = H·D = D_x)."""
    assert tdiag.load(DESIGNS / "mgk.td", F=dx, H=h // 2, D=d, M=2).parameter_count() == count


@pytest.mark.parametrize(("h", "d", "dx", "count"), [(8, 16, 128, 65_536), (2, 32, 64, 16_384)])
def test_mhsa_parameter_counts_match_app_b(h, d, dx, count):
    assert tdiag.load(DESIGNS / "mhsa.td", F=dx, H=h, D=d).parameter_count() == count


# ---- conventions ------------------------------------------------------------------------------


def test_flop_convention_is_twice_the_mac_convention_for_contractions():
    design = tdiag.load(DESIGNS / "thsa.td")
    assert same(design.cost("flop").flops, 2 * design.cost("mac").flops)


def test_mgk_query_norm_is_never_computed():
    """MGK P2: ‖q‖² cancels in the softmax over (j, r); the key norm ‖k‖² stays."""
    plan = tdiag.load(DESIGNS / "mgk.td").plan()
    norms = [s for s in plan.steps if s.kind == "norm"]
    assert len(norms) == 1 and "r" in norms[0].description


# ---- causal boxes: the dense count and what a block-skipping kernel does ---------------------


def attention_step(plan, kind: str = "sdpa"):
    (step,) = [s for s in plan.steps if s.kind == kind]
    return step


def mhsa(**sizes) -> tdiag.Design:
    return tdiag.load(DESIGNS / "mhsa.td", F=256, H=4, **sizes)


def test_causal_sdpa_does_the_triangle_at_the_cpu_kernels_block_of_512_keys():
    """Of N² score entries the CPU flash kernel computes N(N + 512)/2 at N=1024: 0.75 of them
    (its query blocks of 256 rows each visit whole key blocks of 512)."""
    from tdiag.plan.program import BATCH_SIZE, executed_flops

    plan = mhsa().with_causal_mask().plan(N=1024, objective="flops")
    step = attention_step(plan)
    dense, kernel = (
        float(plan.graph.evaluate(f, N=1024).subs(BATCH_SIZE, 1)) for f in (step.flops, executed_flops(step))
    )
    assert kernel / dense == pytest.approx((1024 + 512) / 2048)


def test_causal_kernel_flops_are_three_quarters_of_the_dense_ones_for_mhsa_at_n_1024():
    report = mhsa().with_causal_mask().cost(N=1024).at()
    attention = 2 * 4 * 1024**2 * (64 + 64)
    assert report["flops"] - report["kernel_flops"] == pytest.approx(attention * (1 - 1536 / 2048))


def test_plain_kernel_flops_are_the_dense_ones():
    report = mhsa().cost(N=1024).at()
    assert report["kernel_flops"] == report["flops"]


@pytest.mark.parametrize(("name", "objective"), [("mgk", "memory"), ("alibi", "flops")])
def test_a_causal_mask_given_in_an_attn_mask_skips_nothing(name, objective):
    """With the keys over two legs (MGK's m r) the triangle is a boolean attn_mask; with an additive
    bias (ALiBi) it is in the float attn_mask: the kernel computes every entry of either."""
    plan = tdiag.load(DESIGNS / f"{name}.td").with_causal_mask().plan(N=512, objective=objective)
    step = attention_step(plan)
    assert step.op.mask is not None and step.kernel_flops is None


def test_a_causal_flex_block_mask_does_the_triangle_at_its_block_of_128():
    from tdiag.plan.program import BATCH_SIZE, executed_flops

    plan = mhsa().with_causal_mask().plan(N=1024, attention="flex")
    step = attention_step(plan, "flex")
    dense, kernel = (
        float(plan.graph.evaluate(f, N=1024).subs(BATCH_SIZE, 1)) for f in (step.flops, executed_flops(step))
    )
    assert kernel / dense == pytest.approx((1024 + 128) / 2048)


def test_cost_causal_prints_the_dense_and_the_kernel_flops(capsys):
    from tdiag.cli import main

    assert main(["cost", str(DESIGNS / "mhsa.td"), "--causal", "--at", "N=1024,F=256,H=4"]) == 0
    rows = {line.split()[0]: line.split()[1] for line in capsys.readouterr().out.splitlines()[3:9] if line.strip()}
    assert rows["flops"] == "1,610,612,736" and rows["kernel_flops"] == "1,342,177,280"


def test_cost_of_a_plain_design_prints_no_kernel_flops(capsys):
    from tdiag.cli import main

    assert main(["cost", str(DESIGNS / "mhsa.td"), "--at", "N=1024"]) == 0
    assert "kernel_flops" not in capsys.readouterr().out


def test_cost_causal_imports_no_torch():
    code = (
        "import sys; from tdiag.cli import main; "
        "code = main(['cost', 'mhsa', '--causal', '--at', 'N=1024']); "
        "assert 'torch' not in sys.modules; sys.exit(code)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "kernel_flops" in result.stdout


# ---- the planner's constants named: the chunk C of a chunked causal order, a window's block ----


def symbol_named(expr: sympy.Expr, name: str) -> sympy.Symbol | None:
    return next((s for s in expr.free_symbols if s.name == name), None)


def test_a_chunked_causal_orders_chunk_is_the_symbol_c_in_the_formulas():
    """GLA's flops at the fewest-FLOPs plan: 3·C·D·H per position within the chunks (was 194·D·H)."""
    report = tdiag.load(DESIGNS / "gla.td").cost(N=1024)
    flops = report.formulas()["flops"]
    c, n, d, h = (symbol_named(flops, k) for k in "CNDH")
    assert c is not None and [(k.symbol, k.value) for k in report.constants] == [(c, 64)]
    assert sympy.expand(flops).coeff(c) == 3 * d * h * n + 2 * h * n * symbol_named(flops, "E")


def test_the_legend_says_what_the_chunk_is_and_what_chose_it():
    (line,) = tdiag.load(DESIGNS / "gla.td").cost(N=1024).legend()
    assert line.startswith("C = 64: the chunk of the chunked causal order over n (planner: the largest within 1.1×")


@pytest.mark.parametrize("name", ["gla", "retnet", "mamba2_ssd", "lightning", "mlstm"])
def test_the_named_formulas_at_another_chunk_are_the_plan_that_takes_that_chunk(name):
    """The time objective takes other chunks (C = 8 for GLA, 128 for Lightning): the fewest-FLOPs
    plan's formulas with C set to those are the time plan's executed counts, term by term."""
    design = tdiag.load(DESIGNS / f"{name}.td")
    flops_plan, time_plan = design.cost(N=1024), design.cost(N=1024, objective="time")
    chunks = {a.symbol: sympy.Integer(b.value) for a, b in zip(flops_plan.constants, time_plan.constants, strict=True)}
    assert chunks != flops_plan.constants and len(chunks) == len(time_plan.constants) > 0
    for key in ("flops", "elementwise", "peak_memory"):
        assert same(flops_plan.formulas()[key].xreplace(chunks), time_plan.formulas(named=False)[key]), key


def test_a_design_size_named_c_leaves_the_chunk_another_symbol(tmp_path):
    path = tmp_path / "lightning_c.td"
    path.write_text((DESIGNS / "lightning.td").read_text().replace("size N\n", "size N\nsize C = 3\n"))
    report = tdiag.load(path).cost(N=1024)
    assert [str(k.symbol) for k in report.constants] == ["C_1"]
    assert symbol_named(report.formulas()["flops"], "C_1") is not None


def test_a_banded_window_is_c_plus_w_minus_1_keys_a_block_of_c_queries():
    """Mistral's window(n, m, W): each block of C = 128 queries sees C + W − 1 keys (was 383)."""
    report = tdiag.load(DESIGNS / "mistral.td").cost(N=1024)
    entries = report.formulas()["softmax_entries"]
    g, n, r, c, w = (symbol_named(entries, k) for k in "GNRCW")
    assert same(entries, g * n * r * (c + w - 1))
    assert report.legend()[0].startswith("C = 128: the block of queries of the banded window over m")


def test_a_plan_that_chooses_no_number_has_no_legend_and_its_formulas_as_executed():
    report = mhsa().cost(N=1024)
    assert report.legend() == [] and report.formulas() == report.formulas(named=False)


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", sorted(p.stem for p in DESIGNS.glob("*.td")))
def test_naming_the_planners_constants_keeps_every_number(name, causal):
    design = tdiag.load(DESIGNS / f"{name}.td")
    report = (design.with_causal_mask() if causal else design).cost(N=1024)
    numbers = report.at()
    for key, expr in report.formulas(named=False).items():
        assert numbers[key] == pytest.approx(float(report._number(expr, report.sizes)), rel=1e-12), key


def test_cost_prints_the_chunk_legend_under_the_formulas(capsys):
    from tdiag.cli import main

    assert main(["cost", "gla", "--at", "N=1024"]) == 0
    out = capsys.readouterr().out
    assert "    C = 64: the chunk of the chunked causal order over n (planner" in out
    assert "3*C*D*H" in out and "194*D*H" not in out


def test_cost_json_gives_each_constant_with_its_value_and_meaning(capsys):
    import json

    from tdiag.cli import main

    assert main(["cost", "gla", "--at", "N=1024", "--format", "json"]) == 0
    (entry,) = json.loads(capsys.readouterr().out)
    assert entry["constants"] == [
        {
            "symbol": "C",
            "value": 64,
            "meaning": "the chunk of the chunked causal order over n",
            "chosen_by": "planner: the largest within 1.1× the fewest FLOPs",
        }
    ]
    assert "C" in entry["flops_formula"] and entry["flops"] == 2_425_356_288


def test_causal_sdpa_kernel_flops_name_the_flash_kernels_key_block_k():
    report = mhsa().with_causal_mask().cost(N=1024)
    kernel = report.formulas()["kernel_flops"]
    d, h, n, f, k = (symbol_named(kernel, s) for s in "DHNFK")
    assert same(kernel, 2 * d * h * n * (4 * f + n + sympy.Min(k, n)))
    assert report.legend() == [
        "K = 512: the key block of the CPU flash kernel, at which is_causal skips keys (torch's kernel)"
    ]
    assert report.at()["kernel_flops"] == 1_342_177_280


def test_a_causal_flex_block_mask_names_its_block_k():
    plan = mhsa().with_causal_mask().plan(N=1024, attention="flex")
    report = tdiag.cost.cost_report(plan)
    assert [(str(c.symbol), c.value) for c in report.constants] == [("K", 128)]
    assert symbol_named(report.formulas()["kernel_flops"], "K") is not None


def test_a_flex_attention_counts_the_flops_and_entries_an_sdpa_one_does():
    """A FlexAttention step is the same fused attention: its FLOPs, score FLOPs and box entries
    count (they were left out: 536,870,912 FLOPs, the projections alone)."""
    design = mhsa().with_causal_mask()
    flex, sdpa = (tdiag.cost.cost_report(design.plan(N=1024, attention=a)).at() for a in ("flex", "sdpa"))
    for key in ("flops", "score_flops", "softmax_entries"):
        assert flex[key] == sdpa[key], key
    attention = 2 * 4 * 1024**2 * (64 + 64)
    assert flex["flops"] - flex["kernel_flops"] == pytest.approx(attention * (1 - (1024 + 128) / 2048))
