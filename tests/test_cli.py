"""The command line: exit codes, summaries, and no tracebacks for user mistakes."""

import argparse
import errno
import json
import os
import re
import subprocess
import sys

import pytest
from conftest import DESIGN_FILES, DESIGNS, ROOT

import tdiag
from tdiag.cli import argument_parser, main
from tdiag.render import has_dot


def run(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    assert "Traceback" not in out + err
    return code, out, err


def test_check_prints_ok_with_sizes_and_parameter_formula(capsys):
    code, out, _ = run(capsys, "check", str(DESIGNS / "mhsa.td"))
    assert code == 0
    assert "mhsa.td: ok (F=512, H=8, D=64, N; 1 input, 4 params; 5 statements; params 4*D*F*H = 1,048,576)" in out


def test_check_names_a_bundled_design_once(capsys):
    code, out, _ = run(capsys, "check", "fish")
    assert code == 0 and out.startswith("fish: ok (F=512")


def test_check_names_the_design_of_a_file_named_otherwise(capsys, tmp_path):
    path = tmp_path / "variant.td"
    path.write_text((DESIGNS / "mhsa.td").read_text())
    code, out, _ = run(capsys, "check", str(path))
    assert code == 0 and out.startswith(f"{path}: ok (design mhsa; F=512")


def test_check_all_bundled_designs_succeeds(capsys):
    code, out, err = run(capsys, "check", *map(str, DESIGN_FILES))
    assert code == 0 and out.count(": ok (") == len(DESIGN_FILES) and "warning" not in err


def test_check_reports_mistakes_with_exit_code_1(capsys, write_td):
    path = write_td("design t\nsize N\ninput X[n: N]\nY[n] = X[n] Z[n]\noutput Y\n")
    code, _, err = run(capsys, "check", str(path))
    assert code == 1
    assert f"{path}:4:13: error: unknown tensor 'Z'" in err
    assert "    4 | Y[n] = X[n] Z[n]\n      |             ^" in err


def test_check_shows_a_sum_inside_a_map_as_a_warning_with_a_caret_and_succeeds(capsys, write_td):
    path = write_td("design t\nsize N, H = 2\ninput S[h: H, n: N, k: N]\nY[h n] = exp(S[h n k])\noutput Y\n")
    code, out, err = run(capsys, "check", str(path))
    assert code == 0 and ": ok (" in out
    assert f"{path}:4:20: warning: exp(S[h n k]) sums k inside exp: it computes exp(Σ_k S[h n k])" in err
    assert "    4 | Y[h n] = exp(S[h n k])\n      |                    ^\n" in err


def test_missing_file_is_an_error_not_a_traceback(capsys):
    code, _, err = run(capsys, "check", "no/such/file.td")
    assert code == 1 and "no such design file 'no/such/file.td'" in err


def test_an_unknown_design_name_gets_the_closest_name_and_a_pointer_to_tdiag_list_not_every_name(capsys):
    code, _, err = run(capsys, "check", "fsh")
    hint = [line for line in err.splitlines() if line.startswith("hint: ")]
    assert code == 1 and hint == [
        f"hint: did you mean 'fish'? `tdiag list` names the {len(DESIGN_FILES)} bundled designs"
    ]


def test_a_name_close_to_no_bundled_design_gets_the_pointer_alone(capsys):
    code, _, err = run(capsys, "show", "zzzqqq")
    assert code == 1 and f"hint: `tdiag list` names the {len(DESIGN_FILES)} bundled designs" in err.splitlines()


def test_list_names_every_bundled_design_and_space_with_its_title(capsys):
    code, out, _ = run(capsys, "list")
    rows = dict(line.split(maxsplit=1) for line in out.splitlines() if line.startswith("  "))
    assert code == 0 and set(rows) == {p.stem for p in DESIGN_FILES} | {"fish", "mgk", "tuformer"}
    assert rows["gla"] == "Gated linear attention (GLA)" and rows["tuformer"].startswith("Tuformer's design space")
    assert max(len(title) for title in rows.values()) <= 80


@pytest.mark.parametrize(
    "argv",
    [
        ["frobnicate"],
        ["check"],
        ["check", "x.td", "--set", "F"],
        ["check", "x.td", "--set", "F=abc"],
        ["check", "x.td", "--set", "F=-2"],
        ["render", "designs/mhsa.td"],
        ["render", "designs/mhsa.td", "-o", "out.jpeg"],
    ],
)
def test_usage_mistakes_exit_2(capsys, argv):
    code, _, err = run(capsys, *argv)
    assert code == 2 and "error" in err


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            ["check", "mhsa", "--set", f"F={2**31}"],
            "argument --set: size F = 2,147,483,648 is over the limit of 2,147,483,647",
        ),
        (
            ["cost", "mhsa", "--at", f"N={10**20}"],
            "argument --at: size N = 100,000,000,000,000,000,000 is over the limit",
        ),
        (["cost", "mhsa", "--at", "N=4,N=5"], "argument --at: size N is given twice (N=4, N=5)"),
    ],
    ids=["set-over-limit", "at-over-limit", "at-twice"],
)
def test_a_size_flag_over_the_limit_or_given_twice_is_a_usage_error(capsys, argv, message):
    code, _, err = run(capsys, *argv)
    assert code == 2 and message in err


