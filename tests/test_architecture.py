"""The layers' import contract (scripts/architecture.py): tdiag's modules import downward only, or
along an edge the allowlist names; every import counts, function-local and TYPE_CHECKING ones too."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent


@pytest.fixture(scope="module")
def architecture():
    """scripts/architecture.py as a module."""
    spec = importlib.util.spec_from_file_location("architecture_script", ROOT / "scripts" / "architecture.py")
    script = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = script  # its dataclasses look their module up there
    spec.loader.exec_module(script)  # type: ignore[union-attr]
    yield script
    del sys.modules[spec.name]


def package(root: Path, files: dict[str, str], allowed: str = "") -> tuple[Path, Path]:
    """A small tdiag package under `root` with the given modules, and an allowlist beside it."""
    for name, text in {"tdiag/__init__.py": "", **files}.items():
        path = root / name
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(textwrap.dedent(text))
    allowlist = root / "allow.txt"
    allowlist.write_text(allowed)
    return root, allowlist


def test_every_import_of_tdiag_goes_down_a_layer_or_is_in_the_allowlist(architecture):
    assert architecture.contract_violations() == []


def test_the_check_command_exits_0_on_this_checkout(architecture, capsys):
    assert architecture.main(["check"]) == 0
    assert "every import goes down" in capsys.readouterr().out


@pytest.mark.parametrize(
    ("text", "kind", "line"),
    [
        ("from .design import Design\n", "top", 1),
        ("def f():\n    from .design import Design\n", "local", 2),
        ("from typing import TYPE_CHECKING\n\nif TYPE_CHECKING:\n    from .design import Design\n", "TYPE_CHECKING", 4),
        ("class C:\n    def f(self):\n        import tdiag.design\n", "local", 3),
    ],
)
def test_an_upward_import_fails_the_check_with_its_line_and_layers(architecture, tmp_path, text, kind, line):
    root, allowlist = package(tmp_path, {"tdiag/errors.py": text, "tdiag/design.py": ""})
    assert architecture.contract_violations(root, allowlist) == [
        f"tdiag.errors -> tdiag.design: line {line} ({kind} import) goes up from core to facade"
    ]
    assert architecture.main(["check", "--root", str(root), "--allow", str(allowlist)]) == 1


def test_an_import_down_a_layer_passes_the_check(architecture, tmp_path):
    root, allowlist = package(tmp_path, {"tdiag/errors.py": "", "tdiag/design.py": "from .errors import x\n"})
    assert architecture.contract_violations(root, allowlist) == []


def test_an_allowed_upward_import_passes_and_a_stale_allowed_one_fails(architecture, tmp_path):
    allowed = "tdiag.errors -> tdiag.design  # moves down\ntdiag.names -> tdiag.design  # gone already\n"
    root, allowlist = package(
        tmp_path,
        {"tdiag/errors.py": "from .design import x\n", "tdiag/names.py": "", "tdiag/design.py": ""},
        allowed,
    )
    assert architecture.contract_violations(root, allowlist) == [
        "allow.txt:2: tdiag.names -> tdiag.design is allowed but no longer an upward import; remove the line"
    ]


def test_an_allowlist_line_without_a_reason_is_an_error_naming_the_line(architecture, tmp_path):
    root, allowlist = package(tmp_path, {"tdiag/errors.py": ""}, "# header\ntdiag.errors -> tdiag.design\n")
    with pytest.raises(architecture.ArchitectureError, match=r"allow.txt:2: expected 'importer -> imported  # why'"):
        architecture.contract_violations(root, allowlist)


def test_a_module_in_no_layer_is_an_error_naming_it(architecture, tmp_path):
    root, allowlist = package(tmp_path, {"tdiag/newstage.py": "from .errors import x\n", "tdiag/errors.py": ""})
    with pytest.raises(architecture.ArchitectureError, match=r"module tdiag\.newstage is in no layer"):
        architecture.contract_violations(root, allowlist)


def test_the_program_ir_importing_the_plan_report_goes_up_within_the_planner(architecture, tmp_path):
    files = {
        "tdiag/plan/__init__.py": "",
        "tdiag/plan/program.py": "def table():\n    from .report import plan_table\n",
        "tdiag/plan/report.py": "from .program import Plan\n",
    }
    root, allowlist = package(tmp_path, files)
    assert architecture.contract_violations(root, allowlist) == [
        "tdiag.plan.program -> tdiag.plan.report: line 2 (local import) goes up from planner: program IR to "
        "planner: passes"
    ]


def test_a_from_import_ties_to_the_submodule_it_names_or_else_to_the_package(architecture, tmp_path):
    files = {
        "tdiag/plan/__init__.py": "from .build import build_plan\n",
        "tdiag/plan/build.py": "",
        "tdiag/plan/forms/__init__.py": "",
        "tdiag/design.py": "from .plan import build_plan, forms\nfrom . import plan\n",
    }
    root, _ = package(tmp_path, files)
    _, imports = architecture.import_graph(root)
    assert {(i.importer, i.imported, i.names) for i in imports if i.importer == "tdiag.design"} == {
        ("tdiag.design", "tdiag.plan", ("build_plan",)),
        ("tdiag.design", "tdiag.plan.forms", ("forms",)),
        ("tdiag.design", "tdiag.plan", ("plan",)),
    }


def test_the_largest_circle_counts_function_local_imports(architecture, tmp_path):
    files = {
        "tdiag/cost.py": "from .render import r\n",
        "tdiag/render.py": "def f():\n    from .module import m\n",
        "tdiag/module.py": "from .cost import c\n",
        "tdiag/init.py": "from .cost import c\n",
    }
    root, _ = package(tmp_path, files)
    found, imports = architecture.import_graph(root)
    assert architecture.largest_circle(found, imports) == {"tdiag.cost", "tdiag.render", "tdiag.module"}


def test_a_circle_in_the_measured_layers_counts_though_a_larger_one_is_elsewhere(architecture, tmp_path):
    files = {
        "tdiag/graph/__init__.py": "",
        "tdiag/graph/a.py": "from .b import x\n",
        "tdiag/graph/b.py": "from .c import x\n",
        "tdiag/graph/c.py": "from .a import x\n",
        "tdiag/decode.py": "from .reference import x\n",
        "tdiag/reference.py": "from .decode import x\n",
    }
    root, _ = package(tmp_path, files)
    found, imports = architecture.import_graph(root)
    assert architecture.largest_circle(found, imports) == {"tdiag.graph.a", "tdiag.graph.b", "tdiag.graph.c"}
    measured = architecture.largest_circle(found, imports, architecture.is_measured)
    assert measured == {"tdiag.decode", "tdiag.reference"}


def test_private_names_imported_across_modules_are_counted_by_name(architecture, tmp_path):
    files = {
        "tdiag/decode.py": "_rows = 1\n__all__ = []\n",
        "tdiag/decode_step.py": "from .decode import _rows, rows, __all__\n",
    }
    root, _ = package(tmp_path, files)
    _, imports = architecture.import_graph(root)
    assert [(i.importer, name) for i, name in architecture.private_imports(imports)] == [("tdiag.decode_step", "_rows")]


def test_the_targets_table_reads_this_checkout(architecture):
    report = architecture.targets()
    assert report["loaded_by_plan_program"]["tdiag"][0] == "tdiag"
    assert "tdiag.plan.program" in report["loaded_by_plan_program"]["tdiag"]
    assert not report["loaded_by_plan_program"]["torch"]
    table = architecture.table(report)
    assert table.splitlines()[0].split() == ["target", "package", "planner+backends+runtime", "goal"]
    assert len(table.splitlines()) == 8


def run_python(code: str) -> str:
    """`code` run by a fresh interpreter on this checkout; its standard output."""
    env = {**os.environ, "PYTHONPATH": str(ROOT)}
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env, cwd=ROOT)
    assert result.returncode == 0, result.stderr
    return result.stdout


def test_import_tdiag_loads_no_stage_until_a_public_name_is_asked_for():
    code = (
        "import sys, tdiag\n"
        "print(sorted(m for m in sys.modules if m.startswith('tdiag.')))\n"
        "print(tdiag.load('mhsa').graph.name, 'torch' in sys.modules)\n"
    )
    assert run_python(code).splitlines() == ["['tdiag.lazy']", "mhsa False"]


def test_every_public_name_of_tdiag_and_tdiag_plan_is_there_on_first_use():
    code = (
        "import tdiag, tdiag.plan\n"
        "from tdiag import Design, TdiagError, load\n"
        "from tdiag.plan import Plan, build_plan\n"
        "for package in (tdiag, tdiag.plan):\n"
        "    assert set(package.__all__) <= set(dir(package))\n"
        "    print(all(getattr(package, name) is not None for name in package.__all__))\n"
        "print(tdiag.Design is Design and tdiag.load is load and tdiag.plan.build_plan is build_plan)\n"
        "print(tdiag.decode.decode_rule.__module__, tdiag.plan.forms.__name__)\n"
    )
    assert run_python(code).split() == ["True", "True", "True", "tdiag.decode", "tdiag.plan.forms"]


def test_a_name_tdiag_does_not_have_is_an_attribute_error_naming_it():
    import tdiag
    import tdiag.plan

    with pytest.raises(AttributeError, match="module 'tdiag' has no attribute 'Desing'"):
        tdiag.Desing  # noqa: B018
    with pytest.raises(AttributeError, match=r"module 'tdiag\.plan' has no attribute 'data'"):
        tdiag.plan.data  # noqa: B018
    assert not hasattr(tdiag, "data")  # a folder of the package's data, not a module


def test_import_tdiag_plan_program_loads_neither_the_facade_nor_the_planner_driver():
    code = "import sys, tdiag.plan.program\nprint(' '.join(sorted(m for m in sys.modules if m.startswith('tdiag'))))"
    loaded = set(run_python(code).split())
    assert "tdiag.plan.program" in loaded
    assert not loaded & {"tdiag.design", "tdiag.check", "tdiag.plan.build", "tdiag.weights", "tdiag.objectives"}


def test_the_planner_backends_and_runtime_import_in_no_circle(architecture):
    """Issue 37's target: a module of the compiler proper reaches none of its importers, so each
    can be read and changed from the layers below it (decode.py's cache is typed in decode_step
    by a protocol; plan_for and compile_source sit below the module and the decoder)."""
    assert architecture.targets()["largest_import_circle"]["measured_modules"] == []


def test_import_tdiag_plan_program_loads_at_most_six_tdiag_modules(architecture):
    loaded = architecture.targets()["loaded_by_plan_program"]
    assert len(loaded["tdiag"]) <= 6, loaded["tdiag"]
    assert not loaded["lark"] and not loaded["torch"]
