"""Saving models that hold compiled designs: `torch.save(model)` loads in a fresh process, and
generated code names its design without an absolute path into the installation."""

import copy
import subprocess
import sys

import torch
from conftest import ROOT

import tdiag


def _model():
    torch.manual_seed(0)
    return torch.nn.Sequential(tdiag.load("mhsa", F=32, H=4).module(), torch.nn.LayerNorm(32))


def test_a_saved_model_with_a_compiled_design_loads_in_a_fresh_process(tmp_path):
    model = _model()
    x = torch.randn(2, 5, 32)
    torch.save(model, tmp_path / "model.pt")
    torch.save(x, tmp_path / "x.pt")
    torch.save(model(x).detach(), tmp_path / "y.pt")
    code = (
        "import torch\n"
        f"model = torch.load({str(tmp_path / 'model.pt')!r}, weights_only=False)\n"
        f"x, y = torch.load({str(tmp_path / 'x.pt')!r}), torch.load({str(tmp_path / 'y.pt')!r})\n"
        "assert torch.equal(model(x), y)\n"
        "print('loaded', type(model[0]).__name__)\n"
    )
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "loaded Mhsa"


def test_a_deep_copy_of_a_compiled_module_computes_the_same_and_shares_no_parameter():
    model = _model()
    twin = copy.deepcopy(model)
    x = torch.randn(2, 5, 32)
    assert torch.equal(model(x), twin(x))
    assert all(a is not b for a, b in zip(model.parameters(), twin.parameters(), strict=True))


def test_generated_code_names_a_bundled_design_by_its_place_in_the_package():
    first = tdiag.load("mhsa").source().splitlines()[0]
    assert first == '"""Mhsa: the `mhsa` design compiled by tdiag from designs/mhsa.td.'
    assert str(ROOT) not in tdiag.load(ROOT / "designs" / "alibi.td").source()
