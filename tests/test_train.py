"""Training a language model around a compiled design: data, runs, resume, compare, DDP."""

import csv
import gzip
import json
import math
import os
import re
import subprocess
import sys
import time

import pytest
import torch
from conftest import DESIGNS, ROOT

from tdiag import TdiagError
from tdiag.cli import main
from tdiag.train import TrainConfig, build_model, global_batch, loss_of, peak_flops, read_corpus, sample, train

pytestmark = pytest.mark.slow  # every test here trains or builds a model; `make test-fast` leaves them out

TEXT = ("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 40).strip()


@pytest.fixture
def corpus_file(tmp_path):
    path = tmp_path / "tiny.txt.gz"
    path.write_bytes(gzip.compress(TEXT.encode()))
    return path


def tiny(design: str, data, tmp_path, **changes) -> TrainConfig:
    values = dict(design=str(DESIGNS / design), data=str(data), layers=1, width=16, heads=2, context=16, batch=4,
                  steps=4, eval_every=2, eval_batches=1, out=str(tmp_path / "run"))  # fmt: skip
    return TrainConfig(**(values | changes))


def test_a_run_writes_config_log_checkpoint_plot_and_sample(corpus_file, tmp_path):
    result = train(tiny("mhsa.td", corpus_file, tmp_path), progress=False)
    folder = tmp_path / "run"
    assert {p.name for p in folder.iterdir()} >= {
        "config.json",
        "log.csv",
        "log.jsonl",
        "checkpoint.pt",
        "loss.png",
        "sample.txt",
    }
    assert [e["step"] for e in result["log"]] == [2, 4]
    assert json.loads((folder / "config.json").read_text())["summary"]["flops_per_step"] > 0


def test_the_log_has_the_training_loss_of_every_step(corpus_file, tmp_path):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=5, eval_every=4), progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4, 5]
    assert all(isinstance(r["train_loss"], float) and r["lr"] > 0 for r in rows)
    assert [r["step"] for r in rows if r["val_loss"] is not None] == [4, 5]


def test_the_csv_log_has_a_row_per_step_with_empty_validation_between_evaluations(corpus_file, tmp_path):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=3, eval_every=2), progress=False)
    rows = list(csv.DictReader((tmp_path / "run" / "log.csv").read_text().splitlines()))
    assert [r["step"] for r in rows] == ["1", "2", "3"]
    assert rows[0]["val_loss"] == "" and rows[1]["val_loss"] != "" and rows[0]["train_loss"] != ""


def test_a_resumed_run_keeps_the_steps_before_its_checkpoint(corpus_file, tmp_path):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=4), resume=True, progress=False)
    rows = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [r["step"] for r in rows] == [1, 2, 3, 4]


@pytest.mark.parametrize(("steps", "warmup"), [(5, 1), (50, 5), (300, 30), (2000, 50)])
def test_warm_up_is_at_most_a_tenth_of_the_run(steps, warmup):
    from tdiag.train import learning_rate, warmup_steps

    config = TrainConfig(design="mhsa", steps=steps)
    assert warmup_steps(config) == warmup
    assert learning_rate(warmup - 1, config) == pytest.approx(config.lr)


def test_without_a_terminal_each_evaluation_is_a_plain_line(corpus_file, tmp_path, capsys):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=4, eval_every=2), progress=True)
    out, err = capsys.readouterr()
    lines = [line for line in out.splitlines() if " step " in line]
    assert [line.split(":")[0] for line in lines] == ["mhsa step 2/4", "mhsa step 4/4"]
    assert "val " in lines[0] and "tokens/s" in lines[0] and "\r" not in out + err


EVALUATION_LINE = re.compile(r"mhsa step \d+/\d+: train [\d.]+, val [\d.]+ nats/char, [\d,]+ tokens/s")


def evaluation_lines(out: str) -> list[str]:
    """The `mhsa step 2/4` of each evaluation line printed."""
    return [line.split(":")[0] for line in out.splitlines() if EVALUATION_LINE.fullmatch(line)]


def test_with_no_progress_each_evaluation_is_still_a_line_before_the_final_one(corpus_file, tmp_path, capsys):
    args = ["train", str(DESIGNS / "mhsa.td"), "--data", str(corpus_file), "--layers", "1", "--width", "16"]
    args += ["--heads", "2", "--context", "16", "--batch", "4", "--steps", "4", "--eval-every", "2"]
    assert main([*args, "--eval-batches", "1", "--out", str(tmp_path / "run"), "--no-progress"]) == 0
    out = capsys.readouterr().out
    assert evaluation_lines(out) == ["mhsa step 2/4", "mhsa step 4/4"]
    assert out.splitlines()[-1].startswith("mhsa: validation loss ")


def test_on_a_terminal_each_evaluation_is_a_line_above_the_progress_bar(corpus_file, tmp_path, capsys, monkeypatch):
    monkeypatch.setattr(sys.stderr, "isatty", lambda: True)
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=4, eval_every=2), progress=True)
    out, err = capsys.readouterr()
    assert evaluation_lines(out) == ["mhsa step 2/4", "mhsa step 4/4"] and "4/4" in err  # the bar, on stderr


def test_a_comparison_of_designs_with_different_attention_sizes_says_so():
    from tdiag.train import compare_table

    rows = [
        {"design": d, "attention_parameters": a, "parameters": 1, "flops_per_step": 1.0, "final_val_loss": 2.0}
        | {"tokens_per_s": 1.0, "model_flops_per_s": 1.0, "mfu": None}
        for d, a in (("mhsa", 131072), ("mgk", 327680))
    ]
    assert "attention parameters differ (mhsa 131,072, mgk 327,680)" in compare_table(rows, 3.3)
    assert "differ" not in compare_table(rows[:1], 3.3)


def test_resume_continues_from_the_last_checkpoint(corpus_file, tmp_path):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    result = train(tiny("mhsa.td", corpus_file, tmp_path, steps=4), resume=True, progress=False)
    assert [e["step"] for e in result["log"]] == [2, 4]


