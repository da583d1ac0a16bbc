"""Design spaces (.tds): parsing, enumeration, identification of points with the bundled designs,
deduplication by function, costs, positioned errors, and the `tdiag space` command."""

from __future__ import annotations

import dataclasses
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import sympy

import tdiag
from tdiag.cli import main
from tdiag.cost import cost_report
from tdiag.device import NOMINAL_CPU, DeviceModel, _cache_file, planning_device, planning_threads
from tdiag.errors import TdiagError, format_diagnostic
from tdiag.plan.timing import plan_time
from tdiag.space import load_space
from tdiag.space.canonical import CANONICAL_DEVICE, canonical_form
from tdiag.space.report import (
    compare_to,
    cost_plan,
    evaluate,
    known_programs,
    mark_front,
    plot_figure,
    sort_rows,
    text_table,
)

ROOT = Path(__file__).resolve().parent.parent
DESIGNS = ROOT / "designs"
SPACES = DESIGNS / "spaces"
SMALL = {"F": 32, "H": 4, "N": 16}

TUFORMER_FILES = [
    "mhsa",
    "skip_left",
    "skip_right",
    "heads_only",
    "trainable_heads_only",
    "single_head",
    "kronecker",
    "thsa",
]


@pytest.fixture(scope="module")
def tuformer_rows():
    space = load_space(SPACES / "tuformer.tds")
    known = known_programs([DESIGNS / f"{name}.td" for name in TUFORMER_FILES], SMALL)
    return evaluate(space, SMALL, known=known)


def _write(tmp_path: Path, text: str, name: str = "s.tds") -> Path:
    """A space file next to copies of the bundled designs it may extend."""
    for design in DESIGNS.glob("*.td"):
        (tmp_path / design.name).write_text(design.read_text())
    path = tmp_path / name
    path.write_text(text)
    return path


# ---- enumeration and identification ---------------------------------------------------------


@pytest.mark.parametrize("name", TUFORMER_FILES)
def test_the_tuformer_space_contains_each_tuformer_design_as_a_point(tuformer_rows, name):
    assert any(name in row.known for row in tuformer_rows)


@pytest.mark.parametrize(
    ("space", "names"),
    [
        ("fish", ["fish", "gfish", "lfish", "hard_fish", "hard_gfish", "mish"]),
        ("mgk", ["mgk", "mgk_harde", "smgk", "mlk", "smlk"]),
    ],
)
def test_the_fish_and_mgk_spaces_contain_their_designs(space, names):
    sizes = {"N": 16}
    points = evaluate(
        load_space(SPACES / f"{space}.tds"), sizes, known=known_programs([DESIGNS / f"{n}.td" for n in names], sizes)
    )
    found = {name for row in points for name in row.known}
    assert found == set(names)


def test_point_counts_are_the_products_and_sums_the_choices_imply():
    # tuformer: D (2) x core (full + kronecker with C1 (4) x C2 (2) x C3 (2)); fish: M (3) x
    # mixing (global with 3 noises + gated with 2 + local); mgk: M (3) x keys (2) x E-step (3)
    counts = {name: load_space(SPACES / f"{name}.tds").count() for name in ("tuformer", "fish", "mgk")}
    assert counts == {"tuformer": 2 * (1 + 4 * 2 * 2), "fish": 3 * (3 + 2 + 1), "mgk": 3 * 2 * 3}
    assert [len(list(load_space(SPACES / f"{n}.tds").points())) for n in counts] == list(counts.values())


def test_distinct_functions_merge_only_the_full_core_and_the_trainable_c1_at_d_1(tuformer_rows):
    # At D = 1, R = H: the full trainable R x R core is C1 (H x H, trainable) times the constant
    # 1 x 1 factors C2 = C3 = 1; no other two points of the space compute the same function.
    expected = 2 * (1 + 4 * 2 * 2) - 1
    assert sum(row.representative for row in tuformer_rows) == expected
    merged = [row for row in tuformer_rows if not row.representative]
    assert [row.point.choices for row in merged] == [
        {"D": "1", "core": "kronecker", "C1": "trainable", "C2": "ones", "C3": "ones"}
    ]
    assert merged[0].same == ["D=1 core=full"]