def test_set_overrides_a_size(capsys):
    code, out, _ = run(capsys, "check", str(DESIGNS / "mhsa.td"), "--set", "F=256", "--set", "H=4")
    assert code == 0 and "F=256, H=4, D=64" in out


def test_set_with_an_unknown_size_lists_the_sizes(capsys):
    code, _, err = run(capsys, "check", str(DESIGNS / "mhsa.td"), "--set", "K=4")
    assert code == 1 and "design 'mhsa' has no size 'K'" in err and "D, F, H, N" in err


def test_show_lists_sizes_tensors_statements_and_boxes(capsys):
    code, out, _ = run(capsys, "show", str(DESIGNS / "thsa.td"))
    assert code == 0
    for fragment in (
        "D = F/H = 64",
        "param  C[r: R, s: R]",
        "softmax box over",
        "normalized leg m",
        "contracted",
    ):
        assert fragment in out


def test_render_dot(capsys, tmp_path):
    code, _, _ = run(capsys, "render", str(DESIGNS / "thsa.td"), "-o", str(tmp_path / "thsa.dot"))
    assert code == 0 and (tmp_path / "thsa.dot").read_text().startswith('graph "thsa"')


@pytest.mark.skipif(not has_dot(), reason="Graphviz 'dot' is not installed")
def test_render_svg(capsys, tmp_path):
    code, _, _ = run(capsys, "render", str(DESIGNS / "mhsa.td"), "-o", str(tmp_path / "mhsa.svg"))
    assert code == 0 and "<svg" in (tmp_path / "mhsa.svg").read_text()


def test_render_without_dot_program_explains(capsys, tmp_path, monkeypatch):
    monkeypatch.setenv("PATH", str(tmp_path))
    code, _, err = run(capsys, "render", str(DESIGNS / "mhsa.td"), "-o", str(tmp_path / "m.png"))
    assert code == 1 and "needs Graphviz's 'dot' program" in err


def test_compile_with_the_memory_objective_reports_the_p17_lowering(capsys, tmp_path):
    target = tmp_path / "mgk_module.py"
    code, out, _ = run(capsys, "compile", str(DESIGNS / "mgk.td"), "-o", str(target), "--objective", "memory")
    assert code == 0 and "key bias as a feature (MGK P17)" in out
    assert "scaled_dot_product_attention" in target.read_text()


@pytest.mark.parametrize("design", ["gla", "retnet", "mhsa"])
def test_compile_names_the_module_class_a_user_imports_not_a_helper(capsys, tmp_path, design):
    from tdiag.bench import module_from_file

    target = tmp_path / f"{design}_module.py"
    code, out, _ = run(capsys, "compile", design, "-o", str(target), "--set", "F=64", "--set", "H=4")
    module = module_from_file(target, f"compiled_{design}")
    assert code == 0 and f"wrote {target}: class {type(module).__name__}, " in out


def test_an_unknown_objective_is_a_usage_error(capsys):
    code, _, err = run(capsys, "cost", str(DESIGNS / "mgk.td"), "--objective", "fastest")
    assert code == 2 and "invalid choice: 'fastest'" in err and "memory" in err


def test_compile_writes_an_importable_module_and_reports_lowering(capsys, tmp_path):
    target = tmp_path / "mhsa_module.py"
    code, out, _ = run(capsys, "compile", str(DESIGNS / "mhsa.td"), "-o", str(target), "--set", "F=64", "--set", "H=4")
    assert code == 0 and "lowered to scaled_dot_product_attention" in out
    namespace: dict = {}
    exec(compile(target.read_text(), str(target), "exec"), namespace)
    assert namespace["Mhsa"]().WQ.shape == (64, 4, 16)