def test_resume_from_a_step_equals_training_straight_through(corpus_file, tmp_path):
    straight = train(tiny("mhsa.td", corpus_file, tmp_path / "a", out=str(tmp_path / "a")), progress=False)
    train(tiny("mhsa.td", corpus_file, tmp_path, out=str(tmp_path / "b"), steps=2), progress=False)
    resumed = train(tiny("mhsa.td", corpus_file, tmp_path, out=str(tmp_path / "b")), resume=True, progress=False)
    assert resumed["log"][-1]["val_loss"] == pytest.approx(straight["log"][-1]["val_loss"], abs=1e-6)


def test_compare_writes_one_table_and_plot(corpus_file, tmp_path, capsys):
    args = ["train", "--compare", str(DESIGNS / "mhsa.td"), str(DESIGNS / "skip_right.td"), "--data", str(corpus_file)]
    args += ["--layers", "1", "--width", "16", "--heads", "2", "--context", "16", "--batch", "4", "--steps", "2"]
    args += ["--eval-every", "2", "--eval-batches", "1", "--out", str(tmp_path / "cmp"), "--no-progress"]
    assert main(args) == 0
    assert {p.name for p in (tmp_path / "cmp").iterdir()} >= {
        "compare.md",
        "compare.csv",
        "compare.json",
        "compare.png",
    }
    table = (tmp_path / "cmp" / "compare.md").read_text()
    assert "| mhsa |" in table and "| skip_right |" in table and "Unigram baseline" in table


def test_compare_md_records_the_configuration_the_designs_were_trained_with(corpus_file, tmp_path):
    args = ["train", "--compare", str(DESIGNS / "mhsa.td"), str(DESIGNS / "skip_right.td"), "--data", str(corpus_file)]
    args += ["--layers", "1", "--width", "16", "--heads", "2", "--context", "16", "--batch", "4", "--steps", "2"]
    args += ["--eval-every", "2", "--eval-batches", "1", "--seed", "3", "--out", str(tmp_path / "cmp"), "--no-progress"]
    assert main([*args, "--set", "skip_right:D=4"]) == 0
    table = (tmp_path / "cmp" / "compare.md").read_text()
    settings = table.split("## Configuration\n\n", 1)[1].splitlines()
    assert {"- steps: 2", "- width F: 16", "- context: 16", "- seed: 3", "- layers: 1", "- batch: 4"} <= set(settings)
    assert f"- data: {corpus_file.resolve()}" in settings
    assert "- sizes: mhsa as declared; skip_right D=4" in settings


def test_a_setting_the_compared_designs_do_not_share_is_given_per_design():
    from tdiag.train import configuration_lines

    configs = [
        {"design": "mhsa", "steps": 2, "seed": 0},
        {"design": "/x/mgk.td", "steps": 2, "seed": 1, "sizes": {"M": 1}},
    ]
    lines = configuration_lines(configs)
    assert "- steps: 2" in lines and "- seed: mhsa 0; mgk 1" in lines and "- sizes: mhsa as declared; mgk M=1" in lines


def test_compare_over_seeds_gives_each_designs_mean_and_spread_and_marks_a_difference_within_it(corpus_file, tmp_path):
    args = ["train", "--compare", str(DESIGNS / "mhsa.td"), str(DESIGNS / "skip_right.td"), "--data", str(corpus_file)]
    args += ["--layers", "1", "--width", "16", "--heads", "2", "--context", "16", "--batch", "4", "--steps", "2"]
    args += ["--eval-every", "2", "--eval-batches", "1", "--seed", "5", "--out", str(tmp_path / "cmp"), "--no-progress"]
    assert main([*args, "--seeds", "2"]) == 0
    runs = json.loads((tmp_path / "cmp" / "compare.json").read_text())["rows"]
    loss = {(r["design"], r["seed"]): r["final_val_loss"] for r in runs}
    assert set(loss) == {(d, s) for d in ("mhsa", "skip_right") for s in (5, 6)}
    assert (tmp_path / "cmp" / "skip_right-seed6" / "checkpoint.pt").is_file()
    table = (tmp_path / "cmp" / "compare.md").read_text()
    rows = {line.split(" | ")[0].strip("| "): line.split(" | ") for line in table.splitlines() if line.startswith("| ")}
    for design in ("mhsa", "skip_right"):
        values = [loss[design, 5], loss[design, 6]]
        assert rows[design][1] == "2"
        assert rows[design][5] == f"{sum(values) / 2:.4f} ± {abs(values[0] - values[1]) / 2**0.5:.4f}"
    assert "- seeds: 5, 6" in table


def test_a_difference_no_larger_than_the_two_spreads_is_marked_within_the_spread():
    from tdiag.train import compare_table

    row = {"attention_parameters": 1, "parameters": 1, "flops_per_step": 1.0, "tokens_per_s": 1.0}
    losses = {"a": (2.0, 2.2), "b": (2.25, 2.35), "c": (3.0, 3.02)}  # means 2.1, 2.3, 3.01; sd 0.141, 0.071, 0.014
    rows = [row | {"design": d, "final_val_loss": v} for d, pair in losses.items() for v in pair]
    configs = [{"design": d, "seed": s} for d in losses for s in (0, 1)]
    lines = {line.split(" | ")[0].strip("| "): line for line in compare_table(rows, 3.3, configs).splitlines()}
    assert (
        "| lowest |" in lines["a"] and "| +0.2000 (within the spread) |" in lines["b"] and "| +0.9100 |" in lines["c"]
    )


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--seeds", "2"], "--seeds is for --compare"),
        (["--compare", "--seeds", "2", "--seed", str(2**63 - 1 - 2**20)], "seeds go past"),
    ],
)
def test_seeds_beyond_one_design_or_the_seed_range_are_a_usage_error(capsys, flags, message):
    designs = [str(DESIGNS / "mhsa.td")] + ([str(DESIGNS / "thsa.td")] if "--compare" in flags else [])
    assert main(["train", *designs, *flags]) == 2
    assert message in capsys.readouterr().err