def test_equal_points_compute_equal_outputs_after_copying_parameters():
    torch = pytest.importorskip("torch")
    space = load_space(SPACES / "tuformer.tds")
    point = space.point("D=F / H core=kronecker C1=scaled_identity C2=ones C3=ones").build({"F": 16, "H": 4})
    mine = point.design.module(N=6, dtype=torch.float64, seed=1)
    mhsa = tdiag.load(DESIGNS / "mhsa.td", F=16, H=4).module(N=6, dtype=torch.float64, seed=2)
    with torch.no_grad():
        for name, value in mhsa.state_dict().items():
            getattr(mine, name).copy_(value.reshape(getattr(mine, name).shape))
    x = torch.randn(3, 6, 16, dtype=torch.float64)
    assert torch.allclose(mine(x), mhsa(x), atol=1e-10, rtol=0)


def test_skip_left_is_flagged_as_a_reparameterization(tuformer_rows):
    row = next(r for r in tuformer_rows if "skip_left" in r.known)
    assert any("C3" in note for note in row.reparameterized)
    assert next(r for r in tuformer_rows if "skip_right" in r.known).reparameterized == []


# ---- the same function, whatever the machine --------------------------------------------------

# At N = 64 the materialized box and SDPA cost the same FLOPs, and the `flops` objective breaks
# the tie by estimated time: on a CPU measured with scale ops at 2.5x their roofline, the point
# C = J_H kron J_D takes the materialized box and single_head.td (C = J_R) takes SDPA.
TIE = {"N": 64, "F": 32, "H": 4}
QUIET = dataclasses.replace(NOMINAL_CPU, name="cpu", kinds=(("scale", 1.0),))
LOADED = dataclasses.replace(NOMINAL_CPU, name="cpu", kinds=(("scale", 2.5),))


def _measured(monkeypatch, home: Path, device: DeviceModel) -> None:
    """Plan on a local CPU whose cached measurement (the file `tdiag bench` writes) is `device`."""
    monkeypatch.setenv("XDG_CACHE_HOME", str(home))
    monkeypatch.setenv("TDIAG_DEVICE", "cpu")
    for variable in ("TDIAG_DEVICE_PEAK_FLOPS", "TDIAG_DEVICE_BANDWIDTH", "TDIAG_DEVICE_OVERHEAD"):
        monkeypatch.delenv(variable, raising=False)
    path = _cache_file(planning_threads())
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(dataclasses.asdict(device)))


def _classes(rows) -> tuple[list, list]:
    groups: dict = {}
    for row in rows:
        groups.setdefault(row.key, []).append(row.label)
    known = sorted((row.label, row.known) for row in rows if row.known)
    return sorted(sorted(g) for g in groups.values()), known


def test_which_points_are_the_same_function_does_not_depend_on_the_measured_device(monkeypatch, tmp_path):
    space = load_space(SPACES / "tuformer.tds")
    found = []
    for name, device in (("quiet", QUIET), ("loaded", LOADED)):
        _measured(monkeypatch, tmp_path / name, device)
        known = known_programs([DESIGNS / f"{name}.td" for name in TUFORMER_FILES], TIE)
        found.append(_classes(evaluate(space, TIE, known=known)))
    assert found[0] == found[1]
    assert ("D=F / H core=kronecker C1=ones C2=ones C3=ones", ["single_head"]) in found[0][1]