def test_cost_prints_ratios_to_the_first_design(capsys):
    code, out, _ = run(capsys, "cost", str(DESIGNS / "mhsa.td"), str(DESIGNS / "thsa.td"), "--at", "N=1024,F=512,H=8")
    assert code == 0
    assert "1,048,576" in out and "1,310,720 (1.25x)" in out and "softmax_entries" in out


def test_cost_says_the_sequence_length_it_assumed(capsys):
    code, out, _ = run(capsys, "cost", "thsa")
    assert code == 0
    assert out.splitlines()[0] == (
        "cost per sequence at N=1024 (flop convention; N not given: the planning default, set with --at)"
    )


def test_cost_at_a_given_length_assumes_nothing(capsys):
    code, out, _ = run(capsys, "cost", "thsa", "--at", "N=64")
    assert code == 0 and out.splitlines()[0] == "cost per sequence at N=64 (flop convention)"


def test_bench_header_states_its_settings_in_words():
    from tdiag.cli import _bench_settings_text

    settings = {"n": 64, "batch": 8, "width": 256, "heads": 4, "repeat": 5, "causal": True}
    settings |= {"objective": "time", "device": "cpu", "baseline": None}
    assert _bench_settings_text(settings) == (
        "forward + backward on cpu, N=64, batch 8, F=256, H=4, causal, objective time, median of 5 (round-robin)"
    )


def test_cost_json_has_numbers_and_formulas(capsys):
    code, out, _ = run(capsys, "cost", str(DESIGNS / "skip_right.td"), "--at", "N=1024", "--format", "json")
    (report,) = json.loads(out)
    assert code == 0 and report["params"] == 1_048_640 and report["params_formula"] == "4*F*R + H**2"
    assert {"flops", "softmax_entries", "peak_memory", "flops_formula", "peak_memory_formula"} <= set(report)


def test_cost_with_a_size_no_design_has_is_a_usage_error(capsys):
    code, _, err = run(capsys, "cost", str(DESIGNS / "mhsa.td"), "--at", "K=4")
    assert code == 2 and "no design has a size K; their sizes are: D, F, H, N" in err


def test_bench_writes_json_csv_and_plot(capsys, tmp_path):
    code, out, _ = run(
        capsys, "bench", str(DESIGNS / "mhsa.td"), "--n", "8", "--batch", "2", "--width", "16", "--heads", "2",
        "--repeat", "1", "--out", str(tmp_path),
    )  # fmt: skip
    assert code == 0 and "hand-written SDPA" in out
    assert {p.name for p in tmp_path.iterdir()} >= {"bench.json", "bench.csv"}


def test_bench_feeds_a_cross_attention_its_memory_as_a_second_sequence(capsys, tmp_path):
    code, _, err = run(
        capsys, "bench", str(DESIGNS / "cross_attention.td"), "--n", "8", "--batch", "2", "--width", "16",
        "--heads", "2", "--repeat", "1", "--out", str(tmp_path), "--causal",
    )  # fmt: skip
    assert code == 0 and "Traceback" not in err
    rows = json.loads((tmp_path / "bench.json").read_text())["rows"]
    assert [r["design"] for r in rows] == ["cross_attention"] and rows[0]["saved_bytes"] > 0


def test_bench_times_a_standalone_baseline_file_with_the_compiled_weights(capsys, tmp_path):
    baseline = tmp_path / "old"
    baseline.mkdir()
    code, _, _ = run(
        capsys, "compile", str(DESIGNS / "mhsa.td"), "--set", "F=16", "--set", "H=2", "-o", str(baseline / "mhsa.py")
    )
    assert code == 0
    code, out, _ = run(
        capsys, "bench", str(DESIGNS / "mhsa.td"), "--n", "8", "--batch", "2", "--width", "16", "--heads", "2",
        "--repeat", "3", "--baseline", str(baseline), "--out", str(tmp_path / "bench"),
    )  # fmt: skip
    assert code == 0 and "baseline (old)" in out
    rows = json.loads((tmp_path / "bench" / "bench.json").read_text())["rows"]
    old = next(r for r in rows if r["implementation"] == "baseline (old)")
    assert old["time_ratio_min"] <= old["time_ratio"] <= old["time_ratio_max"]