def test_compare_applies_a_size_to_the_designs_that_have_it_and_a_design_size_to_that_design(corpus_file, tmp_path):
    args = ["train", "--compare", str(DESIGNS / "mhsa.td"), str(DESIGNS / "mgk.td"), "--data", str(corpus_file)]
    args += ["--layers", "1", "--width", "16", "--heads", "2", "--context", "16", "--batch", "4", "--steps", "1"]
    args += ["--eval-every", "1", "--eval-batches", "1", "--out", str(tmp_path / "cmp"), "--no-progress"]
    assert main([*args, "--set", "M=1", "--set", "mgk:D=4"]) == 0
    sizes = {d: json.loads((tmp_path / "cmp" / d / "config.json").read_text())["sizes"] for d in ("mhsa", "mgk")}
    assert sizes == {"mhsa": {}, "mgk": {"M": 1, "D": 4}}


@pytest.mark.parametrize(
    ("setting", "message"),
    [("Q=3", "no design has a size Q"), ("gpt:D=3", "no design 'gpt' among mgk, mhsa")],
)
def test_compare_rejects_a_size_no_design_has(setting, message, capsys):
    designs = [str(DESIGNS / "mhsa.td"), str(DESIGNS / "mgk.td")]
    assert main(["train", "--compare", *designs, "--set", setting]) == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize("design", ["fish.td", "mgk.td", "mlk.td", "thsa.td"])
def test_any_design_trains_and_lowers_the_loss(design, corpus_file, tmp_path):
    config = tiny(
        design, corpus_file, tmp_path, steps=30, eval_every=30, lr=1e-2, sizes={"D": 4} if "m" in design[:3] else {}
    )
    result = train(config, progress=False)
    assert result["final_val_loss"] < result["unigram_val_loss"]


def test_each_evaluation_logs_model_flops_per_second_and_mfu_against_a_given_peak(corpus_file, tmp_path):
    result = train(tiny("mhsa.td", corpus_file, tmp_path, peak_tflops=1.0), progress=False)
    for entry in result["log"]:
        assert entry["model_flops_per_s"] > 0
        assert entry["mfu"] == pytest.approx(entry["model_flops_per_s"] / 1e12)


def test_mfu_is_not_reported_on_a_cpu_without_a_given_peak(corpus_file, tmp_path):
    result = train(tiny("mhsa.td", corpus_file, tmp_path), progress=False)
    assert result["mfu"] is None and result["peak_flops_per_s"] is None and result["model_flops_per_s"] > 0


@pytest.mark.parametrize(
    ("name", "tflops"),
    [("NVIDIA H100 80GB HBM3", 989.4), ("NVIDIA H100 PCIe", 756.0), ("NVIDIA A100-SXM4-40GB", 312.0), ("Tesla T4", 0)],
)
def test_peak_flops_of_a_gpu_come_from_its_name(monkeypatch, name, tflops):
    monkeypatch.setattr(torch.cuda, "get_device_name", lambda device=None: name)
    assert peak_flops(torch.device("cuda", 0)) == pytest.approx(tflops * 1e12)


def test_a_run_with_torch_compile_trains(corpus_file, tmp_path):
    result = train(tiny("mhsa.td", corpus_file, tmp_path, compile=True, steps=2, eval_every=2), progress=False)
    assert math.isfinite(result["final_val_loss"])


def test_missing_and_empty_data_files_are_clear_errors(tmp_path):
    with pytest.raises(TdiagError, match="no data file"):
        read_corpus(str(tmp_path / "nope.txt"), 16)
    (tmp_path / "empty.txt").write_text("  \n")
    with pytest.raises(TdiagError, match="is empty"):
        read_corpus(str(tmp_path / "empty.txt"), 16)


@pytest.mark.parametrize(("make", "kind"), [(os.mkdir, "a folder"), (os.mkfifo, "a FIFO (named pipe)")])
def test_a_data_path_that_is_not_a_regular_file_is_refused_without_being_opened(tmp_path, make, kind):
    make(tmp_path / "data")
    with pytest.raises(TdiagError, match=rf"cannot read data file '.*data': it is {re.escape(kind)}, not a text file"):
        read_corpus(str(tmp_path / "data"), 16)


def test_context_longer_than_the_data_is_a_clear_error(corpus_file):
    with pytest.raises(TdiagError, match="longer than the validation text"):
        read_corpus(str(corpus_file), 10_000)


def test_a_design_whose_width_is_not_the_model_width_is_a_clear_error(corpus_file, tmp_path):
    config = tiny("mhsa.td", corpus_file, tmp_path, sizes={"F": 32})
    with pytest.raises(TdiagError, match="maps width \\[32\\] but the model width is 16"):
        build_model(config, 10, torch.device("cpu"))


def test_train_cli_reports_bad_input_without_a_traceback(tmp_path, capsys):
    assert main(["train", str(DESIGNS / "mhsa.td"), "--data", str(tmp_path / "nope.txt"), "--no-progress"]) == 1
    assert "no data file" in capsys.readouterr().err


DDP_SCRIPT = """
import json, os, sys, torch, torch.distributed as dist
from tdiag.train import TrainConfig, build_model, global_batch, leave_process, loss_of, read_corpus
config = TrainConfig(**json.loads(sys.argv[1]))
rank = int(os.environ["RANK"])
# a file rendezvous: no TCP port to choose, so none that another process can take first
dist.init_process_group("gloo", init_method="file://" + sys.argv[3], rank=rank, world_size=2)
world = dist.get_world_size()
corpus = read_corpus(config.data, config.context)
model, _ = build_model(config, corpus.vocab, torch.device("cpu"))
ddp = torch.nn.parallel.DistributedDataParallel(model)
x, y = global_batch(torch.Generator().manual_seed(7), corpus.train, config, rank, world)
loss_of(ddp, x, y, torch.device("cpu")).backward()
if rank == 0:
    torch.save({n: p.grad for n, p in model.named_parameters()}, sys.argv[2])
dist.barrier()  # neither process tears the group down while the other still uses it
dist.destroy_process_group()
leave_process(0)  # as tdiag's torchrun workers do: no interpreter finalization for gloo to abort
"""


