"""`tdiag generate RUN --prompt TEXT` (issue 25): text drawn after a prompt from a trained run's
last checkpoint, its design copy and its data's alphabet; bad prompts and folders are one-line
errors."""

import gzip

import pytest
import torch
from conftest import DESIGNS

from tdiag import TdiagError
from tdiag.cli import main
from tdiag.train import TrainConfig, build_model, generate, read_corpus, sample, train

pytestmark = pytest.mark.slow  # trains a model once

TEXT = ("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 40).strip()


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    """A four-step run of a one-layer MHSA model on a short text: its folder and config."""
    root = tmp_path_factory.mktemp("generate")
    data = root / "tiny.txt.gz"
    data.write_bytes(gzip.compress(TEXT.encode()))
    config = TrainConfig(design=str(DESIGNS / "mhsa.td"), data=str(data), layers=1, width=16, heads=2, context=16,
                         batch=4, steps=4, eval_every=2, eval_batches=1, out=str(root / "run"))  # fmt: skip
    train(config, progress=False)
    return root / "run", config


def test_generate_prints_the_prompt_and_then_the_drawn_characters(run, capsys):
    folder, _ = run
    assert main(["generate", str(folder), "--prompt", "To be", "--length", "12"]) == 0
    printed = capsys.readouterr().out.rstrip("\n")
    assert printed.startswith("To be") and len(printed) == len("To be") + 12
    assert set(printed) <= set(TEXT)


def test_the_text_is_drawn_from_the_checkpoints_weights(run):
    folder, config = run
    corpus = read_corpus(config.data, config.context)
    model, _ = build_model(config, corpus.vocab, torch.device("cpu"))
    model.load_state_dict(torch.load(folder / "checkpoint.pt", weights_only=True)["model"])
    prompt = [corpus.chars.index(c) for c in "the mind"]
    assert generate(folder, "the mind", 20, seed=3) == sample(model, corpus, config, torch.device("cpu"), 20, prompt, 3)


def test_the_same_seed_draws_the_same_text(run):
    folder, _ = run
    assert generate(folder, "the", 30, seed=7) == generate(folder, "the", 30, seed=7)


def test_a_prompt_character_the_data_never_has_is_an_error_naming_it(run):
    folder, _ = run
    with pytest.raises(TdiagError, match=r"character 'Z' \(at 2\) never occurs in the data"):
        generate(folder, "toZ", 5)


def test_an_empty_prompt_is_an_error(run):
    with pytest.raises(TdiagError, match="the prompt is empty"):
        generate(run[0], "", 5)


def test_a_folder_that_is_not_a_run_is_a_one_line_error(tmp_path, capsys):
    assert main(["generate", str(tmp_path), "--prompt", "to"]) == 1
    assert "is not a run folder (no config.json)" in capsys.readouterr().err
