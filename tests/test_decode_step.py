"""MLA's decoding form by cost (issue 24, tdiag/decode_step.py): the absorbed form is the planner's
choice by its time model."""

import pytest
import torch
from conftest import DESIGNS

import tdiag
from tdiag.decode_step import decode_form


@pytest.fixture(scope="module")
def mla() -> tdiag.Design:
    return tdiag.load(DESIGNS / "deepseek_mla.td").with_causal_mask()


def test_mla_takes_the_absorbed_form_for_one_query_against_a_long_cache(mla):
    form = decode_form(mla.graph, queries=1, past=1023)
    assert form.form == "absorbed"
    costs = {c.form: c for c in form.costs}
    assert costs["absorbed"].seconds < costs["plain"].seconds
    assert costs["absorbed"].width < costs["plain"].width  # the latent: fewer entries per position


def test_mla_takes_the_plain_form_over_a_whole_sequence(mla):
    assert decode_form(mla.graph, queries=4096, past=4096).form == "plain"


def test_mla_training_forward_stays_plain(mla):
    assert decode_form(mla.graph, queries=4096, past=0).form == "plain"


def test_the_cache_shows_the_form_and_its_estimates(mla):
    module = mla.module(dtype=torch.float64)
    cache = module.new_cache()
    assert cache.rule.cached == ("Ckn", "KRr")
    assert "absorbed form at T = 1 after P = 1023" in repr(cache)