def test_two_process_ddp_gradients_equal_one_process_on_the_same_global_batch(corpus_file, tmp_path):
    config = tiny("thsa.td", corpus_file, tmp_path)
    fields = {k: getattr(config, k) for k in ("design", "data", "layers", "width", "heads", "context", "batch")}
    script = tmp_path / "ddp_step.py"
    script.write_text(DDP_SCRIPT)
    env = os.environ | {"WORLD_SIZE": "2", "PYTHONPATH": str(ROOT)}
    command = [sys.executable, "-X", "faulthandler", str(script), json.dumps(fields), str(tmp_path / "grads.pt")]
    processes = [
        subprocess.Popen(
            [*command, str(tmp_path / "rendezvous")],
            env=env | {"RANK": str(r)},
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
        )
        for r in range(2)
    ]
    try:
        outputs = [p.communicate(timeout=300)[0] for p in processes]
    finally:
        for p in processes:
            p.kill()  # no-op once a process has ended; never leaves one waiting for its peer
    codes = [p.returncode for p in processes]  # a negative code is the signal that ended it
    assert codes == [0, 0], f"exit codes {codes}:\n" + "\n".join(outputs)[-4000:]
    distributed = torch.load(tmp_path / "grads.pt")

    corpus = read_corpus(config.data, config.context)
    model, _ = build_model(config, corpus.vocab, torch.device("cpu"))
    x, y = global_batch(torch.Generator().manual_seed(7), corpus.train, config, 0, 1)
    loss_of(model, x, y, torch.device("cpu")).backward()
    for name, param in model.named_parameters():
        assert torch.allclose(distributed[name], param.grad, atol=1e-6, rtol=1e-5), name


def test_train_with_two_processes_ends_with_exit_code_zero_and_one_run_folder(corpus_file, tmp_path):
    out = tmp_path / "run"
    flags = ["--data", str(corpus_file), "--layers", "1", "--width", "16", "--heads", "2", "--context", "16"]
    flags += ["--batch", "4", "--steps", "2", "--eval-every", "2", "--eval-batches", "1", "--no-progress"]
    command = [sys.executable, "-m", "tdiag", "train", str(DESIGNS / "mhsa.td"), "--nproc", "2", "--out", str(out)]
    command += flags
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert json.loads((out / "summary.json").read_text())["design"] == "mhsa"


