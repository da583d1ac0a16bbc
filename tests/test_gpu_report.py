"""The GPU report (`python -m tdiag.gpu_report`, issue 26): its dry run (`--device cpu`) runs end
to end on the CPU and writes the same files as on a GPU, so that CI keeps the one-command report
working; its flags fail in one line; its parts (budgets, ratios, ranking) do what the README says."""

from __future__ import annotations

import json
import re
import subprocess
import sys

import pytest
from conftest import ROOT

from tdiag import gpu_report
from tdiag.gpu_report import BenchRow, Budget, Settings

REPORT_FILES = {"README.md", "report.json", "bench.csv", "train.csv", "tests.txt", "bench.png", "train.png"}


def report_command(out, *flags: str) -> list[str]:
    return [sys.executable, "-m", "tdiag.gpu_report", "--device", "cpu", "--out", str(out), *flags]


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    """The dry run once, into a temporary folder: its folder, README and report.json."""
    out = tmp_path_factory.mktemp("gpu-report") / "report"
    result = subprocess.run(report_command(out), cwd=ROOT, capture_output=True, text=True, timeout=900)
    assert result.returncode == 0, result.stderr[-3000:]
    return out, (out / "README.md").read_text(), json.loads((out / "report.json").read_text())


# ---- the dry run, end to end ----------------------------------------------------------------------


@pytest.mark.slow
def test_dry_run_writes_every_report_file(dry_run):
    out, _, _ = dry_run
    assert {p.name for p in out.iterdir()} == REPORT_FILES


@pytest.mark.slow
def test_readme_names_the_device_versions_sizes_and_every_command(dry_run):
    _, readme, _ = dry_run
    for field in ("- device: ", "- driver: ", "- CUDA: ", "- torch: ", "- Python: ", "- planning device", "## Sizes"):
        assert field in readme
    assert "python -m tdiag.gpu_report --device cpu" in readme and "python -m pytest -m gpu" in readme
    for design in gpu_report.TRAIN_DESIGNS:
        assert f"tdiag train {design} --layers 1 " in readme
    assert "flash-linear-attention: not available" in readme or "flash-linear-attention: available" in readme


@pytest.mark.slow
def test_every_ratio_in_the_readme_has_its_min_max(dry_run):
    _, readme, _ = dry_run
    ratios = re.findall(r"\d×", readme)
    with_spread = re.findall(r"\d× \(\d+\.\d+–\d+\.\d+\)", readme)
    assert ratios and len(with_spread) == len(ratios)


@pytest.mark.slow
def test_every_design_length_and_mask_has_a_row_per_objective_and_hand_written_form(dry_run):
    _, _, report = dry_run
    rows = report["bench"]["rows"]
    settings = Settings.for_device("cpu", dry_run=True, minutes=25)
    for n, design, mask in gpu_report.bench_cases(settings):
        names = {r["implementation"] for r in rows if (r["design"], r["n"], r["mask"]) == (design, n, mask)}
        assert {f"tdiag ({o})" for o in gpu_report.OBJECTIVES} <= names
        assert len(names) > 3 or design == "mlk"  # every design but mlk has a hand-written form
    sdpa = [r for r in rows if r["implementation"] == "hand-written SDPA"]
    assert sdpa and all(r["ratio_min"] <= r["ratio"] <= r["ratio_max"] for r in sdpa)


@pytest.mark.slow
def test_a_form_that_cannot_run_is_a_row_with_its_reason_not_a_failure(dry_run):
    _, _, report = dry_run
    flex = [r for r in report["bench"]["rows"] if r["implementation"] == "FlexAttention (hand-written)"]
    assert flex and all(r["ms"] is None and "backward on CPU" in r["note"] for r in flex)


@pytest.mark.slow
def test_training_reports_every_design_and_the_nanogpt_ratio(dry_run):
    _, readme, report = dry_run
    runs = report["train"]["runs"]
    assert [r["design"] for r in runs] == list(gpu_report.TRAIN_DESIGNS)
    assert all(r["tokens_per_s"] > 0 and r["final_val_loss"] > 0 for r in runs)
    comparison = report["train"]["throughput"]
    assert comparison["ratio_min"] <= comparison["ratio"] <= comparison["ratio_max"]
    assert "tokens/s ratio tdiag/nanoGPT: " in readme