@pytest.mark.parametrize("objective", ["flops", pytest.param("time", marks=pytest.mark.slow)])
def test_only_the_time_columns_of_the_space_report_depend_on_the_device(monkeypatch, tmp_path, capsys, objective):
    reports = []
    for name, device in (("quiet", QUIET), ("loaded", LOADED)):
        _measured(monkeypatch, tmp_path / name, device)
        assert main(["space", "tuformer", "--at", "N=64,F=32,H=4", "--format", "json", "--objective", objective]) == 0
        reports.append({item["point"]: item for item in json.loads(capsys.readouterr().out)["points"]})
    timing = {"time", "time_formula"}
    same = {"same_function_as", "equals_design", "distinct", "reparameterization"}
    assert reports[0].keys() == reports[1].keys()
    for a, b in ((reports[0][name], reports[1][name]) for name in reports[0]):
        changed = {k for k in a if a[k] != b[k]}
        assert not changed & same, (a["point"], changed)
        if objective != "time":  # under `time` the device chooses the plan: every cost may change
            assert changed <= timing, (a["point"], changed)


def test_the_canonical_form_does_not_depend_on_the_processes_string_hashes():
    # a value's broadcast legs are a frozenset, whose order follows the process's string hashes;
    # the point's materialized box is broadcast along both halves of its r = (h d) leg
    script = (
        "import hashlib, tdiag\n"
        "from tdiag.space import load_space\n"
        "from tdiag.space.canonical import canonical_form, canonical_plan\n"
        "label = 'D=F / H core=kronecker C1=ones C2=ones C3=ones'\n"
        "point = load_space('tuformer').point(label).build({'F': 32, 'H': 4})\n"
        "single = tdiag.load('single_head', F=32, H=4)\n"
        "plan = canonical_plan(point.design, {'N': 64})\n"
        "assert any(len(s.out.broadcast) == 2 for s in plan.steps if s.out is not None)\n"
        "forms = [canonical_form(d, {'N': 64}) for d in (point.design, single)]\n"
        "print(forms[0] == forms[1], hashlib.sha256(repr(forms).encode()).hexdigest())\n"
    )
    outputs = set()
    for seed in range(4):
        environment = {**os.environ, "PYTHONHASHSEED": str(seed), "PYTHONPATH": str(ROOT)}
        done = subprocess.run([sys.executable, "-c", script], env=environment, capture_output=True, text=True)
        assert done.returncode == 0, done.stderr
        outputs.add(done.stdout)
    assert len(outputs) == 1 and outputs.pop().startswith("True ")


# ---- costs and written points ---------------------------------------------------------------


def test_a_written_point_loads_to_the_same_design_with_the_same_cost(tmp_path):
    space = load_space(SPACES / "fish.tds")
    for point in space.points():
        point.build({"N": 16})
        path = tmp_path / f"{point.name}.td"
        path.write_text(point.text())
        written = tdiag.load(path)
        assert "# Choices: " + point.label in path.read_text()
        assert canonical_form(written, {"N": 16}) == canonical_form(point.design, {"N": 16})
        a, b = cost_report(written.plan(N=16)).formulas(), cost_report(point.design.plan(N=16)).formulas()
        assert all(sympy.simplify(a[k] - b[k]) == 0 for k in a), point.label


@pytest.mark.slow
def test_cost_formulas_of_each_point_equal_tdiag_cost_of_its_written_file(tmp_path, capsys, monkeypatch):
    # the space prices the flops objective's ties on the canonical roofline; tdiag cost does so
    # on the planning device, here given the same figures
    monkeypatch.setenv("TDIAG_DEVICE", "H100")
    monkeypatch.setenv("TDIAG_DEVICE_PEAK_FLOPS", str(CANONICAL_DEVICE.peak_flops))
    monkeypatch.setenv("TDIAG_DEVICE_BANDWIDTH", str(CANONICAL_DEVICE.bandwidth))
    monkeypatch.setenv("TDIAG_DEVICE_OVERHEAD", str(CANONICAL_DEVICE.overhead))
    space = load_space(SPACES / "tuformer.tds")
    assert (
        main(
            [
                "space",
                str(SPACES / "tuformer.tds"),
                "--at",
                "N=64,F=32,H=4",
                "--format",
                "json",
                "--write",
                str(tmp_path),
            ]
        )
        == 0
    )
    points = json.loads(capsys.readouterr().out)["points"]
    assert len(points) == space.count()
    for item in points[:6]:
        assert main(["cost", str(tmp_path / f"{item['point']}.td"), "--at", "N=64,F=32,H=4", "--format", "json"]) == 0
        (cost,) = json.loads(capsys.readouterr().out)
        for metric in ("params", "flops", "softmax_entries", "peak_memory"):
            assert cost[metric] == item[metric], (item["point"], metric)