def test_compare_with_two_processes_trains_every_design_in_one_process_group(corpus_file, tmp_path):
    out = tmp_path / "compare"
    flags = ["--data", str(corpus_file), "--layers", "1", "--width", "16", "--heads", "2", "--context", "16"]
    flags += ["--batch", "4", "--steps", "2", "--eval-every", "2", "--eval-batches", "1", "--no-progress"]
    command = [sys.executable, "-m", "tdiag", "train", "--compare", "mhsa", "thsa", "--nproc", "2", "--out", str(out)]
    env = os.environ | {"PYTHONPATH": str(ROOT)}
    done = subprocess.run(command + flags, env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stdout[-2000:] + done.stderr[-4000:]
    assert done.stdout.count("| mhsa |") == 1  # one report, from the main process
    assert [row["design"] for row in json.loads((out / "compare.json").read_text())["rows"]] == ["mhsa", "thsa"]


def test_example_script_trains_a_compiled_module_without_importing_tdiag(corpus_file, tmp_path):
    example = ROOT / "examples" / "train_shakespeare.py"
    imports = [line for line in example.read_text().splitlines() if line.startswith(("import ", "from "))]
    assert imports and not any("tdiag" in line for line in imports)
    module = tmp_path / "mhsa_module.py"
    assert (
        main(
            [
                "compile",
                str(DESIGNS / "mhsa.td"),
                "--causal",
                "--set",
                "F=16",
                "--set",
                "H=2",
                "--plan-n",
                "16",
                "-o",
                str(module),
            ]
        )
        == 0
    )
    result = subprocess.run(
        [sys.executable, str(example), str(module), "--data", str(corpus_file), "--width", "16", "--context", "16",
         "--layers", "1", "--batch", "4", "--steps", "2"],
        capture_output=True, text=True, timeout=120, env=os.environ | {"PYTHONPATH": ""},
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "step     2" in result.stdout


def test_a_terminated_run_keeps_every_completed_step_and_resumes(corpus_file, tmp_path):
    folder = tmp_path / "killed"
    flags = ["--layers", "1", "--width", "16", "--heads", "2", "--context", "16", "--batch", "4"]
    flags += ["--steps", "100000", "--eval-every", "100000", "--out", str(folder), "--no-progress"]
    command = [sys.executable, "-m", "tdiag.train", str(DESIGNS / "mhsa.td"), "--data", str(corpus_file), *flags]
    process = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
    for _ in range(120):
        if (folder / "config.json").exists():
            break
        time.sleep(0.5)
    time.sleep(2)  # some steps complete
    process.terminate()
    _, err = process.communicate(timeout=60)
    assert process.returncode == 1 and "training interrupted at step" in err and "Traceback" not in err
    saved = torch.load(folder / "checkpoint.pt", weights_only=True)["step"]
    assert saved > 0
    assert main(["train", "--resume", str(folder), "--steps", str(saved + 2), "--no-progress"]) == 0


# ---- run folders: never overwritten by accident, never unpickled into code ---------------------


def test_a_folder_holding_a_run_is_refused_without_resume_or_overwrite(corpus_file, tmp_path):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    before = (tmp_path / "run" / "checkpoint.pt").read_bytes()
    with pytest.raises(TdiagError, match="already holds a run") as error:
        train(tiny("thsa.td", corpus_file, tmp_path, steps=2), progress=False)
    assert "--overwrite" in str(error.value) and "--resume" in str(error.value)
    assert (tmp_path / "run" / "checkpoint.pt").read_bytes() == before


def test_overwrite_removes_the_old_run_before_the_new_one_starts(corpus_file, tmp_path, monkeypatch):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    monkeypatch.setattr("tdiag.train.build_model", lambda *a: (_ for _ in ()).throw(KeyboardInterrupt))
    with pytest.raises(KeyboardInterrupt):  # killed before its first evaluation
        train(tiny("thsa.td", corpus_file, tmp_path, steps=2), overwrite=True, progress=False)
    assert not (tmp_path / "run" / "checkpoint.pt").exists()  # no checkpoint of another design stays behind


def test_the_cli_refuses_a_run_folder_in_use_and_names_overwrite(corpus_file, tmp_path, capsys):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    argv = ["train", str(DESIGNS / "thsa.td"), "--data", str(corpus_file), "--out", str(tmp_path / "run")]
    assert main([*argv, "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert "already holds a run" in err and "--overwrite" in err and "Traceback" not in err


class _RunsCodeWhenUnpickled:
    def __init__(self, path):
        self.path = path

    def __reduce__(self):
        return (open, (self.path, "w"))


def test_resume_never_unpickles_code_from_a_checkpoint(corpus_file, tmp_path):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    state = torch.load(checkpoint, weights_only=True)
    torch.save(state | {"log": [_RunsCodeWhenUnpickled(str(tmp_path / "PWNED"))]}, checkpoint)
    with pytest.raises(TdiagError, match="cannot read checkpoint"):
        train(tiny("mhsa.td", corpus_file, tmp_path, steps=4), resume=True, progress=False)
    assert not (tmp_path / "PWNED").exists()


@pytest.mark.parametrize(
    "damage",
    [lambda b: b[: len(b) // 2], lambda b: b"", lambda b: b"not a checkpoint", lambda b: b[:100] + b"\0" * 64],
    ids=["truncated", "empty", "text", "zeroed"],
)
def test_a_damaged_checkpoint_is_a_clear_error_and_is_left_as_it_was(corpus_file, tmp_path, damage, capsys):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    checkpoint = tmp_path / "run" / "checkpoint.pt"
    checkpoint.write_bytes(damage(checkpoint.read_bytes()))
    damaged = checkpoint.read_bytes()
    assert main(["train", "--resume", str(tmp_path / "run"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"cannot read checkpoint '{checkpoint}': it is damaged or truncated" in err and "Traceback" not in err
    assert checkpoint.read_bytes() == damaged


def test_a_checkpoint_of_another_design_is_a_clear_error(corpus_file, tmp_path):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    train(tiny("thsa.td", corpus_file, tmp_path / "other", out=str(tmp_path / "other"), steps=2), progress=False)
    (tmp_path / "other" / "checkpoint.pt").replace(tmp_path / "run" / "checkpoint.pt")
    with pytest.raises(TdiagError, match="are of different runs"):
        train(tiny("mhsa.td", corpus_file, tmp_path, steps=4), resume=True, progress=False)


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("{not json", "cannot read"),
        ("[1, 2]", "expected a JSON object"),
        ('{"design": "x.td", "colour": 3}', "unknown setting 'colour'"),
        ('{"design": "x.td", "batch": 0}', "batch: expected a positive whole number"),
        ('{"design": "x.td", "lr": "fast"}', "lr is 'fast', not a number"),
        ('{"batch": 4}', "missing setting 'design'"),
    ],
)
def test_a_broken_config_json_is_a_clear_error_on_resume(tmp_path, capsys, text, message):
    (tmp_path / "config.json").write_text(text)
    assert main(["train", "--resume", str(tmp_path), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert (tmp_path / "config.json").read_text() == text


def test_a_failed_checkpoint_write_leaves_the_previous_checkpoint(tmp_path, monkeypatch):
    from tdiag.train import write_atomically

    path = tmp_path / "checkpoint.pt"
    path.write_bytes(b"previous")

    def disk_full(fd):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(os, "fsync", disk_full)
    with pytest.raises(OSError):
        write_atomically(path, b"next")
    assert path.read_bytes() == b"previous"
    assert [p.name for p in tmp_path.iterdir()] == ["checkpoint.pt"]


# ---- one run per folder: the lock --------------------------------------------------------------

HOLD_FOLDER = """
import sys, time
from pathlib import Path
from tdiag.runs import claim_folder
claim_folder(Path(sys.argv[1]), resume=True, overwrite=False)
print("held", flush=True)
time.sleep(600)
"""


def _held_by_another_process(folder):
    folder.mkdir(parents=True, exist_ok=True)
    command = [sys.executable, "-c", HOLD_FOLDER, str(folder)]
    holder = subprocess.Popen(command, stdout=subprocess.PIPE, text=True, env=os.environ | {"PYTHONPATH": str(ROOT)})
    assert holder.stdout.readline().strip() == "held"
    return holder


def test_a_folder_another_process_holds_is_refused_by_name_and_free_once_that_process_is_killed(
    corpus_file, tmp_path, capsys
):
    folder = tmp_path / "run"
    holder = _held_by_another_process(folder)
    try:
        argv = ["train", str(DESIGNS / "mhsa.td"), "--data", str(corpus_file), "--out", str(folder), "--no-progress"]
        assert main(argv) == 1
        err = capsys.readouterr().err
        assert f"run folder '{folder}' is in use: another tdiag train holds it (process {holder.pid})" in err
        assert "Traceback" not in err and not (folder / "config.json").exists()
    finally:
        holder.kill()
        holder.wait()
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)  # SIGKILL released the lock
    assert (folder / "checkpoint.pt").exists()


def test_a_finished_run_releases_its_folder(corpus_file, tmp_path):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    holder = _held_by_another_process(tmp_path / "run")
    holder.kill()
    holder.wait()


def test_a_file_system_without_locks_is_a_one_line_error_not_a_folder_in_use(tmp_path, monkeypatch):
    import errno
    import fcntl

    from tdiag.train import claim_folder

    def no_locks(descriptor, operation):
        raise OSError(errno.ENOLCK, os.strerror(errno.ENOLCK))

    monkeypatch.setattr(fcntl, "flock", no_locks)
    with pytest.raises(TdiagError, match=f"cannot lock run folder '{tmp_path / 'run'}': No locks available"):
        claim_folder(tmp_path / "run", resume=False, overwrite=False)


def test_compare_claims_every_designs_folder_before_the_first_design_trains(corpus_file, tmp_path, capsys):
    holder = _held_by_another_process(tmp_path / "cmp" / "thsa")
    try:
        argv = ["train", "--compare", "mhsa", "thsa", "--data", str(corpus_file), "--layers", "1", "--width", "16"]
        argv += ["--heads", "2", "--context", "16", "--batch", "4", "--steps", "2", "--out", str(tmp_path / "cmp")]
        assert main([*argv, "--no-progress"]) == 1
    finally:
        holder.kill()
        holder.wait()
    assert "is in use: another tdiag train holds it" in capsys.readouterr().err
    assert not (tmp_path / "cmp" / "mhsa" / "checkpoint.pt").exists()


# ---- Ctrl-C, SIGTERM and resume: the same steps as an uninterrupted run --------------------------


def _final(folder):
    state = torch.load(folder / "checkpoint.pt", weights_only=True)
    log = [{k: e[k] for k in ("step", "train_loss", "val_loss", "flops")} for e in state["log"]]
    return state["model"], log


def _interrupt_on_call(function, call):
    """`function`, raising KeyboardInterrupt once, on its `call`-th call, after it has done its work."""
    calls = []

    def interrupted(*args, **kwargs):
        result = function(*args, **kwargs)
        calls.append(None)
        if len(calls) == call:
            raise KeyboardInterrupt
        return result

    return interrupted


@pytest.mark.parametrize(
    ("target", "call", "kept"),
    [
        ("tdiag.train.global_batch", 4, 3),  # the batch of step 4 drawn, nothing updated
        ("torch.nn.utils.clip_grad_norm_", 3, 2),  # the gradients of step 3 computed
        ("tdiag.train.evaluate", 2, 2),  # step 4 updated, its evaluation cut: the last whole state is step 2
    ],
    ids=["after-drawing-a-batch", "after-backward", "inside-an-evaluation"],
)
def test_interrupted_and_resumed_equals_uninterrupted_bit_for_bit(
    corpus_file, tmp_path, monkeypatch, target, call, kept
):
    straight = tiny("fish.td", corpus_file, tmp_path, out=str(tmp_path / "straight"), steps=6)
    train(straight, progress=False)  # fish draws Gaussian noise from torch's generator in every step
    config = tiny("fish.td", corpus_file, tmp_path, out=str(tmp_path / "cut"), steps=6)
    module, name = target.rsplit(".", 1)
    with monkeypatch.context() as patch:
        patch.setattr(f"{module}.{name}", _interrupt_on_call(getattr(__import__(module, fromlist=[name]), name), call))
        with pytest.raises(TdiagError, match="training interrupted"):
            train(config, progress=False)
    assert torch.load(tmp_path / "cut" / "checkpoint.pt", weights_only=True)["step"] == kept
    train(config, resume=True, progress=False)
    (resumed, resumed_log), (uninterrupted, log) = _final(tmp_path / "cut"), _final(tmp_path / "straight")
    assert resumed_log == log
    assert all(torch.equal(resumed[k], uninterrupted[k]) for k in uninterrupted)


def test_a_signal_during_an_update_stops_the_run_only_once_the_update_is_done():
    import signal

    from tdiag.train import _Interrupts

    finished = []
    with _Interrupts() as interrupts, pytest.raises(KeyboardInterrupt):
        with interrupts.held():
            os.kill(os.getpid(), signal.SIGTERM)
            finished.append("update")
        finished.append("next step")
    assert finished == ["update"]


# ---- resume: every flag given is applied or refused by name -------------------------------------


def _resume(folder, *flags):
    return main(["train", "--resume", str(folder), "--no-progress", *flags])


def test_a_resumable_flag_given_at_its_default_value_is_applied(corpus_file, tmp_path):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2, eval_every=1), progress=False)
    assert _resume(tmp_path / "run", "--steps", "4", "--eval-every", "200") == 0  # 200: the flag's default
    log = [json.loads(line) for line in (tmp_path / "run" / "log.jsonl").read_text().splitlines()]
    assert [e["step"] for e in log if e["val_loss"] is not None] == [1, 2, 4]
    assert json.loads((tmp_path / "run" / "config.json").read_text())["eval_every"] == 200


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--lr", "0.001"], "--lr cannot change on resume: the run was started with lr=0.003"),
        (["--seed", "0", "--batch", "8"], "--batch cannot change on resume: the run was started with batch=4"),
        (["--set", "F=32"], "--set cannot change on resume: the run was started with sizes=(none)"),
        (["--objective", "memory"], "--objective cannot change on resume: the run was started with objective=time"),
        (["thsa"], "the design cannot change on resume: the run was started with design="),
        (["--out", "elsewhere"], "--out cannot change on resume: the run's folder is"),
        (["--overwrite"], "--overwrite cannot go with it"),
    ],
)
def test_a_flag_that_would_change_a_run_on_resume_is_refused_by_name(corpus_file, tmp_path, capsys, flags, message):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    assert _resume(tmp_path / "run", *flags) == 2
    err = capsys.readouterr().err
    assert message in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()} == before


def test_a_flag_equal_to_the_runs_own_value_is_accepted_on_resume(corpus_file, tmp_path):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    flags = ["--lr", "0.003", "--batch", "4", "--data", str(corpus_file), "--steps", "4", str(DESIGNS / "mhsa.td")]
    assert _resume(tmp_path / "run", *flags) == 0


def test_fewer_steps_than_the_run_has_completed_is_refused_on_resume(corpus_file, tmp_path, capsys):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=4), progress=False)
    assert _resume(tmp_path / "run", "--steps", "2") == 1
    assert "has completed 4 steps, more than --steps 2" in capsys.readouterr().err
    assert json.loads((tmp_path / "run" / "config.json").read_text())["steps"] == 4


# ---- crafted or damaged run files: one line naming the file and the field, nothing written ----


def _edit_checkpoint(folder, edit):
    path = folder / "checkpoint.pt"
    state = torch.load(path, weights_only=True)
    edit(state)
    torch.save(state, path)


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.update(generator=s["generator"][:100]), "generator is a generator state of 100 bytes"),
        (lambda s: s.update(rng="seed"), "rng is not a generator state"),
        (lambda s: s.update(step=-3), "step is -3, not a whole number >= 0"),
        (lambda s: s.update(step="2"), "step is '2', not a whole number >= 0"),
        (lambda s: s.update(log=[{"step": 2}]), "log[0] is not an evaluation record"),
        (lambda s: s.update(log={"step": 2}), "log is a dict, not a list"),
        (lambda s: s["log"][0].update(val_loss="low"), "log[0] holds a value that is not a number"),
        (lambda s: s["log"][0].update(step=9), "log[0] is of step 9, out of order or after the checkpoint's step 2"),
        (lambda s: s.pop("rng"), "not a tdiag checkpoint"),
        (lambda s: s.update(extra=1), "not a tdiag checkpoint"),
        (lambda s: s["config"].update(lr=0.1), "are of different runs (lr: 0.1 in the checkpoint"),
        (lambda s: s["model"].update({"head.weight": s["model"]["head.weight"].double()}), "model entry 'head.weight'"),
        (lambda s: s["optimizer"]["param_groups"][0].update(weight_decay=0.5), "optimizer settings"),
        (lambda s: s["optimizer"]["state"][0].update(exp_avg=torch.zeros(3)), "optimizer state 'exp_avg'"),
    ],
)
def test_a_crafted_checkpoint_is_refused_naming_the_file_and_the_field(corpus_file, tmp_path, capsys, edit, message):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    _edit_checkpoint(tmp_path / "run", edit)
    before = {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()}
    assert _resume(tmp_path / "run", "--steps", "4") == 1
    err = capsys.readouterr().err
    assert f"checkpoint '{tmp_path / 'run' / 'checkpoint.pt'}': " in err and message in err and "Traceback" not in err
    assert {p.name: p.read_bytes() for p in (tmp_path / "run").iterdir() if p.is_file()} == before


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda c: c.update(objective="bogus"), "objective: unknown objective 'bogus'"),
        (lambda c: c.pop("lr"), "missing setting 'lr'"),
        (lambda c: c.update(steps="many"), "steps is 'many', not a whole number"),
        (lambda c: c.update(compile="yes"), "compile is 'yes', not true or false"),
        (lambda c: c.update(seed=10**40), "seed: expected a whole number at most"),
        (lambda c: c.pop("design_copy"), "missing setting 'design_copy'"),
        (lambda c: c.update(data_sha256=7), "data_sha256 is 7, not a sha256"),
        (lambda c: c["design_copy"].update(file="../../x.td"), "design_copy.sha256 does not list design_copy.file"),
    ],
)
def test_an_edited_config_json_is_refused_naming_the_field(corpus_file, tmp_path, capsys, edit, message):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    path = tmp_path / "run" / "config.json"
    saved = json.loads(path.read_text())
    edit(saved)
    path.write_text(json.dumps(saved))
    assert _resume(tmp_path / "run", "--steps", "4") == 1
    err = capsys.readouterr().err
    assert f"'{path}' is not a valid run config" in err and message in err and "Traceback" not in err
    assert json.loads(path.read_text()) == saved


