"""Designs made alike share their plans while sharing is on (tdiag/shared_plans.py); the suite
runs with it on (conftest.py)."""

from conftest import DESIGNS

import tdiag
from tdiag import shared_plans
from tdiag.call_plans import call_designs
from tdiag.shared_plans import sharing

MHSA = DESIGNS / "mhsa.td"


def test_two_loads_of_one_file_share_a_plan():
    assert tdiag.load(MHSA).plan(N=16) is tdiag.load(MHSA).plan(N=16)


def test_without_sharing_each_design_plans_its_own():
    with sharing(False):
        assert tdiag.load(MHSA).plan(N=16) is not tdiag.load(MHSA).plan(N=16)


def test_other_sizes_or_objectives_are_other_plans():
    design = tdiag.load(MHSA)
    assert design.plan(N=16) is not tdiag.load(MHSA).plan(N=32)
    assert design.plan(N=16, objective="flops") is not tdiag.load(MHSA).plan(N=16, objective="memory")


def test_sizes_given_at_load_are_part_of_the_key():
    assert tdiag.load(MHSA, F=64).plan(N=16) is not tdiag.load(MHSA).plan(N=16)


def test_a_design_from_other_text_does_not_share():
    text = MHSA.read_text()
    assert tdiag.loads(text).plan(N=16) is tdiag.loads(text).plan(N=16)
    assert tdiag.loads(text).plan(N=16) is not tdiag.loads(text + "\n").plan(N=16)


def test_causal_variants_made_alike_share_a_plan():
    first, second = tdiag.load(MHSA).with_causal_mask(), tdiag.load(MHSA).with_causal_mask()
    assert first.plan(N=16) is second.plan(N=16)
    assert first.plan(N=16) is not tdiag.load(MHSA).plan(N=16)


def test_call_mask_variants_share_their_plans():
    first, second = call_designs(tdiag.load(MHSA)), call_designs(tdiag.load(MHSA))
    assert first.masked.plan(N=16) is second.masked.plan(N=16)
    assert first.causal_masked.plan(N=16) is not first.masked.plan(N=16)


def test_a_design_made_from_a_graph_alone_plans_its_own():
    graph = tdiag.load(MHSA).graph
    assert tdiag.Design(graph, []).plan(N=16) is not tdiag.Design(graph, []).plan(N=16)


def test_a_monkeypatching_test_shares_nothing(monkeypatch):
    monkeypatch.setenv("TDIAG_UNUSED", "1")
    before = shared_plans.kept()
    assert tdiag.load(MHSA).plan(N=16) is not tdiag.load(MHSA).plan(N=16)
    assert shared_plans.kept() == before


def test_the_least_recently_asked_plan_is_dropped_past_the_limit(monkeypatch):
    monkeypatch.setattr(shared_plans, "KEPT", 2)
    with sharing():
        plans = [shared_plans.shared_plan(k, object) for k in ("a", "b", "c")]
        assert shared_plans.kept() == 2
        assert shared_plans.shared_plan("c", object) is plans[2]
        assert shared_plans.shared_plan("a", object) is not plans[0]


def test_sharing_off_plans_every_time():
    with sharing(False):
        assert shared_plans.shared_plan(("k",), object) is not shared_plans.shared_plan(("k",), object)


def test_a_design_without_a_key_plans_every_time():
    assert shared_plans.shared_plan(None, object) is not shared_plans.shared_plan(None, object)