@pytest.mark.slow
def test_gpu_tests_run_and_are_reported_skipped_without_cuda(dry_run):
    _, readme, report = dry_run
    assert re.fullmatch(r"\d+ skipped in [\d.]+s", report["tests"]["summary"])
    assert "no CUDA device" in readme


@pytest.mark.slow
def test_spent_budgets_stop_each_section_and_the_readme_says_so(tmp_path):
    out = tmp_path / "report"
    result = subprocess.run(report_command(out, "--minutes", "0.05"), cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr[-3000:]
    readme = (out / "README.md").read_text()
    for section in ("tests", "bench", "train"):
        assert re.search(rf"- {section}: time budget of \d+ s spent", readme)


# ---- flags ------------------------------------------------------------------------------------------


def run_main(capsys, *argv: str) -> tuple[int, str]:
    try:
        code = gpu_report.main(list(argv))
    except SystemExit as exit:  # argparse's own usage errors
        code = exit.code
    return code, capsys.readouterr().err


def test_unknown_device_is_a_usage_error_listing_the_choices(capsys):
    code, err = run_main(capsys, "--device", "tpu")
    assert code == 2 and "argument --device: invalid choice: 'tpu'" in err and "Traceback" not in err


def test_minutes_must_be_a_positive_number(capsys):
    code, err = run_main(capsys, "--minutes", "zero")
    assert code == 2 and "argument --minutes: expected a number of minutes, got 'zero'" in err


def test_cuda_without_a_cuda_device_is_refused_in_one_line(capsys, monkeypatch):
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    code, err = run_main(capsys, "--device", "cuda")
    assert code == 2 and "argument --device: cuda is not available here" in err and "--device cpu" in err
    assert len(err.strip().splitlines()) == 1


def test_out_that_is_a_file_is_refused_before_any_work(capsys, tmp_path):
    taken = tmp_path / "taken"
    taken.write_text("a file")
    code, err = run_main(capsys, "--device", "cpu", "--out", str(taken))
    assert code == 2 and str(taken) in err and "Traceback" not in err and taken.read_text() == "a file"


def test_a_bad_flag_does_not_import_torch():
    code = (
        "import sys; from tdiag.gpu_report import main\n"
        "try:\n    main(['--minutes', '-1'])\nexcept SystemExit as e:\n    assert e.code == 2\n"
        "assert 'torch' not in sys.modules, 'torch was imported'"
    )
    result = subprocess.run([sys.executable, "-c", code], cwd=ROOT, capture_output=True, text=True)
    assert result.returncode == 0, result.stderr


# ---- parts ------------------------------------------------------------------------------------------


def test_gpu_settings_share_25_minutes_between_the_sections():
    settings = Settings.for_device("cuda", dry_run=False, minutes=25)
    assert sum(settings.budgets.values()) <= 25 * 60
    assert settings.lengths == (1024, 4096, 16384) and settings.precision == "bfloat16-autocast"


def test_gpu_training_command_is_the_gpu_sized_compiled_configuration():
    command = gpu_report.train_command(Settings.for_device("cuda", dry_run=False, minutes=25), "fish", "RUN")
    text = " ".join(command)
    assert text.startswith("tdiag train fish --layers 6 --width 384 ") and "--context 1024" in text
    assert "--compile" in command and "--device cuda" in text


def test_benchmark_cases_run_the_shortest_length_first():
    lengths = [n for n, _, _ in gpu_report.bench_cases(Settings.for_device("cuda", dry_run=False, minutes=25))]
    assert lengths == sorted(lengths)


def test_a_spent_budget_says_how_many_cases_ran():
    said = []
    budget = Budget(0, said.append)
    assert not budget.has_time(3, 10)
    assert budget.stopped == "time budget of 0 s spent after 3 of 10 cases" and len(said) == 1


def test_ratio_text_gives_the_median_and_the_min_max():
    assert gpu_report.ratio_text({"ratio": 1.02, "ratio_min": 0.98, "ratio_max": 1.1}) == "1.020× (0.980–1.100)"


def test_ranking_counts_the_pairs_of_plans_ordered_as_measured():
    def row(objective: str, ms: float, predicted: float) -> BenchRow:
        return BenchRow("fish", "causal", 1024, 16, f"tdiag ({objective})", ms=ms, predicted_ms=predicted)

    rows = [row("time", 1.0, 1.0), row("flops", 2.0, 3.0), row("memory", 1.5, 0.5)]
    (found,) = gpu_report.ranking(rows)
    assert (found["plans"], found["pairs"], found["pairs_right"]) == (3, 3, 2)


def test_an_objective_with_another_objectives_plan_is_not_ranked_twice():
    rows = [
        BenchRow("mhsa", "plain", 1024, 16, "tdiag (time)", ms=1.0, predicted_ms=1.0),
        BenchRow("mhsa", "plain", 1024, 16, "tdiag (flops)", ms=1.0, predicted_ms=1.0, same_plan_as="time"),
    ]
    assert gpu_report.ranking(rows)[0]["pairs"] == 0


def test_pytest_summary_is_its_closing_line():
    output = "....s\n=== short test summary info ===\nSKIPPED [1] x\n===== 4 passed, 1 skipped in 2.10s =====\n"
    assert gpu_report.pytest_summary(output) == "4 passed, 1 skipped in 2.10s"


def test_device_name_becomes_a_folder_name():
    assert gpu_report.slug("NVIDIA H100 80GB HBM3") == "nvidia-h100-80gb-hbm3"


def test_without_matplotlib_plots_are_left_out_with_a_stated_line(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "matplotlib", None)  # `import matplotlib` raises ImportError
    found = gpu_report.plots(tmp_path, {"bench": {"rows": []}, "train": {}, "environment": {"device": "cpu"}})
    assert found["files"] == [] and found["note"].startswith("no plots: matplotlib is not installed")


def test_the_default_folder_is_named_for_the_device_and_the_date():
    settings = Settings.for_device("cuda", dry_run=False, minutes=25)
    folder = gpu_report.default_out({"device": "NVIDIA H100 80GB HBM3"}, settings)
    assert re.fullmatch(r"docs/results/gpu-nvidia-h100-80gb-hbm3-\d{4}-\d\d-\d\d", folder.as_posix())


def test_a_section_that_breaks_is_reported_and_the_next_sections_still_run(monkeypatch):
    def broken(settings, budget, log):
        raise RuntimeError("CUDA error: an illegal memory access was encountered")

    monkeypatch.setattr(gpu_report, "run_bench", broken)
    monkeypatch.setattr(gpu_report, "run_tests", lambda budget, log: {"command": "pytest", "summary": "1 passed"})
    monkeypatch.setattr(gpu_report, "run_training", lambda settings, budget, log: {"runs": [], "throughput": {}})
    report = gpu_report.build(Settings.for_device("cpu", dry_run=True, minutes=1), "command", log=lambda text: None)
    assert report["sections"]["bench"].startswith("failed (RuntimeError: CUDA error: an illegal memory access")
    assert report["sections"]["train"].startswith("completed") and report["bench"]["rows"] == []
    assert "Traceback" in report["tracebacks"]["bench"]


@pytest.mark.parametrize(
    ("error", "note"),
    [("out of memory", "out of memory"), ("kernel", "RuntimeError: no kernel image is available")],
    ids=["out-of-memory", "kernel-error"],
)
def test_a_benchmark_case_that_fails_is_a_row_with_its_reason(monkeypatch, error, note):
    import torch

    raised = (
        torch.cuda.OutOfMemoryError("CUDA out of memory")
        if error == "out of memory"
        else RuntimeError("no kernel image is available\nfor execution on the device")
    )

    def failing(*args):
        raise raised

    monkeypatch.setattr(gpu_report, "_bench_case", failing)
    settings = Settings.for_device("cpu", dry_run=True, minutes=1)
    (row,) = gpu_report.bench_case(settings, "fish", "causal", 16384, None)
    assert (row.design, row.n, row.batch, row.ms, row.note) == ("fish", 16384, 1, None, note)


def test_tests_stopped_by_the_budget_are_counted_from_their_lines():
    output = "tests/test_gpu.py::test_a[mhsa] PASSED [  1%]\ntests/test_gpu.py::test_a[fish] FAILED [  2%]\n"
    assert gpu_report.tests_so_far(output + "tests/test_gpu.py::test_b PASSED [  3%]\n") == "2 passed, 1 failed"