# ---- the design travels with the run -----------------------------------------------------------


def test_a_run_started_with_a_relative_design_path_resumes_from_elsewhere_after_the_design_moved(
    corpus_file, tmp_path, monkeypatch
):
    source = tmp_path / "mine"
    source.mkdir()
    for name in ("fish.td", "hard_fish.td"):  # fish extends hard_fish: the run keeps both
        (source / name).write_text((DESIGNS / name).read_text())
    monkeypatch.chdir(source)
    argv = ["train", "fish.td", "--data", str(corpus_file), "--layers", "1", "--width", "16", "--heads", "2"]
    argv += ["--context", "16", "--batch", "4", "--steps", "2", "--out", str(tmp_path / "run"), "--no-progress"]
    assert main(argv) == 0
    assert json.loads((tmp_path / "run" / "config.json").read_text())["design"] == str(source / "fish.td")
    source.rename(tmp_path / "moved")
    monkeypatch.chdir(tmp_path)
    assert _resume(tmp_path / "run", "--steps", "4") == 0
    assert json.loads((tmp_path / "run" / "summary.json").read_text())["design"] == "fish"


def test_overwrite_replaces_the_design_copy_with_the_new_designs_files(corpus_file, tmp_path):
    train(tiny("fish.td", corpus_file, tmp_path, steps=1), progress=False)
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=1), overwrite=True, progress=False)
    assert sorted(p.name for p in (tmp_path / "run" / "design").iterdir()) == ["mhsa.td"]


