from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DESIGNS = ROOT / "designs"
DESIGN_FILES = sorted(DESIGNS.glob("*.td"))


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
    on: no cached CPU measurement is found, so the planning device is the nominal CPU, unless a
    test sets one (tdiag/device.py `planning_device`). Subprocesses inherit the setting."""
    from tdiag import device

    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("XDG_CACHE_HOME", str(tmp_path_factory.mktemp("cache")))
        for variable in (device.DEVICE_ENV, device.PEAK_FLOPS_ENV, device.BANDWIDTH_ENV, device.OVERHEAD_ENV):
            patch.delenv(variable, raising=False)
        yield
