"""Matrix-vector products through the generated `_matvec` (tdiag/codegen.py, issue 22): a score
tensor times one value per head (Tuformer's head-only and Kronecker cores, heads of width 1) runs
as a row vector times the transposed matrices, its backward as a row vector times the matrices
and the outer product in the matrices' layout, where torch's CPU bmm of a column vector is 3-7x
slower. The module equals the reference evaluator in values and gradients (float64), passes
gradcheck, broadcasts as `@` does, runs under autocast and torch.compile."""

import pytest
import torch
from conftest import gradcheck_parameters, perturbed

import tdiag
from tdiag.measure import saved_for_backward
from tdiag.plan.forms import only_forms
from tdiag.plan.program import Matmul

TOL = 1e-10
N = 6


def design(name: str, causal: bool) -> tdiag.Design:
    loaded = tdiag.load(name, F=8, H=2)
    return loaded.with_causal_mask() if causal else loaded


def matvec_module(name: str, causal: bool, n: int = N, **options):
    """The module of a design planned with its box materialized (a design of its own: a design
    caches its plans), whose value product is then a batch of matrix-vector products."""
    with only_forms("materialized"):
        loaded = design(name, causal)
        module = loaded.module(N=n, **options)
    steps = module.tdiag_plan.steps
    assert any(isinstance(s.op, Matmul) and s.op.matvec for s in steps), "no matrix-vector product"
    return module


def matvec_helper():
    """The generated module's `_matvec`, from the namespace its forward runs in."""
    module = matvec_module("trainable_heads_only", False)
    return type(module).forward.__globals__["_matvec"]


def x_input(batch: int = 2, n: int = N) -> torch.Tensor:
    return torch.randn(batch, n, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("name", ["trainable_heads_only", "kronecker"])
def test_the_module_with_matrix_vector_products_equals_the_reference(name, causal):
    module = matvec_module(name, causal, dtype=torch.float64)
    perturbed(module)
    reference = design(name, causal).module(impl="reference", dtype=torch.float64, N=N)
    reference.load_state_dict(module.state_dict())
    x = x_input()
    assert torch.allclose(module(x), reference(x), atol=TOL, rtol=0)
    module(x).square().sum().backward()
    reference(x).square().sum().backward()
    for (name_, got), (_, want) in zip(module.named_parameters(), reference.named_parameters(), strict=True):
        assert torch.allclose(got.grad, want.grad, atol=1e-9, rtol=0), name_


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_the_module_with_matrix_vector_products_passes_gradcheck(causal):
    module = matvec_module("trainable_heads_only", causal, dtype=torch.float64)
    perturbed(module)
    x = x_input(1, 4).requires_grad_()
    assert gradcheck_parameters(module, (x,))


@pytest.mark.parametrize(
    ("a_shape", "v_shape"),
    [((2, 3, 5, 4), (2, 3, 4, 1)), ((3, 5, 4), (2, 3, 4, 1)), ((2, 1, 5, 4), (1, 3, 4, 1))],
    ids=["same-batch", "matrices-broadcast", "both-broadcast"],
)
def test_matvec_equals_matmul_and_passes_gradcheck_when_batches_broadcast(a_shape, v_shape):
    matvec = matvec_helper()
    generator = torch.Generator().manual_seed(0)
    a = torch.randn(a_shape, dtype=torch.float64, generator=generator, requires_grad=True)
    v = torch.randn(v_shape, dtype=torch.float64, generator=generator, requires_grad=True)
    assert torch.allclose(matvec(a, v), a @ v, atol=TOL, rtol=0)
    assert torch.autograd.gradcheck(matvec, (a, v))


def saved_bytes(run) -> int:
    """Bytes of the tensors autograd keeps for backward while `run` runs (each storage once)."""
    kept = {}

    def pack(tensor):
        kept[tensor.untyped_storage().data_ptr()] = tensor.untyped_storage().nbytes()
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        run()
    return sum(kept.values())


@pytest.mark.parametrize("needs", ["matrices", "vectors", "both"])
def test_matvec_keeps_for_backward_what_matmul_keeps(needs):
    matvec = matvec_helper()
    a = torch.randn(3, 40, 30, requires_grad=needs != "vectors")
    v = torch.randn(3, 30, 1, requires_grad=needs != "matrices")
    assert saved_bytes(lambda: matvec(a, v)) == saved_bytes(lambda: a @ v)


def test_matvec_under_bfloat16_autocast_returns_gradients_in_the_inputs_dtypes():
    matvec = matvec_helper()
    a = torch.rand(2, 16, 16, requires_grad=True)
    v = torch.randn(2, 16, 1, dtype=torch.bfloat16, requires_grad=True)
    with torch.autocast("cpu", dtype=torch.bfloat16):
        y = matvec(a, v)
    y.float().sum().backward()
    assert (a.grad.dtype, v.grad.dtype) == (torch.float32, torch.bfloat16)
    expected = a.detach() @ v.detach().float()
    assert torch.allclose(y.float(), expected, rtol=2e-2, atol=2e-2)


def test_the_module_with_matrix_vector_products_compiles_fullgraph():
    module = matvec_module("trainable_heads_only", True)
    compiled = torch.compile(module, fullgraph=True, backend="aot_eager")
    x = torch.randn(2, N, 8, requires_grad=True)
    torch.testing.assert_close(compiled(x), module(x), rtol=1e-6, atol=1e-6)
    compiled(x).sum().backward()
    assert x.grad is not None and torch.isfinite(x.grad).all()


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_the_report_keeps_what_autograd_keeps_for_the_matrix_vector_product(causal):
    module = matvec_module("trainable_heads_only", causal, n=64, B=1)
    with only_forms("materialized"):
        modelled = design("trainable_heads_only", causal).cost(objective="time", N=64, B=1).saved_bytes_at(B=1, N=64)
    assert modelled == saved_for_backward(module, torch.randn(1, 64, 8)).total_bytes