def test_a_bundled_design_is_recorded_by_name(corpus_file, tmp_path):
    config = tiny("mhsa.td", corpus_file, tmp_path, steps=1)
    config.design = "mhsa"
    train(config, progress=False)
    assert json.loads((tmp_path / "run" / "config.json").read_text())["design"] == "mhsa"


def test_a_run_stopped_before_its_first_checkpoint_resumes_from_step_zero(corpus_file, tmp_path):
    straight = tiny("mhsa.td", corpus_file, tmp_path, out=str(tmp_path / "straight"))
    train(straight, progress=False)
    train(tiny("mhsa.td", corpus_file, tmp_path), progress=False)
    folder = tmp_path / "run"
    for path in folder.iterdir():  # as a run killed after writing config.json and its design copy leaves it
        if path.is_file() and path.name != "config.json":
            path.unlink()
    assert _resume(folder) == 0
    model, log = _final(folder)
    expected_model, expected_log = _final(tmp_path / "straight")
    assert log == expected_log and all(torch.equal(model[k], expected_model[k]) for k in expected_model)


def test_a_run_whose_checkpoint_is_gone_but_whose_log_remains_is_not_restarted(corpus_file, tmp_path, capsys):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    (tmp_path / "run" / "checkpoint.pt").unlink()
    log = (tmp_path / "run" / "log.jsonl").read_bytes()
    assert _resume(tmp_path / "run", "--steps", "4") == 1
    assert f"no checkpoint to resume in '{tmp_path / 'run'}'" in capsys.readouterr().err
    assert (tmp_path / "run" / "log.jsonl").read_bytes() == log


