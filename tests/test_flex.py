"""The FlexAttention lowering (`attention="flex"`, issue 13): each softmax box SDPA could take
becomes one flex_attention call whose score_mod computes the additive terms of the scores per
(batch, head, query, key) and whose block mask holds the causal and padding masks.

With torch 2.13 on CPU FlexAttention runs forward only (no backward) and compiles float32,
float16 and bfloat16 only; its eager path takes float64. So equality with the papers' equations
is checked in float64 without gradient, and torch.compile(fullgraph=True) in float32."""

from __future__ import annotations

import subprocess
import sys

import pytest
import torch
from conftest import DESIGN_FILES, perturbed, standalone_module, visible
from test_position_designs import PAPERS, N, cross_attention, design, x_input

import tdiag
from tdiag.plan import BATCH_SIZE

F64 = torch.float64


def flex_module(name: str, causal: bool = False, **sizes: int) -> torch.nn.Module:
    return design(name, causal).module(N=N, dtype=F64, attention="flex", **sizes)


def flex_steps(plan) -> list:
    return [step for step in plan.steps if step.kind == "flex"]


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", sorted(PAPERS))
def test_flex_lowering_equals_the_papers_equation(name, causal):
    module = flex_module(name, causal)
    assert len(flex_steps(module.tdiag_plan)) == 1
    params = perturbed(module)
    x = x_input(2, n=7)
    with torch.no_grad():
        torch.testing.assert_close(module(x), PAPERS[name](params, x, visible(7, causal)), rtol=0, atol=1e-10)


@pytest.mark.parametrize("name", ["alibi", "relative_bias"])
def test_flex_score_mod_builds_no_bias_over_queries_and_keys(name):
    plan = design(name, True).plan(N=64, attention="flex")
    over_both = [step for step in plan.steps if step.out is not None and {"n", "m"} <= set(step.out.legs)]
    assert over_both == []
    assert "score_mod" in flex_steps(plan)[0].description


def test_flex_reads_a_stored_absolute_table_in_place():
    plan = design("absolute_bias").plan(N=8, attention="flex")
    (step,) = flex_steps(plan)
    assert any(value.var.startswith("Bias") for value in step.op.tensors)


def test_flex_padding_mask_equals_the_papers_cross_attention():
    module = design("cross_attention").module(N=N, M=7, dtype=F64, attention="flex")
    assert "padding mask in score_mod" in module.tdiag_plan.lowered[0]
    params = perturbed(module)
    x, z = x_input(2), x_input(2, n=7, seed=3)
    pad = torch.ones(2, 7, dtype=torch.bool)
    pad[0, 5:] = False
    pad[1, 3:] = False
    with torch.no_grad():
        torch.testing.assert_close(module(x, z, pad=pad), cross_attention(params, x, z, pad), rtol=0, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_flex_row_whose_keys_are_all_masked_averages_the_values_as_the_box_does(causal):
    """docs/language.md: a masked logit is the lowest finite number, so a query that sees no key
    averages all values; a block mask would drop such a row to zero."""
    loaded = design("cross_attention", causal)
    module = loaded.module(N=N, M=N, dtype=F64, attention="flex")
    perturbed(module)
    reference = loaded.module(N=N, M=N, dtype=F64, impl="reference")
    reference.load_state_dict(module.state_dict())
    x, z = x_input(2), x_input(2, seed=3)
    pad = torch.ones(2, N, dtype=torch.bool)
    pad[0] = False  # no key at all
    pad[1, 0] = False  # under the causal mask, the first query sees nothing
    with torch.no_grad():
        torch.testing.assert_close(module(x, z, pad=pad), reference(x, z, pad=pad), rtol=0, atol=1e-10)


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", ["grouped_query", "multi_query", "mhsa", "single_head", "talking_heads"])
def test_flex_lowering_equals_the_reference_evaluator(name, causal):
    loaded = tdiag.load(name, F=16, H=4)
    assert_flex_equals_reference(loaded.with_causal_mask() if causal else loaded, width=16)


def assert_flex_equals_reference(loaded: tdiag.Design, width: int) -> None:
    """One flex_attention step, equal in float64 to the reference evaluation with the same weights."""
    module = loaded.module(N=6, dtype=F64, attention="flex")
    assert len(flex_steps(module.tdiag_plan)) == 1
    perturbed(module)
    reference = loaded.module(N=6, dtype=F64, impl="reference")
    reference.load_state_dict(module.state_dict())
    x = torch.randn(3, 6, width, dtype=F64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        torch.testing.assert_close(module(x), reference(x), rtol=0, atol=1e-10)


BIAS_MAPS = """
design bias_maps
size F = 8, H = 2, D = F / H
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WK[f: F, h: H, d: D] = normal(std = 1 / sqrt(F))
param WV[f: F, h: H, e: D] = normal(std = 1 / sqrt(F))
param w[h: H] = normal
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A[h n m] = softmax[m](Q[n h d] K[m h d] / sqrt(D) + w[h] tanh(index(m) - index(n)) / (2 + abs(index(n))) - log(N))
Y[n h e] = A[h n m] V[m h e]
output Y
"""


def test_flex_score_mod_evaluates_maps_quotients_and_run_time_sizes(tmp_path):
    path = tmp_path / "bias_maps.td"
    path.write_text(BIAS_MAPS)
    assert_flex_equals_reference(tdiag.load(path), width=8)


def test_flex_refusal_says_why_and_keeps_the_box_correct():
    loaded = tdiag.load("mgk", D=8, N=6)
    plan = loaded.plan(N=6, attention="flex")
    assert flex_steps(plan) == []
    assert any("FlexAttention refused: several key legs m r" in note for note in plan.refused)


def test_standalone_flex_module_equals_the_in_process_module(tmp_path):
    loaded = design("relative_bias", True)
    module = loaded.module(N=N, dtype=F64, attention="flex")
    perturbed(module)
    generated = standalone_module(loaded.source(N=N, attention="flex"), "relative_bias_flex", tmp_path)
    standalone = generated.RelativeBias(dtype=F64)
    standalone.load_state_dict(module.state_dict())
    x = x_input(2)
    with torch.no_grad():
        assert torch.equal(standalone(x), module(x))


def compiled_flex_module(name: str, backend: str) -> tuple[torch.nn.Module, torch.nn.Module]:
    """At head size 16 (torch 2.13's CPU kernel has no choice for head size 8), causal, its
    score_mod reading a parameter (torch 2.13's CPU kernel cannot read a tensor computed in the
    forward, such as ALiBi's slopes: docs/language.md)."""
    module = tdiag.load(name, F=32, H=2).with_causal_mask().module(N=8, attention="flex")
    perturbed(module)
    return module, torch.compile(module, fullgraph=True, backend=backend)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["relative_bias", "mhsa"])
def test_flex_module_traces_as_one_graph_in_float32(name):
    """fullgraph=True: the module's flex call, score_mod and block mask trace without a graph
    break; aot_eager runs the traced graph, so the values are the module's own."""
    module, compiled = compiled_flex_module(name, backend="aot_eager")
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-5, atol=1e-5)


