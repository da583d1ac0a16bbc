"""A layer norm written out (`C = Z − mean[g](Z)`, then `C (mean[g](C ^ 2) + eps) ^ -0.5`, with or
without a weight and a bias over g) is planned as one torch.nn.functional.layer_norm step
(plan/norms.py), equal in float64 to the reference evaluator of the design as written, values and
gradients; what only looks like one is computed as written."""

from __future__ import annotations

import pytest
import torch

import tdiag
from tdiag.plan.program import LayerNorm

F64 = torch.float64

HEAD = """design norm
size F = 6, H = 2, E = 3
size N
input X[n: N, f: F]
param W[f: F, h: H, e: E] = normal(std = 0.5)
param w[h: H, e: E] = normal(std = 1)
param b[h: H, e: E] = normal(std = 1)
param wg[e: E] = normal(std = 1)
O[n h e] = X[n f] W[f h e]
"""

WRITTEN = {
    "plain": """C[n h e] = O[n h e] - mean[h e](O[n h e])
Y[n h e] = C[n h e] (mean[h e](C[n h e] ^ 2) + 1e-5) ^ -0.5
output Y
""",
    "affine": """C[n h e] = O[n h e] - mean[h e](O[n h e])
Y[n h e] = w[h e] C[n h e] (mean[h e](C[n h e] ^ 2) + 1e-5) ^ -0.5 + b[h e]
output Y
""",
    "per head": """C[n h e] = O[n h e] - mean[e](O[n h e])
Y[n h e] = wg[e] C[n h e] (mean[e](C[n h e] ^ 2) + 1e-6) ^ -0.5
output Y
""",
    "centred also read": """C[n h e] = O[n h e] - mean[e](O[n h e])
Y[n h e] = C[n h e] (mean[e](C[n h e] ^ 2) + 1e-6) ^ -0.5 + 2 C[n h e]
output Y
""",
    "renamed legs": """C[n h e] = O[n h e] - mean[e](O[n h e])
Y[a h k] = C[a h k] (mean[k](C[a h k] ^ 2) + 1e-6) ^ -0.5 w[h k]
output Y
""",
}

NOT_A_NORM = {
    "rms norm, not centred": """Y[n h e] = O[n h e] (mean[e](O[n h e] ^ 2) + 1e-6) ^ -0.5
output Y
""",
    "centred over other legs": """C[n h e] = O[n h e] - mean[h e](O[n h e])
Y[n h e] = C[n h e] (mean[e](C[n h e] ^ 2) + 1e-6) ^ -0.5
output Y
""",
    "a different power": """C[n h e] = O[n h e] - mean[e](O[n h e])
Y[n h e] = C[n h e] (mean[e](C[n h e] ^ 2) + 1e-6) ^ -0.25
output Y
""",
    "centred by a sum": """C[n h e] = O[n h e] - O[n h e] / 2
Y[n h e] = C[n h e] (mean[e](C[n h e] ^ 2) + 1e-6) ^ -0.5
output Y
""",
}


def layer_norm_steps(design: tdiag.Design) -> list[LayerNorm]:
    return [step.op for step in design.plan(N=5).steps if isinstance(step.op, LayerNorm)]


def assert_equals_the_reference(design: tdiag.Design) -> None:
    module = design.module(dtype=F64, N=5)
    reference = design.module(dtype=F64, impl="reference")
    reference.load_state_dict(module.state_dict())
    x = torch.randn(2, 5, 6, dtype=F64, generator=torch.Generator().manual_seed(0), requires_grad=True)
    actual, expected = module(x), reference(x)
    torch.testing.assert_close(actual, expected, rtol=0, atol=1e-12)
    grads = [
        torch.autograd.grad(y.square().sum(), [x, *m.parameters()], allow_unused=True)
        for y, m in ((actual, module), (expected, reference))
    ]
    for got, want in zip(*grads, strict=True):
        assert (got is None) == (want is None)
        if got is not None:
            torch.testing.assert_close(got, want, rtol=0, atol=1e-10)


@pytest.mark.parametrize("case", list(WRITTEN))
def test_a_written_out_layer_norm_is_one_layer_norm_step(case):
    assert len(layer_norm_steps(tdiag.loads(HEAD + WRITTEN[case]))) == 1


@pytest.mark.parametrize("case", list(WRITTEN))
def test_the_fused_layer_norm_equals_the_design_as_written(case):
    assert_equals_the_reference(tdiag.loads(HEAD + WRITTEN[case]))


def test_the_weight_and_bias_over_the_normalized_legs_go_into_the_kernel():
    (op,) = layer_norm_steps(tdiag.loads(HEAD + WRITTEN["affine"]))
    assert op.weight is not None and op.bias is not None


def test_a_centred_tensor_read_elsewhere_is_still_computed():
    source = tdiag.loads(HEAD + WRITTEN["centred also read"]).source(N=5)
    assert "layer_norm(" in source and ".mean(dim=3)" in source


@pytest.mark.parametrize("case", list(NOT_A_NORM))
def test_what_only_looks_like_a_layer_norm_is_computed_as_written(case):
    design = tdiag.loads(HEAD + NOT_A_NORM[case])
    assert layer_norm_steps(design) == []
    assert_equals_the_reference(design)


def test_the_fused_layer_norm_passes_gradcheck():
    module = tdiag.loads(HEAD + WRITTEN["affine"]).module(dtype=F64, N=3)
    x = torch.randn(1, 3, 6, dtype=F64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    assert torch.autograd.gradcheck(module, (x,))


@pytest.mark.parametrize("name", ["bert", "retnet", "gla"])
def test_the_bundled_designs_with_a_layer_norm_plan_one_kernel(name):
    assert len(layer_norm_steps(tdiag.load(name))) == 1


def test_show_and_the_reference_keep_the_norm_as_written():
    """Only the planner reads the norm as one step: the design graph keeps every statement."""
    design = tdiag.loads(HEAD + WRITTEN["plain"])
    assert [s.target for s in design.graph.statements] == ["O", "C", "Y"]