def test_a_design_copy_replaced_by_a_fifo_is_refused_without_blocking(corpus_file, tmp_path, capsys):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    copy = tmp_path / "run" / "design" / "mhsa.td"
    copy.unlink()
    os.mkfifo(copy)
    assert _resume(tmp_path / "run", "--steps", "4") == 1
    assert f"cannot read '{copy}': it is a FIFO (named pipe)" in capsys.readouterr().err


def test_a_diverged_model_samples_until_its_outputs_are_not_finite_and_says_so(corpus_file, tmp_path):
    config = tiny("mhsa.td", corpus_file, tmp_path)
    corpus = read_corpus(config.data, config.context)
    model, _ = build_model(config, corpus.vocab, torch.device("cpu"))
    with torch.no_grad():
        model.head.weight.fill_(math.nan)
    assert sample(model, corpus, config, torch.device("cpu")) == (
        "\n[sampling stopped: the model's outputs are not finite numbers; the run diverged, try a lower --lr]\n"
    )


def test_a_model_too_large_for_memory_is_refused_before_its_layers_are_built(corpus_file, tmp_path, capsys):
    argv = ["train", "mhsa", "--data", str(corpus_file), "--out", str(tmp_path / "run"), "--no-progress"]
    assert main([*argv, "--layers", str(10**12), "--width", "16", "--heads", "2", "--context", "16"]) == 1
    err = capsys.readouterr().err
    assert "the model (1,000,000,000,000 layers of width 16, " in err and "more than the" in err
    assert "use fewer --layers" in err and "Traceback" not in err


def test_an_edited_design_copy_is_refused_on_resume(corpus_file, tmp_path, capsys):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    copy = tmp_path / "run" / "design" / "mhsa.td"
    copy.write_text(copy.read_text() + "\n# edited\n")
    assert _resume(tmp_path / "run", "--steps", "4") == 1
    assert f"the run's design copy '{copy}' differs from the design the run was started with" in capsys.readouterr().err


def test_a_data_file_changed_since_the_run_started_is_refused_on_resume(corpus_file, tmp_path, capsys):
    train(tiny("mhsa.td", corpus_file, tmp_path, steps=2), progress=False)
    corpus_file.write_bytes(gzip.compress((TEXT + " And by opposing end them.").encode()))
    assert _resume(tmp_path / "run", "--steps", "4") == 1
    assert f"data file '{corpus_file}' differs from the text the run in" in capsys.readouterr().err


# ---- file-system failures: one line naming the path and the cause, the last checkpoint kept ----


def test_a_run_folder_under_a_regular_file_is_a_one_line_error(corpus_file, tmp_path, capsys):
    (tmp_path / "file").write_text("")
    out = tmp_path / "file" / "run"
    argv = ["train", str(DESIGNS / "mhsa.td"), "--data", str(corpus_file), "--out", str(out), "--no-progress"]
    assert main(argv) == 1
    err = capsys.readouterr().err
    assert f"cannot create run folder '{out}': Not a directory" in err and "Traceback" not in err


@pytest.mark.parametrize(("number", "reason"), [(28, "No space left on device"), (27, "File too large")])
def test_a_full_disk_while_checkpointing_is_a_one_line_error_and_keeps_the_last_checkpoint(
    corpus_file, tmp_path, monkeypatch, capsys, number, reason
):
    real_fsync, checkpoints = os.fsync, []

    def fsync(descriptor):
        name = os.path.basename(os.readlink(f"/proc/self/fd/{descriptor}"))
        if name.startswith(".checkpoint.pt.") and name.endswith(".tmp"):  # the temporary beside it
            checkpoints.append(descriptor)
            if len(checkpoints) > 2:  # the checkpoints of steps 0 and 2 are written, that of step 4 is not
                raise OSError(number, os.strerror(number))
        real_fsync(descriptor)

    monkeypatch.setattr(os, "fsync", fsync)
    argv = ["train", str(DESIGNS / "mhsa.td"), "--data", str(corpus_file), "--layers", "1", "--width", "16"]
    argv += ["--heads", "2", "--context", "16", "--batch", "4", "--steps", "4", "--eval-every", "2"]
    assert main([*argv, "--out", str(tmp_path / "run"), "--no-progress"]) == 1
    err = capsys.readouterr().err
    assert f"cannot write '{tmp_path / 'run' / 'checkpoint.pt'}': {reason}" in err and "Traceback" not in err
    assert torch.load(tmp_path / "run" / "checkpoint.pt", weights_only=True)["step"] == 2
    assert not list((tmp_path / "run").glob("*.tmp"))


def test_a_cpu_run_flushes_subnormals_while_it_trains_and_restores_the_mode(corpus_file, tmp_path, monkeypatch):
    from tdiag import train as training

    seen = []
    steps = training._Run.steps

    def spying(self, *args, **kwargs):
        seen.append(training._flushing())
        return steps(self, *args, **kwargs)

    monkeypatch.setattr(training._Run, "steps", spying)
    assert not training._flushing()
    train(tiny("mhsa.td", corpus_file, tmp_path), progress=False)
    assert seen == [True] and not training._flushing()


def test_flushing_subnormals_leaves_a_mode_already_set_as_it_was():
    from tdiag.train import _flushing, subnormals_flushed

    torch.set_flush_denormal(True)
    try:
        with subnormals_flushed(torch.device("cpu")):
            assert _flushing()
        assert _flushing()
    finally:
        torch.set_flush_denormal(False)
    assert not _flushing()
