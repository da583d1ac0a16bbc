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
