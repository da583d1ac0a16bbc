"""tdiag's CUDA paths, on a machine with a GPU (`pytest -m gpu`; `python -m tdiag.gpu_report` runs
them first): every bundled design compiled on the device equals the CPU float64 result, plain and
causal, within float32 and bfloat16 tolerances; the SDPA lowering runs a fused kernel (flash or
memory-efficient: the math fallback is switched off, so taking it raises); FlexAttention trains;
torch.compile captures a compiled module whole; a bf16 training step is finite; DDP runs over
NCCL. Without CUDA every test here is skipped for that one reason (the CPU suite counts them as
skipped, never failed)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
import torch
from conftest import DESIGN_FILES, ROOT, perturbed

import tdiag

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not torch.cuda.is_available(), reason="no CUDA device: the gpu tests run on a GPU (python -m tdiag.gpu_report)"
    ),
]

WIDTH, HEADS, N = 32, 2, 16
# Relative error ‖y − y64‖ / ‖y64‖ against the CPU float64 result. float32: thsa_elu's causal
# chunked prefix sums reach 4e-4 on the CPU too. bfloat16 is tdiag train's: float32 parameters
# under autocast (rounding at 4e-3 per product); the worst design on the CPU is 1.6e-2 (mgk).
TOLERANCE = {"float32": 1e-3, "bfloat16-autocast": 3e-2}


def _design(path, causal: bool) -> tdiag.Design:
    loaded = tdiag.load(path, F=WIDTH, H=HEADS)
    return loaded.with_causal_mask() if causal else loaded


def _length(design: tdiag.Design) -> int:
    return int(design.size_values.get("N", N))  # a design may fix N (mgk_softe)


def _on_cuda_and_in_float64(design: tdiag.Design):
    """The design compiled on the CPU in float64 (parameters moved off their initial values) and
    on CUDA in float32 with the same parameters, both in eval mode (no training noise)."""
    n = _length(design)
    reference = design.module(N=n, dtype=torch.float64, seed=0).eval()
    perturbed(reference)
    module = design.module(N=n, device="cuda", seed=0).eval()
    module.load_state_dict(reference.state_dict())
    return reference, module


def _relative_error(y: torch.Tensor, reference: torch.Tensor) -> float:
    return float((y.double().cpu() - reference).norm() / reference.norm())


@pytest.mark.parametrize("precision", sorted(TOLERANCE))
@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("path", DESIGN_FILES, ids=lambda p: p.stem)
def test_design_on_cuda_equals_the_cpu_float64_result(path, causal, precision):
    design = _design(path, causal)
    reference, module = _on_cuda_and_in_float64(design)
    x = torch.randn(2, _length(design), WIDTH, dtype=torch.float64, generator=torch.Generator().manual_seed(1))
    inputs = [x] * len(design.graph.inputs)  # a cross-attention's memory: X again
    autocast = precision == "bfloat16-autocast"
    with torch.no_grad():
        expected = reference(*inputs)
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            y = module(*(t.to("cuda", torch.float32) for t in inputs))
    assert y.is_cuda
    assert _relative_error(y, expected) < TOLERANCE[precision]


def _mhsa(causal: bool, dtype: torch.dtype) -> torch.nn.Module:
    design = tdiag.load("mhsa", F=256, H=4)  # head size 64: flash and memory-efficient both take it
    design = design.with_causal_mask() if causal else design
    module = design.module(N=512, dtype=dtype, device="cuda")
    assert any(step.kind == "sdpa" for step in module.tdiag_plan.steps)
    return module


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
@pytest.mark.parametrize("autocast", [False, True], ids=["bfloat16", "float32-under-autocast"])
def test_sdpa_lowering_runs_a_fused_kernel_forward_and_backward(causal, autocast):
    """With only FLASH_ATTENTION and EFFICIENT_ATTENTION allowed, a silent math fallback raises
    'No available kernel'; under autocast (tdiag train's bf16) the parameters stay float32."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    module = _mhsa(causal, torch.float32 if autocast else torch.bfloat16)
    x = torch.randn(2, 512, 256, device="cuda", dtype=torch.float32 if autocast else torch.bfloat16)
    x.requires_grad_()
    with sdpa_kernel([SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION]):
        with torch.autocast("cuda", dtype=torch.bfloat16, enabled=autocast):
            y = module(x)
        y.float().square().mean().backward()
    assert torch.isfinite(x.grad).all() and all(torch.isfinite(p.grad).all() for p in module.parameters())


@pytest.mark.parametrize("causal", [False, True], ids=["plain", "causal"])
def test_flex_attention_lowering_trains_on_cuda_as_the_sdpa_lowering_does(causal):
    """FlexAttention forward and backward (CPU has no flex backward), compiled, in float32,
    against the SDPA lowering of the same design with the same parameters."""
    design = tdiag.load("mhsa", F=64, H=4)  # head size 16
    design = design.with_causal_mask() if causal else design
    flex = design.module(N=128, device="cuda", attention="flex")
    sdpa = design.module(N=128, device="cuda")
    sdpa.load_state_dict(flex.state_dict())
    assert any(step.kind == "flex" for step in flex.tdiag_plan.steps)
    x = torch.randn(2, 128, 64, device="cuda")
    compiled = torch.compile(flex)
    compiled(x).square().mean().backward()
    sdpa(x).square().mean().backward()
    for name, parameter in flex.named_parameters():
        torch.testing.assert_close(parameter.grad, dict(sdpa.named_parameters())[name].grad, rtol=1e-3, atol=1e-4)


@pytest.mark.parametrize("name", ["mhsa", "fish", "mgk", "thsa", "mlk"])
def test_compiled_module_compiles_with_fullgraph_on_cuda(name):
    module = tdiag.load(name, F=WIDTH, H=HEADS).with_causal_mask().module(N=64, device="cuda").eval()
    compiled = torch.compile(module, fullgraph=True)
    x = torch.randn(2, 64, WIDTH, device="cuda")
    with torch.no_grad():
        torch.testing.assert_close(compiled(x), module(x), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("name", ["mhsa", "fish", "mgk", "thsa", "mlk"])
def test_bf16_training_step_is_finite(name):
    """One step of tdiag train's model and loss (bf16 autocast on CUDA) and AdamW's update."""
    from tdiag.train import build_model, loss_of, read_corpus
    from tdiag.train_config import TrainConfig

    config = TrainConfig(design=name, layers=2, width=64, heads=4, context=128, batch=4, device="cuda")
    corpus = read_corpus(config.data, config.context)
    model, _ = build_model(config, corpus.vocab, torch.device("cuda"))
    optimizer = torch.optim.AdamW(model.parameters(), lr=config.lr)
    ids = corpus.train[: 4 * 129].view(4, 129)
    loss = loss_of(model, ids[:, :-1], ids[:, 1:], torch.device("cuda"))
    loss.backward()
    optimizer.step()
    assert torch.isfinite(loss) and all(torch.isfinite(p).all() for p in model.parameters())


def test_ddp_over_nccl_trains_with_one_process(tmp_path):
    """torchrun with one process: tdiag train starts an NCCL process group and wraps the model in DDP."""
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node=1", "-m", "tdiag.train", "mhsa",
               "--steps", "4", "--eval-every", "2", "--eval-batches", "1", "--layers", "1", "--width", "64",
               "--heads", "4", "--context", "64", "--batch", "4", "--device", "cuda", "--no-progress",
               "--out", str(tmp_path / "run")]  # fmt: skip
    result = subprocess.run(command, cwd=ROOT, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stderr[-2000:]
    summary = json.loads((tmp_path / "run" / "summary.json").read_text())
    assert summary["tokens_per_s"] > 0 and summary["final_val_loss"] < summary["unigram_val_loss"] + 1