def test_vs_gives_ratio_formulas_and_the_crossover_in_n(tuformer_rows):
    baseline = next(r for r in tuformer_rows if "mhsa" in r.known)
    compare_to(tuformer_rows, baseline, SMALL)
    single = next(
        r
        for r in tuformer_rows
        if r.point.choices == {"D": "1", "core": "kronecker", "C1": "ones", "C2": "ones", "C3": "ones"}
    )
    F, H = sympy.symbols("F H", positive=True)
    assert sympy.simplify(single.ratios["params"] - H / F) == 0
    # saved memory N (4H + N) (one N x N box, H-wide projections) against MHSA's N (4F + H):
    # they cross where N = 4F - 3H
    assert single.crossovers["peak_memory"] == pytest.approx([4 * SMALL["F"] - 3 * SMALL["H"]])


def test_the_time_column_and_its_formula_are_the_plans_time_model_at_the_point(fish_rows):
    """Issue 37: the space report prices time by the model the planner chooses by (plan/timing.py),
    not a simplified copy of it; its formula at the point is that number."""
    for row in (r for r in fish_rows if r.point.ok):
        plan = cost_plan(row.point.design, {"N": 32}, "flops")
        expected = plan_time(plan, planning_device(), B=1)
        assert row.numbers["time"] == pytest.approx(1000.0 * expected, rel=1e-12), row.label
        sizes = {k: v for k, v in plan.sizes.items() if k != "B"}
        at_point = float(row.point.design.graph.evaluate_at(row.formulas["time"], sizes))
        assert at_point == pytest.approx(expected, rel=1e-9), row.label


# ---- the table and the plot ----------------------------------------------------------------------


@pytest.fixture(scope="module")
def fish_rows():
    return sort_rows(evaluate(load_space(SPACES / "fish.tds"), {"N": 32}), "flops")


def test_the_default_table_is_one_short_row_per_point_with_the_compared_columns_and_no_formulas(capsys):
    assert main(["space", str(SPACES / "fish.tds"), "--at", "N=32"]) == 0
    lines = capsys.readouterr().out.splitlines()
    header = lines[2].split()
    assert header[:2] == ["#", "point"] and "saved memory" in lines[2] and "softmax entries" not in lines[2]
    assert [lines[3 + k].split()[0] for k in range(18)] == [str(k) for k in range(1, 19)]
    assert len(lines) <= 3 + 18 + 6 and max(len(line) for line in lines) <= 130
    assert not any("Max(" in line or line.startswith("formulas (") for line in lines)


def test_the_formulas_flag_adds_each_distinct_points_formulas_with_the_time_roofline_in_full(capsys):
    assert main(["space", str(SPACES / "fish.tds"), "--at", "N=32", "--formulas"]) == 0
    out = capsys.readouterr().out
    formulas = out[out.index("formulas (per sequence") :]
    assert formulas.count("    params ") == 18 and "Max(" in formulas and "roofline terms" not in formulas


def test_a_point_the_same_as_another_names_that_rows_number(tuformer_rows):
    text = text_table(tuformer_rows, SMALL, ("params", "flops"), "t")
    numbers = {row.label: k for k, row in enumerate(tuformer_rows, 1)}
    full = numbers["D=1 core=full"]
    line = next(line for line in text.splitlines() if "C1=trainable C2=ones C3=ones" in line and "D=1" in line)
    assert f"#{full}" in line.split()[-1]