def test_bench_refuses_a_baseline_that_is_not_a_folder(capsys, tmp_path):
    code, _, err = run(capsys, "bench", MHSA, "--baseline", str(tmp_path / "missing"), "--out", str(tmp_path / "b"))
    assert code == 2 and "--baseline" in err


@pytest.mark.parametrize(
    ("name", "port", "sizes"),
    [
        ("hard_fish", "AuthorsFish", {"F": 16, "H": 4}),
        ("mgk", "AuthorsMgk", {"F": 16, "H": 2, "D": 4}),
        ("thsa", "AuthorsThsa", {"F": 16, "H": 2}),
    ],
)
def test_benchmark_ports_of_the_authors_code_compute_the_same_function(name, port, sizes):
    """The benchmark compares like with like: each port equals the compiled design (up to the
    MGK code's 1e-6 in the denominator)."""
    import torch

    import tdiag
    from tdiag import bench

    module = tdiag.load(DESIGNS / f"{name}.td", **sizes).module(N=6, dtype=torch.float64).eval()
    reference = getattr(bench, port)(module).to(torch.float64).eval()
    x = torch.randn(2, 6, 16, dtype=torch.float64)
    assert torch.allclose(module(x), reference(x), atol=1e-5)


def modules_after(argv: list[str]) -> set[str]:
    """The top-level modules a fresh interpreter holds after `tdiag.cli.main(argv)`: the pytest
    process has torch loaded already, so only a new process can tell what a command imports."""
    script = (
        "import sys\n"
        "from tdiag.cli import main\n"
        "try:\n"
        f"    code = main({argv!r})\n"
        "except SystemExit as stop:\n"
        "    code = stop.code\n"
        "assert code == 0, code\n"
        "print(' '.join(sorted({name.split('.')[0] for name in sys.modules})))\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        cwd=ROOT,
        env=os.environ | {"PYTHONPATH": str(ROOT)},
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    return set(result.stdout.splitlines()[-1].split())


COMMANDS_WITHOUT_A_MODEL = {
    "check": lambda tmp: ["check", *map(str, DESIGN_FILES)],
    "show": lambda tmp: ["show", str(DESIGNS / "thsa.td")],
    "render": lambda tmp: ["render", str(DESIGNS / "thsa.td"), "-o", str(tmp / "thsa.dot")],
    "cost": lambda tmp: ["cost", str(DESIGNS / "mhsa.td"), str(DESIGNS / "thsa.td"), "--at", "N=1024"],
    "compile": lambda tmp: ["compile", str(DESIGNS / "mhsa.td"), "-o", str(tmp / "mhsa_module.py")],
    "plan": lambda tmp: ["plan", str(DESIGNS / "mgk.td"), "--at", "N=512", "--causal"],
    "catalog": lambda tmp: ["catalog", str(DESIGNS / "mhsa.td"), "--at", "N=64", "-o", str(tmp / "designs.md")],
    "help": lambda tmp: ["--help"],
    "train help": lambda tmp: ["train", "--help"],
    "version": lambda tmp: ["--version"],
    "list": lambda tmp: ["list"],
    "bundled by name": lambda tmp: ["check", "fish", "mgk_softe"],
    "space": lambda tmp: [
        "space",
        str(DESIGNS / "spaces" / "mgk.tds"),
        "--at",
        "N=64",
        "--vs",
        "mgk",
        "--write",
        str(tmp),
    ],
}


@pytest.mark.parametrize("command", COMMANDS_WITHOUT_A_MODEL)
def test_commands_that_run_no_model_do_not_import_torch_or_matplotlib(command, tmp_path):
    loaded = modules_after(COMMANDS_WITHOUT_A_MODEL[command](tmp_path))
    assert loaded & {"torch", "matplotlib"} == set()


@pytest.mark.parametrize("command", ["check", "show", "render", "help", "version", "list"])
def test_commands_that_plan_nothing_do_not_import_numpy(command, tmp_path):
    loaded = modules_after(COMMANDS_WITHOUT_A_MODEL[command](tmp_path))
    assert loaded & {"numpy", "opt_einsum"} == set()


# ---- tdiag plan ------------------------------------------------------------------------------


def test_plan_prints_one_row_per_op_with_its_costs_and_the_totals(capsys):
    code, out, _ = run(capsys, "plan", str(DESIGNS / "mhsa.td"), "--at", "N=256")
    rows = [line for line in out.splitlines() if line[:3].strip().isdigit()]
    assert code == 0 and len(rows) == 5
    assert "sdpa" in out and "SDPA kernel: flash" in out
    assert "total:" in out and "FLOPs" in out and "bytes kept for backward" in out


def test_plan_lists_the_rewrites_taken(capsys):
    _, out, _ = run(capsys, "plan", str(DESIGNS / "thsa_elu.td"), "--at", "N=256")
    taken = out.split("rewrites taken:")[1].split("rewrites refused:")[0]
    assert "linear-time order" in taken


def test_plan_says_why_a_rewrite_was_refused(capsys):
    _, out, _ = run(capsys, "plan", str(DESIGNS / "fish.td"), "--at", "N=256")
    refused = out.split("rewrites refused:")[1]
    assert "SDPA refused: no split into query, key and value sides" in refused


def test_plan_of_an_unknown_size_is_a_usage_error(capsys):
    code, _, err = run(capsys, "plan", str(DESIGNS / "mhsa.td"), "--at", "Q=3")
    assert code == 2 and "no size Q" in err


# ---- every flag is checked before any work, with a usage error that names it ------------------

MHSA = str(DESIGNS / "mhsa.td")


@pytest.mark.parametrize(
    ("flags", "named"),
    [
        (["--device", "bogus"], "--device"),
        (["--batch", "0"], "--batch"),
        (["--eval-every", "0"], "--eval-every"),
        (["--eval-batches", "0"], "--eval-batches"),
        (["--lr", "nan"], "--lr"),
        (["--lr", "-1"], "--lr"),
        (["--context", "-1"], "--context"),
        (["--steps", "0"], "--steps"),
        (["--steps", "-1"], "--steps"),
        (["--layers", "0"], "--layers"),
        (["--width", "0"], "--width"),
        (["--heads", "0"], "--heads"),
        (["--nproc", "0"], "--nproc"),
        (["--seed", "-1"], "--seed"),
        (["--seed", str(10**40)], "--seed"),
        (["--resume", ""], "--resume"),
        (["--peak-tflops", "inf"], "--peak-tflops"),
        (["--device", "cuda:99"], "--device"),
    ],
)
def test_a_bad_train_flag_is_a_usage_error_naming_the_flag(capsys, tmp_path, flags, named):
    code, _, err = run(capsys, "train", MHSA, "--out", str(tmp_path / "run"), *flags)
    assert code == 2 and f"argument {named}" in err
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize(("flags", "named"), [(["--device", "bogus"], "--device"), (["--batch", "0"], "--batch")])
def test_a_bad_bench_flag_is_a_usage_error_naming_the_flag(capsys, tmp_path, flags, named):
    code, _, err = run(capsys, "bench", MHSA, "--out", str(tmp_path / "bench"), *flags)
    assert code == 2 and named in err


@pytest.mark.parametrize("command", ["compile", "render"])
@pytest.mark.parametrize("case", ["a folder", "under a file"])
def test_an_output_that_cannot_be_written_is_a_usage_error(capsys, tmp_path, command, case):
    suffix = ".py" if command == "compile" else ".dot"
    (tmp_path / "a_file").write_text("")
    (tmp_path / f"folder{suffix}").mkdir()
    output = tmp_path / f"folder{suffix}" if case == "a folder" else tmp_path / "a_file" / f"out{suffix}"
    code, _, err = run(capsys, command, MHSA, "-o", str(output))
    assert code == 2 and f"-o {output}" in err


@pytest.mark.skipif(os.geteuid() == 0, reason="root writes into read-only folders")
def test_an_output_in_a_read_only_folder_is_a_usage_error(capsys, tmp_path):
    folder = tmp_path / "read_only"
    folder.mkdir()
    folder.chmod(0o500)
    code, _, err = run(capsys, "compile", MHSA, "-o", str(folder / "out.py"))
    folder.chmod(0o700)
    assert code == 2 and "not writable" in err


def test_bench_refuses_an_out_it_cannot_write_before_benchmarking(capsys, tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setattr("tdiag.bench.run", lambda *a, **k: pytest.fail("the benchmark ran"))
    code, _, err = run(capsys, "bench", MHSA, "--out", str(tmp_path / "a_file"))
    assert code == 2 and "--out" in err


def test_output_into_a_closed_pipe_ends_quietly():
    command = [sys.executable, "-m", "tdiag", "check", *map(str, DESIGN_FILES * 20)]
    process = subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, cwd=ROOT, text=True)
    process.stdout.close()  # the reader is gone before the first line (`| head -0`)
    err = process.stderr.read()
    process.wait(timeout=120)
    assert err == "" and process.returncode == 141


# ---- --version and help ----------------------------------------------------------------------


def test_version_prints_the_package_version(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0 and capsys.readouterr().out.strip() == f"tdiag {tdiag.__version__}"


def subcommands() -> dict[str, argparse.ArgumentParser]:
    (choices,) = [a.choices for a in argument_parser()._actions if isinstance(a, argparse._SubParsersAction)]
    return dict(choices)


def flags_of(parser: argparse.ArgumentParser) -> list[argparse.Action]:
    return [a for a in parser._actions if a.option_strings and not isinstance(a, argparse._HelpAction)]


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_optional_flag_has_help_text_that_states_its_default(command):
    parser = subcommands()[command]
    formatter = parser._get_formatter()
    optional = [a for a in flags_of(parser) if not a.required]
    assert [a.option_strings[-1] for a in optional if "default" not in formatter._get_help_string(a)] == []


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_every_flag_and_argument_has_help_text(command):
    actions = [a for a in subcommands()[command]._actions if not isinstance(a, argparse._HelpAction)]
    assert [a.dest for a in actions if not a.help] == []


@pytest.mark.parametrize("command", sorted(c for c, parser in subcommands().items() if flags_of(parser)))
def test_the_help_of_every_subcommand_shows_defaults(command):
    text = subcommands()[command].format_help()
    assert "(default: " in text


def help_entries(parser: argparse.ArgumentParser) -> list[str]:
    """Each option's entry in the printed help: its flag line and the lines its help wraps onto."""
    text = parser.format_help().split("\noptions:\n", 1)[1]
    return [" ".join(entry.split()) for entry in re.split(r"\n(?=  -)", text) if entry.strip()]


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_no_option_of_any_subcommand_shows_its_default_twice(command):
    entries = help_entries(subcommands()[command])
    assert len(entries) == len(flags_of(subcommands()[command])) + 1  # and --help
    assert [entry for entry in entries if entry.lower().count("default") > 1] == []


@pytest.mark.parametrize("command", ["check", "show", "render", "compile"])
def test_set_help_of_one_design_commands_shows_only_the_name_form(command):
    text = subcommands()[command].format_help()
    assert "--set NAME=N" in text and "mgk:D" not in text and "DESIGN:" not in text


def test_set_help_of_train_shows_the_per_design_form():
    text = subcommands()["train"].format_help()
    assert "--set [DESIGN:]NAME=N" in text and "mgk:D=16" in text


def test_a_per_design_size_on_check_is_a_usage_error_naming_the_flag(capsys):
    code, _, err = run(capsys, "check", "fish", "--set", "fish:D=16")
    assert code == 2 and "argument --set: expected NAME=NUMBER" in err


def test_a_bad_value_is_a_usage_error_naming_the_flag(capsys):
    code, _, err = run(capsys, "bench", "mhsa", "--repeat", "zero")
    assert code == 2 and "argument --repeat:" in err


# ---- files: no command writes over what it reads; every file-system failure is one line -------

SPACE = DESIGNS / "spaces" / "mgk.tds"


def one_line(err: str) -> str:
    """The error line of a failed command (check adds its own 'N of M file(s)' summary)."""
    lines = [line for line in err.splitlines() if not line.endswith("file(s) have errors")]
    assert len(lines) == 1, err
    return lines[0]


@pytest.fixture
def inputs(tmp_path):
    """A design a.td in a folder, a design b.td extending it, and links to a.td."""
    (tmp_path / "a.td").write_text((DESIGNS / "mhsa.td").read_text())
    (tmp_path / "b.td").write_text("design b extends a\nsize G = 2\n")
    return tmp_path


WRITES_OVER_AN_INPUT = {
    "compile over its design": lambda t: ["compile", str(t / "a.td"), "-o", str(t / "a.td")],
    "compile over the base it extends": lambda t: ["compile", str(t / "b.td"), "-o", str(t / "a.td")],
    "compile over a symbolic link to it": lambda t: ["compile", str(t / "a.td"), "-o", str(t / "link.py")],
    "compile over a hard link to it": lambda t: ["compile", str(t / "a.td"), "-o", str(t / "hard.py")],
    "compile through a relative path": lambda t: ["compile", str(t / "a.td"), "-o", str(t / ".." / t.name / "a.td")],
    "render over a symbolic link to it": lambda t: ["render", str(t / "a.td"), "-o", str(t / "link.dot")],
    "render over the base it extends": lambda t: ["render", str(t / "b.td"), "-o", str(t / "hard.dot")],
    "catalog over one of its designs": lambda t: ["catalog", str(t), "-o", str(t / "b.td")],
    "catalog over a hard link to one": lambda t: ["catalog", str(t / "a.td"), "-o", str(t / "hard.md")],
}


@pytest.mark.parametrize("case", WRITES_OVER_AN_INPUT)
def test_no_command_writes_over_a_file_it_reads(capsys, inputs, case):
    for suffix in ("py", "dot", "md"):
        (inputs / f"link.{suffix}").symlink_to(inputs / "a.td")
        os.link(inputs / "a.td", inputs / f"hard.{suffix}")
    before = {path: path.read_bytes() for path in inputs.iterdir()}
    code, out, err = run(capsys, *WRITES_OVER_AN_INPUT[case](inputs))
    assert code == 2 and out == ""
    assert "tdiag never writes over a file it reads" in one_line(err)
    assert {path: path.read_bytes() for path in inputs.iterdir()} == before


def test_space_never_plots_over_the_space_it_read(capsys, tmp_path):
    (tmp_path / "mgk.tds").write_text(SPACE.read_text())
    (tmp_path / "plot.png").symlink_to(tmp_path / "mgk.tds")
    code, _, err = run(capsys, "space", str(tmp_path / "mgk.tds"), "--plot", str(tmp_path / "plot.png"))
    assert code == 2 and f"--plot {tmp_path / 'plot.png'}: is the input" in one_line(err)
    assert (tmp_path / "mgk.tds").read_text() == SPACE.read_text()


@pytest.mark.parametrize(
    ("source", "cause"),
    [
        ("/dev/zero", "it is a character device, not a design file"),
        ("fifo.td", "it is a FIFO (named pipe), not a design file"),
        ("folder.td", "it is a folder, not a design file"),
        ("big.td", "it is over 4 MiB, the most a design file may be"),
        ("a_file/x.td", "Not a directory"),
        ("loop.td", "Too many levels of symbolic links"),
        ("x" * 300 + ".td", "File name too long"),
        ("missing/x.td", None),
    ],
)
def test_a_design_that_cannot_be_read_is_one_line_naming_it_and_why(capsys, tmp_path, monkeypatch, source, cause):
    monkeypatch.chdir(tmp_path)
    os.mkfifo("fifo.td")
    os.mkdir("folder.td")
    (tmp_path / "a_file").write_text("")
    (tmp_path / "loop.td").symlink_to("loop.td")
    with open("big.td", "wb") as big:
        big.truncate(4 * 2**20 + 1)
    code, out, err = run(capsys, "check", source)
    expected = f"cannot read '{source}': {cause}" if cause else f"no such design file '{source}'"
    assert code == 1 and out == "" and one_line(err) == f"tdiag: error: {expected}"


@pytest.mark.parametrize("source", ["fifo.tds", "/dev/zero"])
def test_a_space_that_cannot_be_read_is_one_line(capsys, tmp_path, monkeypatch, source):
    monkeypatch.chdir(tmp_path)
    os.mkfifo("fifo.tds")
    code, _, err = run(capsys, "space", source)
    assert code == 1 and one_line(err).startswith(f"tdiag: error: cannot read '{source}': it is a ")


@pytest.mark.parametrize(
    ("output", "cause"),
    [
        ("a_file/out.py", "-o {out}: 'a_file' is a file, not a folder"),
        ("missing/out.py", "-o {out}: folder 'missing' does not exist"),
        ("/dev/null", "-o {out}: is a character device; tdiag writes only regular files"),
        ("/proc/out.py", "cannot write '{out}': "),
        ("/sys/out.py", "cannot write '{out}': "),
    ],
)
def test_an_output_that_cannot_be_written_is_one_line_naming_it_and_why(capsys, tmp_path, monkeypatch, output, cause):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "a_file").write_text("")
    code, out, err = run(capsys, "compile", MHSA, "-o", output)
    assert code in (1, 2) and "wrote" not in out
    assert one_line(err).startswith(f"tdiag: error: {cause.format(out=output)}")
    assert not (tmp_path / "missing").exists()


@pytest.mark.parametrize(
    ("code", "cause"), [(errno.ENOSPC, "No space left on device"), (errno.EFBIG, "File too large")]
)
def test_a_full_disk_is_one_line_and_keeps_the_previous_output(capsys, tmp_path, monkeypatch, code, cause):
    previous = tmp_path / "mhsa.py"
    previous.write_text("# the previous, good module\n")

    def full(descriptor: int, data: bytes) -> int:
        raise OSError(code, os.strerror(code))

    monkeypatch.setattr(os, "write", full)
    status, _, err = run(capsys, "compile", MHSA, "-o", str(previous))
    monkeypatch.undo()
    assert status == 1 and one_line(err) == f"tdiag: error: cannot write '{previous}': {cause}"
    assert previous.read_text() == "# the previous, good module\n" and os.listdir(tmp_path) == ["mhsa.py"]


def test_space_write_into_a_file_is_refused_before_costing(capsys, tmp_path, monkeypatch):
    (tmp_path / "a_file").write_text("")
    monkeypatch.setattr("tdiag.space.report.evaluate", lambda *a, **k: pytest.fail("the space was costed"))
    code, _, err = run(capsys, "space", str(SPACE), "--write", str(tmp_path / "a_file"))
    assert code == 2 and one_line(err) == f"tdiag: error: --write {tmp_path / 'a_file'}: is a file; give a folder"


@pytest.mark.parametrize(
    ("argv", "named"),
    [
        (["cost", "mhsa", "--at", "N=x"], "--at"),
        (["plan", "mhsa", "--at", "N=1e3"], "--at"),
        (["catalog", "designs/mhsa.td", "--at", "N=-1"], "--at"),
        (["compile", "mhsa", "-o", "x.py", "--plan-n", "0"], "--plan-n"),
        (["space", str(SPACE), "--steps", "-1"], "--steps"),
        (["space", str(SPACE), "--train-args", "'--width 64"], "--train-args"),
    ],
)
def test_a_bad_flag_value_is_a_usage_error_naming_the_flag(capsys, argv, named):
    code, _, err = run(capsys, *argv)
    assert code == 2 and f"argument {named}: " in err.splitlines()[0]


@pytest.mark.parametrize(
    ("argv", "code", "message"),
    [
        (["check", ""], 1, "tdiag: error: no such design file ''"),
        (["catalog", ""], 2, "tdiag catalog: error: an empty path is neither a folder nor a .td file"),
    ],
)
def test_an_empty_path_is_not_the_current_folder(capsys, argv, code, message):
    status, _, err = run(capsys, *argv)
    assert status == code and err.splitlines()[0] == message


@pytest.mark.parametrize(
    ("argv", "flag", "guess"),
    [
        (["cost", "mhsa", "--at-n", "1024"], "--at-n", "--at"),
        (["cost", "mhsa", "--form", "json"], "--form", "--format"),
        (["plan", "mhsa", "--caus"], "--caus", "--causal"),
        (["train", "mhsa", "--step", "5", "--data", "no/such/text.txt"], "--step", "--steps"),
        (["train", "mhsa", "--eval-every=2", "--no-prog", "--data", "no/such/text.txt"], "--no-prog", "--no-progress"),
        (["generate", "no/such/run", "--prompt", "To", "--len", "3"], "--len", "--length"),
        (["space", str(SPACE), "--train", "--train-args", "--step 2"], "--step", "--steps"),
    ],
    ids=["cost-at-n", "cost-prefix", "plan-prefix", "train-step", "train-no-prog", "generate-len", "space-train-args"],
)
def test_a_mistyped_or_shortened_flag_is_refused_with_the_commands_closest_flag(capsys, argv, flag, guess):
    code, _, err = run(capsys, *argv)
    assert code == 2 and f"error: unrecognized argument '{flag}'; did you mean '{guess}'?" in err.splitlines()[0]


def test_an_argument_no_command_takes_is_refused_by_name(capsys):
    code, _, err = run(capsys, "show", "mhsa", "extra")
    assert code == 2 and err.splitlines()[0] == "tdiag show: error: unrecognized argument 'extra'"


@pytest.mark.parametrize("command", sorted(subcommands()))
def test_no_parser_takes_a_prefix_of_a_flag_for_the_flag(command):
    assert argument_parser().allow_abbrev is False and subcommands()[command].allow_abbrev is False
