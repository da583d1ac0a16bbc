"""A run-time position leg split into blocks by a reshape (`X[(b i) f]` with i of size C, the way
chunked local attention is written, docs/language.md on reshapes): the generated code sizes the
blocks with an integer division (N // C), and a call whose length is not a multiple of the block
is refused at entry with a ValueError naming the reshape, the leg, its size and the block
(tdiag/codegen.py `_split_checks`), not a failed reshape inside the forward."""

import math

import pytest
import torch
from conftest import perturbed, standalone_module

import tdiag

TOL = 1e-10

# Chunked (block-local) causal attention: each block of C positions attends causally within itself.
CHUNKED_LOCAL = """design chunked_local
size F = 8, H = 2, D = 3, C = 4
size N
input X[n: N, f: F]
const one[i: C] = ones
param WQ[f: F, h: H, d: D] = normal(std = 0.3)
param WK[f: F, h: H, d: D] = normal(std = 0.3)
param WV[f: F, h: H, e: D] = normal(std = 0.3)
param WO[h: H, e: D, g: F] = normal(std = 0.3)
Q[b i h d] = one[i] X[(b i) f] WQ[f h d]
K[b j h d] = X[(b j) f] WK[f h d]
V[b j h e] = X[(b j) f] WV[f h e]
A[h b i j] = softmax[j, scale = 1 / sqrt(D), mask = causal(i, j)](Q[b i h d] K[b j h d])
Y[(b i) g] = A[h b i j] V[b j h e] WO[h e g]
output Y
"""


def chunked_local_reference(x, p, block=4):
    """Causal softmax attention within each block of `block` positions, then the output projection."""
    batch, n, features = x.shape
    blocks = x.reshape(batch, n // block, block, features)
    q, k, v = (torch.einsum("bkif,fhd->bkhid", blocks, p[w]) for w in ("WQ", "WK", "WV"))
    scores = torch.einsum("bkhid,bkhjd->bkhij", q, k) / math.sqrt(q.shape[-1])
    hidden = ~torch.ones(block, block, dtype=torch.bool).tril()
    attended = torch.einsum("bkhij,bkhje->bkhie", scores.masked_fill(hidden, float("-inf")).softmax(-1), v)
    return torch.einsum("bkhie,heg->bkig", attended, p["WO"]).reshape(batch, n, -1)


@pytest.fixture(scope="module")
def chunked_local():
    module = tdiag.loads(CHUNKED_LOCAL).module(dtype=torch.float64)
    perturbed(module)
    return module


@pytest.mark.parametrize("n", [4, 8, 12])
def test_chunked_local_attention_over_a_split_position_leg_equals_the_reference(chunked_local, n):
    x = torch.randn(2, n, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(n), requires_grad=True)
    parameters = dict(chunked_local.named_parameters())
    ours, theirs = chunked_local(x), chunked_local_reference(x, parameters)
    assert torch.allclose(ours, theirs, atol=TOL, rtol=0)
    weights = torch.randn(ours.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    wrt = [x, *parameters.values()]
    for a, b in zip(
        torch.autograd.grad((ours * weights).sum(), wrt),
        torch.autograd.grad((theirs * weights).sum(), wrt),
        strict=True,
    ):
        assert torch.allclose(a, b, atol=TOL, rtol=0)


@pytest.mark.parametrize("n", [1, 6, 10])
def test_a_length_not_a_multiple_of_the_block_is_refused_naming_the_leg_and_the_block(chunked_local, n):
    message = rf"X\[\(b i\) f\] on line 10: leg b has size N/C, whole only where N is a multiple of C = 4; got N = {n}$"
    with pytest.raises(ValueError, match=message):
        chunked_local(torch.randn(2, n, 8, dtype=torch.float64))


def test_the_blocks_of_a_run_time_length_are_an_integer_division_in_generated_code():
    source = tdiag.loads(CHUNKED_LOCAL).source()
    assert "N // 4" in source and "N/4" not in source


def test_the_standalone_file_of_a_split_position_leg_checks_the_length_too(tmp_path, chunked_local):
    standalone = standalone_module(tdiag.loads(CHUNKED_LOCAL).source(), "chunked_local_file", tmp_path)
    module = standalone.ChunkedLocal().to(torch.float64)
    module.load_state_dict(chunked_local.state_dict())
    x = torch.randn(3, 8, 8, dtype=torch.float64)
    assert torch.allclose(module(x), chunked_local(x), atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="whole only where N is a multiple of C = 4; got N = 9"):
        module(torch.randn(3, 9, 8, dtype=torch.float64))


def test_plan_and_cost_of_a_split_position_leg_are_linear_in_the_length():
    design = tdiag.loads(CHUNKED_LOCAL)
    assert "softmax" in str(design.plan(N=64))
    entries = [design.cost().at(N=n)["softmax_entries"] for n in (64, 128)]
    assert entries[1] == 2 * entries[0] == 2 * 2 * 64 * 4


HALF_TABLE = """design half_table
size F = 4, L = 64
size N
input X[n: N, f: F]
param P[p: L, f: F] = normal(std = 1)
Y[k f] = P[k: N / 2, f] + mean[q](X[q f])
output Y
"""


def test_a_slice_of_half_the_length_reads_an_integer_count_of_entries():
    module = tdiag.loads(HALF_TABLE).module(dtype=torch.float64)
    x = torch.randn(2, 6, 4, dtype=torch.float64)
    expected = module.P[:3] + x.mean(1, keepdim=True)
    assert torch.allclose(module(x), expected, atol=TOL, rtol=0)
    with pytest.raises(ValueError, match="leg k has size N/2, whole only where N is a multiple of 2; got N = 5"):
        module(torch.randn(2, 5, 4, dtype=torch.float64))


def test_planning_at_a_length_not_a_multiple_of_the_block_is_refused_at_the_leg():
    design = tdiag.loads(CHUNKED_LOCAL)
    message = r"<string>:10:24: error: leg b has size N/C = 5/2 at N=10: not a whole number"
    for build in (lambda: design.plan(N=10), lambda: design.module(N=10)):
        with pytest.raises(tdiag.TdiagError, match=message) as refused:
            build()
        assert "hint: plan at a length that is a multiple of 4" in str(refused.value)


def test_tdiag_plan_and_cost_at_a_length_not_a_multiple_of_the_block_print_the_error(capsys, tmp_path):
    from tdiag.cli import main

    path = tmp_path / "chunked_local.td"
    path.write_text(CHUNKED_LOCAL)
    for command in ("plan", "cost"):
        assert main([command, str(path), "--at", "N=10"]) != 0
        err = capsys.readouterr().err
        assert "leg b has size N/C = 5/2 at N=10: not a whole number" in err and "Traceback" not in err
    assert main(["plan", str(path), "--at", "N=12"]) == 0