def test_the_plots_point_labels_do_not_overlap(fish_rows):
    matplotlib = pytest.importorskip("matplotlib")
    from matplotlib.text import Text

    figure = plot_figure(fish_rows)
    figure.canvas.draw()
    (ax,) = figure.axes
    renderer = figure.canvas.get_renderer()
    boxes = [Text.get_window_extent(t, renderer) for t in ax.texts]
    distinct = sum(r.representative for r in fish_rows)
    assert len(boxes) >= distinct // 2
    assert not any(a.overlaps(b) for k, a in enumerate(boxes) for b in boxes[k + 1 :])
    matplotlib.pyplot.close(figure)


def test_the_plot_draws_the_pareto_front_as_a_line_named_in_the_legend(fish_rows):
    matplotlib = pytest.importorskip("matplotlib")
    mark_front(fish_rows, ("params", "peak_memory"))  # two points: fewest parameters, least memory
    try:
        figure = plot_figure(fish_rows, "params", "peak_memory")
        front = sorted((r.numbers["params"], r.numbers["peak_memory"]) for r in fish_rows if r.front)
    finally:
        mark_front(fish_rows, ("params", "flops"))
    (ax,) = figure.axes
    assert "Pareto front (params, peak_memory)" in [t.get_text() for t in ax.get_legend().get_texts()]
    (line,) = [line for line in ax.get_lines() if line.get_label().startswith("Pareto front")]
    assert list(zip(line.get_xdata(), line.get_ydata(), strict=True)) == front and len(front) == 2
    matplotlib.pyplot.close(figure)


def test_the_plot_colours_points_by_family(fish_rows):
    matplotlib = pytest.importorskip("matplotlib")
    figure = plot_figure(fish_rows)
    (ax,) = figure.axes
    named = {t.get_text() for t in ax.get_legend().get_texts()}
    assert {"mixing=global", "mixing=gated", "mixing=local"} <= named
    colours = {tuple(c.get_facecolor()[0]) for c in ax.collections if c.get_label().startswith("mixing=")}
    assert len(colours) == 3
    matplotlib.pyplot.close(figure)


# ---- mistakes ---------------------------------------------------------------------------------


def test_a_replace_of_an_unknown_name_is_a_positioned_error_naming_the_choice(tmp_path):
    path = _write(tmp_path, "space s extends thsa\nchoose core {\n  a:\n  b: replace param Cx[r: R, s: R] = ones\n}\n")
    with pytest.raises(TdiagError) as caught:
        load_space(path)
    (diagnostic,) = caught.value.diagnostics
    assert "choice 'core', option 'b'" in diagnostic.message and "'Cx'" in diagnostic.message
    assert (diagnostic.spans[0].line, diagnostic.spans[0].column) == (4, 20)
    assert "^^" in format_diagnostic(diagnostic) and "did you mean 'C'" in (diagnostic.hint or "")


def test_a_syntax_error_inside_a_choice_names_the_choice(tmp_path):
    path = _write(tmp_path, "space s extends thsa\nchoose C1 {\n  a: const C1[h: H k: H] = = identity\n}\n")
    with pytest.raises(TdiagError) as caught:
        load_space(path)
    (diagnostic,) = caught.value.diagnostics
    assert diagnostic.message.startswith("in choice 'C1': unexpected")
    assert diagnostic.spans[0].line == 3


def test_a_size_choice_for_a_size_the_base_lacks_is_an_error(tmp_path):
    path = _write(tmp_path, "space s extends mhsa\nchoose Z in 1, 2\n")
    with pytest.raises(TdiagError, match="choice 'Z': the base design has no size 'Z'"):
        load_space(path)


def test_a_point_that_fails_check_is_reported_and_the_others_are_costed(tmp_path):
    path = _write(tmp_path, "space s extends mhsa\nchoose H in 3, 4\n")
    rows = evaluate(load_space(path), {"N": 8, "F": 32})
    assert [row.point.ok for row in rows] == [False, True]
    assert rows[0].point.problems and rows[1].numbers["params"] == 4 * 32 * 32


