"""tdiag as an installed package: the wheel carries the grammar, the bundled designs and the
corpus; bundled designs load by name; the default training corpus is package data."""

import gzip
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest
from conftest import DESIGN_FILES, ROOT

import tdiag
from tdiag.cli import main
from tdiag.resources import bundled_designs, default_corpus
from tdiag.train_config import TrainConfig

SOURCES = ("tdiag", "designs", "grammar", "pyproject.toml", "README.md")


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> Path:
    """A wheel built from a copy of the repository (so no build/ or egg-info lands in it)."""
    tree = tmp_path_factory.mktemp("source")
    for name in SOURCES:
        source = ROOT / name
        if source.is_dir():
            shutil.copytree(source, tree / name, ignore=shutil.ignore_patterns("__pycache__", "*.pyc"))
        else:
            shutil.copy(source, tree / name)
    out = tmp_path_factory.mktemp("dist")
    command = [sys.executable, "-m", "pip", "wheel", str(tree), "--no-deps", "--no-build-isolation", "-q", "-w", out]
    result = subprocess.run(command, capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
    (path,) = out.glob("tdiag-*.whl")
    return path


@pytest.fixture(scope="module")
def unpacked(wheel, tmp_path_factory) -> Path:
    """The wheel's files as pip lays them out in site-packages."""
    site = tmp_path_factory.mktemp("site")
    with zipfile.ZipFile(wheel) as archive:
        archive.extractall(site)
    return site


def wheel_names(wheel: Path) -> set[str]:
    with zipfile.ZipFile(wheel) as archive:
        return set(archive.namelist())


def test_the_wheel_carries_the_grammar(wheel):
    assert "tdiag/grammar/tdiag.lark" in wheel_names(wheel)


def test_the_wheel_carries_every_bundled_design(wheel):
    assert {f"tdiag/designs/{path.name}" for path in DESIGN_FILES} <= wheel_names(wheel)


def test_the_wheel_carries_the_space_grammar_and_the_bundled_spaces(wheel):
    spaces = {f"tdiag/designs/spaces/{path.name}" for path in (ROOT / "designs" / "spaces").glob("*.tds")}
    assert spaces and spaces | {"tdiag/grammar/space.lark"} <= wheel_names(wheel)


def test_the_wheel_carries_the_training_corpus(wheel):
    assert "tdiag/data/shakespeare_gut.txt.gz" in wheel_names(wheel)


def test_the_wheel_carries_every_module_of_the_package(wheel):
    modules = {path.relative_to(ROOT).as_posix() for path in (ROOT / "tdiag").rglob("*.py")}
    assert modules - wheel_names(wheel) == set()


def test_the_wheel_installs_the_tdiag_command(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (entry_points,) = [n for n in archive.namelist() if n.endswith(".dist-info/entry_points.txt")]
        assert "tdiag = tdiag.cli:main" in archive.read(entry_points).decode()


def test_the_wheel_requires_a_torch_range_not_one_version(wheel):
    with zipfile.ZipFile(wheel) as archive:
        (metadata,) = [n for n in archive.namelist() if n.endswith(".dist-info/METADATA")]
        requires = [line for line in archive.read(metadata).decode().splitlines() if line.startswith("Requires-Dist")]
    (torch,) = [line for line in requires if line.split()[1].startswith("torch")]
    assert "==" not in torch and ">=" in torch


def run_installed(site: Path, cwd: Path, *code: str) -> subprocess.CompletedProcess:
    """Python code run away from the repository, with the unpacked wheel as the only tdiag."""
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"} | {"PYTHONPATH": str(site)}
    return subprocess.run(
        [sys.executable, "-c", "\n".join(code)], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def test_an_installed_package_checks_a_bundled_design_by_name_from_any_folder(unpacked, tmp_path):
    result = run_installed(
        unpacked,
        tmp_path,
        "import tdiag, tdiag.cli",
        f"assert tdiag.__file__.startswith({str(unpacked)!r}), tdiag.__file__",
        "raise SystemExit(tdiag.cli.main(['check', 'fish', 'mhsa']))",
    )
    assert result.returncode == 0, result.stderr
    assert "fish: ok (" in result.stdout and "mhsa: ok (" in result.stdout and "fish: fish" not in result.stdout


def test_an_installed_bundled_design_extends_its_installed_base(unpacked, tmp_path):
    result = run_installed(unpacked, tmp_path, "import tdiag", "print(tdiag.load('mgk_softe').graph.base)")
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "mgk"


def test_a_bundled_design_loads_by_name():
    assert tdiag.load("fish").name == "fish"


def test_a_bundled_design_loads_by_file_name():
    assert tdiag.load("mgk.td").name == "mgk"


def test_sizes_apply_to_a_bundled_design_loaded_by_name():
    assert tdiag.load("mhsa", F=64, H=4).size_values["D"] == 16


def test_bundled_designs_are_the_files_of_designs():
    assert bundled_designs() == [path.stem for path in DESIGN_FILES]


def test_a_file_in_the_working_folder_wins_over_a_bundled_design(tmp_path, monkeypatch):
    (tmp_path / "fish").write_text("design mine\nsize N, F = 4\ninput X[n: N, f: F]\noutput X\n", encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    assert tdiag.load("fish").name == "mine"


def test_an_unknown_design_name_is_told_the_closest_bundled_one(capsys):
    code = main(["check", "fsh"])
    err = capsys.readouterr().err
    assert code == 1 and "no such design file 'fsh'" in err
    assert "did you mean 'fish'? `tdiag list` names the" in err and "gfish" not in err


def test_a_path_in_a_folder_is_never_read_as_a_bundled_design(tmp_path, capsys):
    code = main(["check", str(tmp_path / "fish")])
    assert code == 1 and f"no such design file '{tmp_path / 'fish'}'" in capsys.readouterr().err


def test_the_default_training_corpus_is_package_data():
    corpus = Path(TrainConfig(design="fish").data)
    assert corpus == default_corpus()
    assert corpus.is_relative_to(Path(tdiag.__file__).parent) and corpus.is_file()


def test_the_default_training_corpus_is_gzipped_utf8_shakespeare():
    text = gzip.decompress(default_corpus().read_bytes()).decode("utf-8")
    assert len(text) > 1_000_000 and "To be, or not to be" in text


@pytest.mark.parametrize("name", ["plain.txt", "packed.txt.gz", "packed.bin"])
def test_a_corpus_is_read_whether_or_not_it_is_gzipped_whatever_its_name(tmp_path, name):
    from tdiag.train import read_corpus

    text = "All the world's a stage, and all the men and women merely players.\n" * 20
    path = tmp_path / name
    path.write_bytes(gzip.compress(text.encode()) if "packed" in name else text.encode())
    corpus = read_corpus(str(path), context=8)
    assert "".join(corpus.chars[i] for i in corpus.train[:10]) == text[:10]


def test_the_example_script_defaults_to_the_bundled_corpus():
    import importlib.util

    spec = importlib.util.spec_from_file_location("train_shakespeare", ROOT / "examples" / "train_shakespeare.py")
    example = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(example)
    assert example.default_data() == default_corpus()


def test_no_code_reads_data_from_outside_the_repository():
    files = [*(ROOT / "tdiag").rglob("*.py"), *(ROOT / "examples").glob("*.py")]
    assert [f.name for f in files if '"shared"' in f.read_text(encoding="utf-8")] == []


def test_every_package_of_tdiag_is_listed_for_the_wheel():
    """pyproject.toml names the packages one by one, so a new one (tdiag/constructs) left out
    would be missing from an installed tdiag, which then fails at `import tdiag`."""
    import tomllib

    listed = set(tomllib.loads((ROOT / "pyproject.toml").read_text())["tool"]["setuptools"]["packages"])
    found = {".".join(p.parent.relative_to(ROOT).parts) for p in (ROOT / "tdiag").rglob("__init__.py")}
    assert found <= listed, sorted(found - listed)
