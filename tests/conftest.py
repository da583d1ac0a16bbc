from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DESIGNS = ROOT / "designs"
DESIGN_FILES = sorted(DESIGNS.glob("*.td"))


# A design whose legs l, p and q no declaration or earlier statement binds, and statements in which
# a construct reads such a leg's size before or after the factor that binds it.
ORDER_BASE = (
    "design t\nsize N, P = 2, Q = 3, F = P * Q, H = 2, R = 3, L = 8\ninput X[n: N, f: F]\nparam W[f: F, h: H]\n"
    "param Tab[h: H, i: L, j: L] = normal(std = 1)\nparam Rel[h: H, r: R] = normal(std = 1)\n"
    "param Gp[s: P, t: Q] = normal(std = 1)\nLF[k h] = X[k f] W[f h]\nG[u v] = Gp[u v]\n"
)
# (construct that reads a leg's size, factor that binds it, statement): l, p and q are bound by
# no declaration and no earlier statement
LEG_READERS = {
    "causal factor": ("causal(n, l)", "LF[l h]", "Y[n h] = {} {} X[n f] W[f h]"),
    "index": ("index(l)", "LF[l h]", "Y[n h] = {} {} X[n f] W[f h]"),
    "gather position": ("Rel[h, r = clamp(l - n, -1, 1) + 1]", "LF[l h]", "Y[h n] = {} {} X[n f] W[f h]"),
    "slice": ("causal(n, l)", "Tab[h, n: N, l: N]", "Y[h n] = {} {} X[n f] W[f h]"),
    "reshape": ("X[n (p q)]", "G[p q]", "Y[n p q] = {} {}"),
    "gather in a map": ("exp(Rel[h, r = clamp(l - n, -1, 1) + 1])", "LF[l h]", "Y[h n] = {} {} X[n f] W[f h]"),
    "map mask": ("relu[l, mask = causal(n, l)](LF[l h] X[n f] W[f h])", "LF[l h]", "Y[n h] = {} {}"),
}


def order_variants(construct: str) -> list[str]:
    """The statement of `construct` with its leg reader first, then with its binder first."""
    reader, binder, statement = LEG_READERS[construct]
    return [ORDER_BASE + statement.format(*pair) + "\noutput Y\n" for pair in ((reader, binder), (binder, reader))]


def visible(n: int, causal: bool):
    """Which keys each query may see: all, or m <= n (the causal mask), as an n x n bool tensor."""
    import torch

    return torch.ones(n, n, dtype=torch.bool).tril() if causal else torch.ones(n, n, dtype=torch.bool)


def perturbed(module):
    """The module's parameters moved off their initial values (identities, fills, zeros), so that
    every parameter matters in a comparison with a reference; returns them by name."""
    import torch

    generator = torch.Generator().manual_seed(5)
    with torch.no_grad():
        for parameter in module.parameters():
            parameter.add_(0.3 * torch.randn(parameter.shape, dtype=parameter.dtype, generator=generator))
    return {name: value.detach() for name, value in module.named_parameters()}


def assert_matches(module, reference, n: int = 7, tol: float = 1e-10) -> None:
    """A module of input X[n: N, f: 8] and a reference `reference(x, parameters)` agree in float64
    on values and on the gradients of the input and of every (perturbed) parameter."""
    import torch

    perturbed(module)
    x = torch.randn(2, n, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(1), requires_grad=True)
    ours, theirs = module(x), reference(x, dict(module.named_parameters()))
    assert torch.allclose(ours, theirs, atol=tol, rtol=0)
    weights = torch.randn(ours.shape, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    wrt = [x, *module.parameters()]
    for a, b in zip(
        torch.autograd.grad((ours * weights).sum(), wrt),
        torch.autograd.grad((theirs * weights).sum(), wrt),
        strict=True,
    ):
        assert torch.allclose(a, b, atol=tol, rtol=0)


def gradcheck_parameters(module, inputs: tuple, kwargs: dict | None = None, atol: float = 1e-7) -> bool:
    """torch.autograd.gradcheck of the module's output in its `inputs` and its parameters
    together (float64, eps 1e-6); `kwargs` (masks) are passed as they are."""
    import torch

    names = [name for name, _ in module.named_parameters()]

    def run(*values):
        arguments, parameters = values[: len(inputs)], values[len(inputs) :]
        return torch.func.functional_call(module, dict(zip(names, parameters, strict=True)), arguments, kwargs or {})

    return torch.autograd.gradcheck(run, (*inputs, *module.parameters()), eps=1e-6, atol=atol)


def standalone_module(source: str, stem: str, folder: Path):
    """A generated file imported as a user imports it: written to FOLDER/STEM.py, loaded as module
    `stem` and registered in sys.modules (flex_attention's eager path looks its module up there)."""
    import importlib.util
    import sys

    path = folder / f"{stem}.py"
    path.write_text(source)
    spec = importlib.util.spec_from_file_location(stem, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[stem] = module
    spec.loader.exec_module(module)
    return module


@pytest.fixture
def write_td(tmp_path):
    """Write a .td text to a temporary file and return its path."""

    def write(text: str, name: str = "design.td") -> Path:
        path = tmp_path / name
        path.write_text(text, encoding="utf-8")
        return path

    return write


@pytest.fixture(autouse=True, scope="session")
def nominal_planning_device(tmp_path_factory):
    """Plans for the `time` objective (the default) do not depend on the machine the tests run
    on, nor on a CPU measurement some test caches midway: the planning device's figures are the
    nominal CPU's, given through the environment (tdiag/device.py), unless a test sets its own.
    Subprocesses inherit them."""
    from tdiag import device

    nominal = device.NOMINAL_CPU
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        patch.delenv(device.DEVICE_ENV, raising=False)
        patch.setenv(device.PEAK_FLOPS_ENV, repr(nominal.peak_flops))
        patch.setenv(device.BANDWIDTH_ENV, repr(nominal.bandwidth))
        patch.setenv(device.OVERHEAD_ENV, repr(nominal.overhead))
        yield


@pytest.fixture(autouse=True, scope="session")
def shared_plans_in_the_session(nominal_planning_device):
    """Designs made alike (the same files and sizes, the same variants) share their plans for the
    session (tdiag/shared_plans.py): many tests plan the same bundled design at the same sizes."""
    from tdiag.shared_plans import sharing

    with sharing():
        yield


@pytest.fixture(autouse=True)
def own_plans_where_patched(request):
    """A test that patches (monkeypatch: a planner constant, the environment, the folder) plans
    its designs afresh and shares none of them: what it patched may decide a plan without being
    part of the shared plans' key. A test patching with unittest.mock wraps its planning in
    `sharing(False)` itself."""
    from tdiag.shared_plans import sharing

    if "monkeypatch" not in request.fixturenames:
        yield
        return
    with sharing(False):
        yield


@pytest.fixture
def cpu(monkeypatch, tmp_path):
    """Plan for a CPU of given peak FLOP/s, bandwidth (bytes/s) and per-op overhead (s)."""
    from tdiag import device

    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path))
    monkeypatch.delenv(device.DEVICE_ENV, raising=False)

    def set_figures(peak: float, bandwidth: float, overhead: float) -> None:
        monkeypatch.setenv(device.PEAK_FLOPS_ENV, str(peak))
        monkeypatch.setenv(device.BANDWIDTH_ENV, str(bandwidth))
        monkeypatch.setenv(device.OVERHEAD_ENV, str(overhead))

    return set_figures