@pytest.mark.slow
@pytest.mark.parametrize("name", ["relative_bias", "mhsa"])
def test_flex_module_compiles_with_inductor_in_float32(name):
    """Inductor builds and runs the fused CPU kernel (head sizes below 16 or a score_mod reading a
    forward tensor raise NoValidChoicesError here). Its values are torch's: torch 2.13's compiled
    CPU flex_attention differs from eager by O(1) on AVX2 CPUs for causal attention with no tdiag
    code in the way (docs/language.md gives the five lines), so equality is checked by the
    aot_eager test above and on CUDA by the GPU report."""
    module, compiled = compiled_flex_module(name, backend="inductor")
    x = torch.randn(2, 8, 32, generator=torch.Generator().manual_seed(1))
    with torch.no_grad():
        assert compiled(x).shape == module(x).shape


def test_plan_command_lists_the_flex_lowering_without_importing_torch():
    code = (
        "import sys; from tdiag.cli import main; "
        "code = main(['plan', 'alibi', '--at', 'N=64', '--attention', 'flex']); "
        "assert 'torch' not in sys.modules; sys.exit(code)"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=False)
    assert result.returncode == 0, result.stderr
    assert "lowered to flex_attention" in result.stdout


def test_unknown_attention_kernel_is_refused():
    with pytest.raises(ValueError, match="attention must be one of sdpa, flex"):
        design("alibi").plan(N=8, attention="flash")


def test_flex_plan_keeps_no_scores_for_backward():
    """What the report says FlexAttention keeps: q, k, v, the output and the log-sum-exp, never
    an H x N x N tensor (measured on CUDA only: CPU has no backward in torch 2.13)."""
    from tdiag.plan.footprint import footprint

    plan = design("alibi", True).plan(N=256, attention="flex")
    saved = footprint(plan)
    sizes = [plan.graph.evaluate(saved.storages[s].numel, N=256).subs(BATCH_SIZE, 1) for s in saved.saved]
    assert max(sizes) < 2 * 256 * 256


def small(path) -> tdiag.Design:
    """A bundled design at small sizes (head size 4, five positions for a fixed length)."""
    graph = tdiag.load(path).graph
    wanted = {"F": 8, "H": 2, "D": 4, "N": 5}
    return tdiag.load(path, **{k: v for k, v in wanted.items() if k in graph.sizes and not graph.sizes[k].is_free})


def inputs_of(design: tdiag.Design, n: int) -> tuple[list[torch.Tensor], dict[str, torch.Tensor]]:
    """Random inputs (positional) and masks (keywords, the first key always visible) for every
    input the design declares, run-time lengths at n."""
    generator = torch.Generator().manual_seed(3)
    lengths = {k: n for k, size in design.graph.sizes.items() if size.is_free}
    positional, masks = [], {}
    for tensor in design.graph.tensors.values():
        if tensor.kind not in ("input", "mask"):
            continue
        shape = [2] + [int(design.graph.evaluate(axis.size, **lengths)) for axis in tensor.axes]
        if tensor.kind == "mask":
            masks[tensor.name] = torch.rand(shape, generator=generator) > 0.3
            masks[tensor.name][..., 0] = True
        else:
            positional.append(torch.randn(shape, dtype=F64, generator=generator))
    return positional, masks


@pytest.mark.slow
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_every_bundled_design_with_flex_requested_equals_the_reference_evaluator(path, causal):
    loaded = small(path)
    loaded = loaded.with_causal_mask() if causal else loaded
    module = loaded.module(N=5, dtype=F64, attention="flex").eval()
    perturbed(module)
    reference = loaded.module(N=5, dtype=F64, impl="reference").eval()
    reference.load_state_dict(module.state_dict())
    positional, masks = inputs_of(loaded, 5)
    with torch.no_grad():
        torch.testing.assert_close(module(*positional, **masks), reference(*positional, **masks), rtol=0, atol=1e-10)
