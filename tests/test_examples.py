"""The example notebook runs top to bottom against this checkout (issue 12), so it cannot rot."""

import pytest
from conftest import ROOT

nbformat = pytest.importorskip("nbformat", reason="the dev extra installs nbformat")
nbclient = pytest.importorskip("nbclient", reason="the dev extra installs nbclient")
pytest.importorskip("ipykernel", reason="the dev extra installs ipykernel")

NOTEBOOK = ROOT / "examples" / "quickstart.ipynb"


@pytest.fixture(scope="module")
def executed():
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", str(ROOT))  # the kernel imports this checkout's tdiag
        notebook = nbformat.read(NOTEBOOK, as_version=4)
        nbclient.NotebookClient(notebook, timeout=300, resources={"metadata": {"path": str(NOTEBOOK.parent)}}).execute()
    return notebook


def _outputs(notebook, marker: str) -> list[dict]:
    cell = next(c for c in notebook.cells if c.cell_type == "code" and marker in c.source)
    return cell.outputs


def test_quickstart_notebook_is_committed_without_outputs():
    notebook = nbformat.read(NOTEBOOK, as_version=4)
    assert all(not c.get("outputs") for c in notebook.cells if c.cell_type == "code")


def test_quickstart_notebook_runs_without_errors(executed):
    errors = [o for c in executed.cells if c.cell_type == "code" for o in c.outputs if o.output_type == "error"]
    assert not errors, errors


def test_quickstart_shows_the_design_cost_and_plan_as_tables(executed):
    for marker in ("\ndesign", "\ncost", "\nplan"):
        (display,) = _outputs(executed, marker)
        assert "<table>" in display["data"]["text/html"]


def test_quickstart_lists_the_compiled_parameters_and_runs_a_forward_pass(executed):
    (module,) = _outputs(executed, "module = design.module")
    assert "param WQ[f h d]: (64, 4, 16)" in module["data"]["text/plain"]
    (shape,) = _outputs(executed, "y = module(x)")
    assert shape["data"]["text/plain"] == "torch.Size([2, 256, 64])"
    (agrees,) = _outputs(executed, "reference")
    assert agrees["data"]["text/plain"] == "True"