def test_two_nested_choices_of_one_name_may_sit_under_different_options(tmp_path):
    text = "space s extends mhsa\nchoose a {\n  x { choose n in 1 }\n  y { choose n in 2 }\n}\n"
    text = text.replace("choose n in 1", "choose H in 2").replace("choose n in 2", "choose H in 4")
    space = load_space(_write(tmp_path, text))
    assert [p.choices for p in space.points()] == [{"a": "x", "H": "2"}, {"a": "y", "H": "4"}]


# ---- the command --------------------------------------------------------------------------------


def test_space_command_prints_the_table_with_the_front_and_the_known_designs(capsys):
    assert main(["space", str(SPACES / "mgk.tds"), "--at", "N=64", "--pareto", "params,time"]) == 0
    out = capsys.readouterr().out
    assert "18 points, 18 pass check" in out and "mgk.td" in out and "smlk.td" in out
    assert any(line.startswith("*") for line in out.splitlines())


def test_space_command_writes_csv_with_formulas(capsys):
    assert main(["space", str(SPACES / "fish.tds"), "--at", "N=32", "--format", "csv"]) == 0
    header, *rows = capsys.readouterr().out.splitlines()
    assert "flops_formula" in header and len(rows) == 18


def test_space_command_refuses_a_size_the_base_lacks(capsys):
    assert main(["space", str(SPACES / "fish.tds"), "--at", "Q=3"]) == 2
    assert "no size Q" in capsys.readouterr().err


def test_a_vs_design_that_exists_but_cannot_be_read_gives_its_own_error(capsys, tmp_path):
    (tmp_path / "broken.td").write_bytes(b"design broken\n# caf\xe9\n")
    assert main(["space", str(SPACES / "mgk.tds"), "--at", "N=64", "--vs", str(tmp_path / "broken.td")]) == 1
    assert "broken.td:2:6: error: this file is not UTF-8 text" in capsys.readouterr().err


@pytest.mark.parametrize("known", ["missing.td", "folder.td", "/dev/null"])
def test_a_known_design_that_is_not_a_file_is_a_usage_error(capsys, tmp_path, monkeypatch, known):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "folder.td").mkdir()
    assert main(["space", str(SPACES / "mgk.tds"), "--at", "N=64", "--known", "mhsa", known]) == 2
    assert f"argument --known: '{known}' is not a design file" in capsys.readouterr().err


def test_a_base_beside_the_space_that_is_not_a_file_is_an_error_not_the_bundled_base(tmp_path):
    (tmp_path / "mgk.tds").write_text((SPACES / "mgk.tds").read_text())
    (tmp_path / "mgk_harde.td").mkdir()  # the base the space extends
    with pytest.raises(TdiagError, match="it is a folder, not a design file"):
        load_space(tmp_path / "mgk.tds")


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        ("--overwrite", "--overwrite"),
        ("--resume runs/x", "--resume"),
        ("--nproc 2", "--nproc"),
        ("--out x", "--out"),
        ("--seeds 2", "--seeds"),
    ],
)
def test_train_args_that_would_choose_the_run_folder_or_processes_are_refused_not_ignored(
    capsys, tmp_path, flags, named
):
    argv = ["space", str(SPACES / "fish.tds"), "--at", "N=32", "--train", "--out", str(tmp_path / "runs")]
    assert main([*argv, f"--train-args={flags}"]) == 2
    err = capsys.readouterr().err
    assert f"argument --train-args: {named} cannot go in --train-args" in err
    assert not any((tmp_path / "runs").glob("*/checkpoint.pt"))


def test_a_bundled_space_is_named_by_its_name(capsys):
    code = main(["space", "tuformer", "--format", "csv"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.splitlines()[0].startswith("point,")
    assert len(out.splitlines()) == 1 + load_space("tuformer").count()


def test_an_unknown_space_name_lists_the_bundled_spaces(capsys):
    code = main(["space", "tuformr"])
    _, err = capsys.readouterr()
    assert code == 1
    assert "no such space file 'tuformr'" in err and "did you mean 'tuformer'?" in err and "fish, mgk, tuformer" in err
