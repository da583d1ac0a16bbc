"""A map of the scores on the FlexAttention path (issue 24): `softmax[m](c tanh(S / c))`, Gemma 2's
logit softcapping with the query·key product inside the map, is lowered by `attention="flex"`
into the kernel's score_mod (tdiag/plan/score_maps.py), costed per entry, and equals the
materialized box in float64 (eager flex, forward only: CPU FlexAttention has no backward). The
CPU default stays the materialized box: SDPA adds nothing but a mask to its scores."""

import pytest
import sympy
import torch

import tdiag
from tdiag.plan.score_maps import MAPPED

F64 = torch.float64
N = 6

SOFTCAP = """
design softcap
size F = 8, H = 2, D = 4
size N
input X[n: N, f: F]
mask pad[m: N]
param WQ[f: F, h: H, d: D] = normal(std = 1)
param WK[f: F, h: H, d: D] = normal(std = 1)
param WV[f: F, h: H, e: D] = normal(std = 1)
param WO[h: H, e: D, g: F] = normal(std = 1)
param B[h: H] = normal(std = 1)
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m, mask = pad[m]](5 tanh(Q[n h d] K[m h d] / sqrt(D) / 5))
Y[n g] = A[h n m] V[m h e] WO[h e g]
output Y
"""

# the map's argument with a relative position term, and a key bias outside the map
WITH_TERMS = SOFTCAP.replace(
    "5 tanh(Q[n h d] K[m h d] / sqrt(D) / 5)",
    "5 tanh((Q[n h d] K[m h d] / sqrt(D) - B[h] abs(index(n) - index(m))) / 5) + K[m h d] WQ[f h d] WO[h d f]",
)


def pair(text: str, causal: bool):
    """(flex module, materialized module) with the same weights."""
    design = tdiag.loads(text)
    design = design.with_causal_mask() if causal else design
    flex = design.module(dtype=F64, N=N, attention="flex")
    materialized = design.module(dtype=F64, N=N)
    materialized.load_state_dict(flex.state_dict())
    return flex, materialized


def x_input() -> torch.Tensor:
    return 3 * torch.randn(2, N, 8, dtype=F64, generator=torch.Generator().manual_seed(4))


@pytest.mark.parametrize("text", [SOFTCAP, WITH_TERMS], ids=["softcap", "with_terms"])
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_flex_applies_the_map_in_score_mod_and_equals_the_materialized_box(text, causal):
    flex, materialized = pair(text, causal)
    assert [c.taken for c in flex.tdiag_plan.choices] == ["flex"]
    assert "torch.tanh" in flex.tdiag_source.split("score_mod=")[1].split("scale=")[0]
    x = x_input()
    with torch.no_grad():
        torch.testing.assert_close(flex(x), materialized(x), rtol=0, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_flex_masks_the_mapped_scores_as_the_materialized_box(causal):
    flex, materialized = pair(SOFTCAP, causal)
    pad = torch.ones(2, N, dtype=torch.bool)
    pad[0, 4:] = False
    pad[1] = False
    x = x_input()
    with torch.no_grad():
        torch.testing.assert_close(flex(x, pad=pad), materialized(x, pad=pad), rtol=0, atol=1e-10)


def test_the_cpu_default_stays_materialized():
    (choice,) = tdiag.loads(SOFTCAP).plan(N=64).choices
    assert choice.taken == "materialized"


def test_the_sdpa_forms_refuse_a_map_of_the_scores_under_flex():
    (choice,) = tdiag.loads(SOFTCAP).plan(N=64, attention="flex").choices
    reasons = {c.form: c.refusal for c in choice.candidates}
    assert reasons["sdpa"] == reasons["sdpa_grouped"] == MAPPED


def test_the_map_is_costed_per_entry_of_the_scores():
    """5 · tanh(score): two operations per entry of the scores, in the flex step's elementwise."""
    plan = tdiag.loads(SOFTCAP.replace(", mask = pad[m]", "")).plan(N=64, attention="flex")
    (step,) = [s for s in plan.steps if s.kind == "flex"]
    assert sympy.simplify(step.elementwise - 2 * step.entries) == 0
