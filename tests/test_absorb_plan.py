"""The training plan chooses between a design as written and its absorbed form (issue 24: "MLA
chooses absorbed or not by cost"): both planned whole, the cheaper by the objective taken, the
design as written on a tie, the choice and both estimates in the plan and its rewrite notes."""

import subprocess
import sys
from pathlib import Path

import pytest

import tdiag
from tdiag.graph.absorb import absorbed, unread_dropped
from tdiag.plan.absorb_choice import ABSORBED, WRITTEN

DESIGNS = Path(__file__).resolve().parent.parent / "designs"

# One small latent D read at every key through per-head keys K and values Vh (MLA's
# up-projections, DeepSeek-V2 eq. 10-11), the keys read by two boxes (differential attention's two
# maps sharing one key): K is read twice, so the planner does not fold it into one reader's product,
# and only the absorbed form contracts the queries with WK and the scores over the latent.
SHARED_KEYS = """
design latent_shared_keys
size F = 16, H = 4, L = 2, C = 16, V = 4
size N
input X[n: N, f: F]
param WQ1[f: F, h: H, c: C] = normal(std = 1 / sqrt(F))
param WQ2[f: F, h: H, c: C] = normal(std = 1 / sqrt(F))
param WD[f: F, l: L] = normal(std = 1 / sqrt(F))
param WK[l: L, h: H, c: C] = normal(std = 1 / sqrt(L))
param WV[l: L, h: H, e: V] = normal(std = 1 / sqrt(L))
param WO[h: H, e: V, g: F] = normal(std = 1 / sqrt(H * V))
Q1[n h c] = X[n f] WQ1[f h c]
Q2[n h c] = X[n f] WQ2[f h c]
D[m l] = X[m f] WD[f l]
K[m h c] = D[m l] WK[l h c]
Vh[m h e] = D[m l] WV[l h e]
A1[h n m] = softmax[m](Q1[n h c] K[m h c])
A2[h n m] = softmax[m](Q2[n h c] K[m h c])
Y[n g] = (A1[h n m] - 0.5 A2[h n m]) Vh[m h e] WO[h e g]
output Y
"""


@pytest.fixture(scope="module")
def mla_plan():
    return tdiag.load(DESIGNS / "deepseek_mla.td").plan(N=64)


@pytest.fixture(scope="module")
def shared():
    return tdiag.loads(SHARED_KEYS)


def test_mla_training_plan_considers_the_absorbed_form_and_keeps_the_design_as_written_on_a_tie(mla_plan):
    assert mla_plan.forms.taken == WRITTEN
    assert set(mla_plan.forms.costs) == {WRITTEN, ABSORBED}
    assert mla_plan.forms.replaced == ("KN", "Vh")
    # the planner folds a map read once into its reader and picks the cheaper order there already
    assert mla_plan.forms.costs[ABSORBED] == mla_plan.forms.costs[WRITTEN]


def test_mla_refusal_note_gives_both_estimates(mla_plan):
    (note,) = [n for n in mla_plan.refused if n.startswith("whole graph")]
    costs = mla_plan.forms.costs
    assert "the absorbed form (KN, Vh replaced by their factors" in note
    assert "refused: it costs the same as (a tie keeps) the design as written, by the time objective" in note
    assert f"{costs[ABSORBED].flops:,} FLOPs against" in note
    assert not any(n.startswith("whole graph") for n in mla_plan.lowered)


def test_absorbed_form_is_taken_where_the_time_model_finds_it_cheaper(shared):
    plan = shared.plan(N=64)
    assert plan.forms.taken == ABSORBED
    assert plan.forms.costs[ABSORBED].time < plan.forms.costs[WRITTEN].time
    assert plan.forms.replaced == ("K", "Vh")
    (note,) = [n for n in plan.lowered if n.startswith("whole graph")]
    assert "absorbed form (K, Vh replaced by their factors in their readers' products) taken, by the time" in note
    assert note.endswith("for the design as written")


@pytest.mark.parametrize("objective", ["flops", "memory"])
def test_absorbed_form_is_taken_by_the_other_objectives_where_they_find_it_cheaper(shared, objective):
    plan = shared.plan(N=64, objective=objective)
    assert plan.forms.taken == ABSORBED
    assert f"taken, by the {objective} objective" in " ".join(plan.lowered)


def test_absorbed_plan_computes_the_latent_and_no_per_head_keys(shared):
    plan = shared.plan(N=64)
    values = {step.out.var for step in plan.steps if step.out is not None}
    assert "D" in values and not {"K", "Vh"} & values


def test_absorbed_plan_keeps_the_design_graph_so_decoding_chooses_its_own_form(shared):
    assert shared.plan(N=64).graph.statements == shared.graph.statements


def test_module_of_an_absorbed_plan_decodes_equal_to_its_causal_forward(shared):
    torch = pytest.importorskip("torch")
    module = shared.with_causal_mask().module(N=12, dtype=torch.float64)
    assert module.tdiag_plan.forms.taken == ABSORBED
    x = torch.randn(1, 12, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    cache = module.new_cache()
    steps = [module(x[:, :5], cache=cache)] + [module(x[:, t : t + 1], cache=cache) for t in range(5, 12)]
    torch.testing.assert_close(torch.cat(steps, 1), module(x), rtol=0, atol=1e-10)
    assert "absorbed form at T = 1 after P = 1023" in repr(cache)


def test_unread_dropped_removes_only_the_statements_the_absorbed_form_no_longer_reads(shared):
    pruned = unread_dropped(absorbed(shared.graph))
    assert [s.target for s in pruned.statements] == [
        s.target for s in shared.graph.statements if s.target not in ("K", "Vh")
    ]
    assert unread_dropped(shared.graph) is shared.graph


def test_a_design_without_an_absorbed_form_is_planned_once():
    plan = tdiag.load(DESIGNS / "mhsa.td").plan(N=64)
    assert plan.forms is None
    assert not any(n.startswith("whole graph") for n in [*plan.lowered, *plan.refused])


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_absorbed_module_equals_the_design_as_written_in_float64_with_gradients(shared, causal):
    torch = pytest.importorskip("torch")
    design = shared.with_causal_mask() if causal else shared
    assert design.plan(N=12).forms.taken == ABSORBED
    compiled = design.module(N=12, dtype=torch.float64)
    written = design.module(N=12, dtype=torch.float64, impl="reference")
    written.load_state_dict(compiled.state_dict())
    x = torch.randn(2, 12, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    xs = [x.clone().requires_grad_(True) for _ in range(2)]
    ys = [compiled(xs[0]), written(xs[1])]
    torch.testing.assert_close(ys[0], ys[1], rtol=0, atol=1e-10)
    weights = torch.randn_like(ys[0])
    for y in ys:
        (y * weights).sum().backward()
    torch.testing.assert_close(xs[0].grad, xs[1].grad, rtol=0, atol=1e-10)
    for name, p in compiled.named_parameters():
        torch.testing.assert_close(p.grad, dict(written.named_parameters())[name].grad, rtol=0, atol=1e-10)


def test_tdiag_plan_prints_the_form_choice_without_importing_torch():
    code = (
        "import sys; from tdiag.cli import main; "
        f"code = main(['plan', {str(DESIGNS / 'deepseek_mla.td')!r}, '--at', 'N=64']); "
        "assert 'torch' not in sys.modules; sys.exit(code)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    refused = result.stdout.split("rewrites refused:")[1]
    assert "whole graph: the absorbed form (KN, Vh replaced by their factors" in refused
