"""The candidate forms of a box as data (tdiag/plan/forms/, issue 22): every form in one registry,
each saying why it does not apply or costed by one model (time, bytes kept, FLOPs), one chooser
taking the least cost in the objective's order, and each decision recorded in `Plan.choices`
and printed by `tdiag plan`. The device is a fixed nominal roofline, so the choices do not
depend on the machine the tests run on."""

import dataclasses

import pytest
from conftest import DESIGNS

import tdiag
from tdiag.cli import main
from tdiag.plan import forms
from tdiag.plan.forms import FORMS, Cost, Form, Unfit, choose, only_forms
from tdiag.plan.forms.choice import MEMORY


def choice_of(name: str, causal: bool = False, **options):
    """The one box decision of a bundled design's plan."""
    design = tdiag.load(name)
    if causal:
        design = design.with_causal_mask()
    (choice,) = design.plan(**options).choices
    return choice


def candidate(choice, form: str):
    return next(c for c in choice.candidates if c.form == form)


# ---- the registry ---------------------------------------------------------------------------


def test_the_registry_lists_every_form_once():
    names = [form.name for form in FORMS]
    assert names == [
        "sdpa_grouped",
        "sdpa",
        "sdpa_padded",
        "sdpa_repeated",
        "sdpa_sink",
        "global_heads",
        "flex",
        "banded",
        "materialized",
        "linear",
    ]


def test_every_decision_lists_every_registered_form():
    choice = choice_of("mhsa", N=64)
    assert [c.form for c in choice.candidates] == [form.name for form in FORMS]


def test_a_form_added_to_the_registry_is_weighed_without_touching_the_others(monkeypatch):
    class Never(Form):
        name = "never"

        def refusal(self, ctx, site):
            return f"a test form that never applies ({site.describe()})"

        def emit(self, ctx, site):
            raise AssertionError("a refused form is never emitted")

    monkeypatch.setattr(forms, "FORMS", [*FORMS, Never()])
    choice = choice_of("mhsa", N=64)
    assert candidate(choice, "never").refusal == "a test form that never applies (softmax box over m)"
    assert choice.taken == "sdpa"


# ---- refusals -------------------------------------------------------------------------------


def test_flex_is_refused_as_not_asked_for_under_sdpa():
    assert "not asked for" in candidate(choice_of("mhsa", N=64), "flex").refusal


def test_flex_is_refused_with_its_reason_for_a_design_it_does_not_fit():
    refusal = candidate(choice_of("mgk", N=64, attention="flex"), "flex").refusal
    assert refusal.startswith("several key legs m r")


def test_the_linear_order_is_refused_for_a_softmax_box():
    refusal = candidate(choice_of("mhsa", N=64), "linear").refusal
    assert isinstance(refusal, Unfit) and "softmax box" in refusal


def test_the_sdpa_forms_are_refused_for_a_normalize_box():
    choice = choice_of("mlk", N=64)
    assert all("normalize box" in candidate(choice, f).refusal for f in ("sdpa", "sdpa_grouped", "flex"))


def test_the_sdpa_forms_give_the_matchs_reason_for_a_box_that_is_no_attention():
    choice = choice_of("fish", N=64)
    assert candidate(choice, "sdpa").refusal == "no split into query, key and value sides that meet only in heads"
    assert choice.taken == "materialized"


def test_the_grouped_form_is_refused_for_one_query_leg():
    assert "one query leg" in candidate(choice_of("mhsa", N=64), "sdpa_grouped").refusal


def test_refusals_that_only_say_a_form_is_for_other_boxes_stay_out_of_the_notes():
    plan = tdiag.load("mhsa").plan(N=64)
    unfit = [c.refusal for choice in plan.choices for c in choice.candidates if isinstance(c.refusal, Unfit)]
    assert unfit and not any(reason in note for note in plan.refused for reason in unfit)


# ---- the record -----------------------------------------------------------------------------


def test_each_candidate_has_a_cost_or_a_refusal_reason():
    for name in ("mhsa", "mlk", "grouped_query", "fish"):
        for c in choice_of(name, N=64).candidates:
            assert (c.cost is None) != (c.refusal is None), (name, c)


def test_the_record_costs_every_applicable_form():
    choice = choice_of("grouped_query", N=64)
    costed = {c.form for c in choice.candidates if c.cost is not None}
    assert costed == {"sdpa_grouped", "sdpa", "global_heads", "materialized"}


def test_only_the_real_plan_records_its_decisions_not_the_trial_plans():
    plan = tdiag.load("mlk").plan(N=4096)
    assert [c.site for c in plan.choices] == ["normalize box over m"]


def test_the_record_names_the_objective_and_the_form_taken():
    choice = choice_of("mhsa", N=64, objective="flops")
    assert choice.objective == "flops" and choice.taken == "sdpa" and choice.rule is None


def test_a_design_caches_its_plans_apart_per_forms_and_per_pricing_device(cpu):
    """A plan made under only_forms(...) or for another planning device is not the plan cached
    with every form on the first device: the forms and the device are part of the cache key."""
    design = tdiag.load("mhsa")
    every = design.plan(N=64)
    with only_forms("materialized"):
        alone = design.plan(N=64)
    assert alone is not every
    assert [c.taken for c in alone.choices] == ["materialized"] != [c.taken for c in every.choices]
    assert design.plan(N=64) is every
    cpu(1e9, 1e8, 1e-3)  # another planning device: slow, with a large overhead per op
    assert design.plan(N=64) is not every


# ---- the chooser --------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("objective", "taken"),
    [("time", "fast"), ("flops", "few"), ("memory", "small")],
)
def test_choose_orders_by_the_objective(objective, taken):
    costed = [
        ("fast", Cost(time=1.0, kept=30.0, flops=300)),
        ("few", Cost(time=3.0, kept=20.0, flops=100)),
        ("small", Cost(time=2.0, kept=10.0, flops=200)),
    ]
    assert choose(objective, costed) == taken


@pytest.mark.parametrize(("objective", "taken"), [("time", "b"), ("flops", "b"), ("memory", "a")])
def test_choose_breaks_ties_by_the_objectives_next_figure(objective, taken):
    costed = [("a", Cost(time=2.0, kept=1.0, flops=100)), ("b", Cost(time=1.0, kept=2.0, flops=100))]
    if objective == "time":
        costed = [("a", Cost(time=1.0, kept=2.0, flops=100)), ("b", Cost(time=1.0, kept=1.0, flops=100))]
    assert choose(objective, costed) == taken


def test_choose_takes_the_first_of_equal_costs():
    same = Cost(time=1.0, kept=1.0, flops=1)
    assert choose("time", [("first", same), ("second", dataclasses.replace(same))]) == "first"


def test_mhsa_takes_sdpa():
    assert choice_of("mhsa", N=64).taken == "sdpa"


def test_a_design_whose_sdpa_form_costs_more_flops_takes_the_materialized_box_under_flops():
    choice = choice_of("hard_fish", N=256, objective="flops")
    sdpa, materialized = candidate(choice, "sdpa").cost, candidate(choice, "materialized").cost
    assert sdpa.flops > materialized.flops and choice.taken == "materialized"


def test_mlk_takes_the_linear_order_at_a_long_sequence():
    choice = choice_of("mlk", N=4096)
    assert choice.taken == "linear"
    assert candidate(choice, "linear").cost.time < candidate(choice, "materialized").cost.time


def test_mlk_takes_the_materialized_box_at_a_short_sequence():
    choice = choice_of("mlk", N=16)
    assert choice.taken == "materialized"
    assert candidate(choice, "materialized").cost.time < candidate(choice, "linear").cost.time


def test_causal_mlk_takes_the_linear_order_with_chunked_prefix_sums_at_a_long_sequence():
    plan = tdiag.load("mlk").with_causal_mask().plan(N=4096)
    assert plan.choices[0].taken == "linear"
    assert any("causal prefix sums" in note for note in plan.lowered)


def test_grouped_query_takes_the_grouped_form_when_causal():
    choice = choice_of("grouped_query", causal=True, N=64)
    assert choice.taken == "sdpa_grouped"
    assert "causal mask" in candidate(choice, "sdpa").refusal


def test_flex_asked_for_is_taken_wherever_it_applies():
    choice = choice_of("mhsa", N=64, attention="flex")
    assert choice.taken == "flex" and choice.rule == "FlexAttention asked for"
    assert candidate(choice, "sdpa").cost is not None


def test_objective_memory_takes_a_fused_form_wherever_one_applies():
    choice = choice_of("hard_fish", N=256, objective="memory")
    assert choice.taken in ("sdpa", "sdpa_grouped", "global_heads") and choice.rule == MEMORY


def test_among_the_fused_forms_objective_memory_takes_the_one_keeping_least():
    choice = choice_of("hard_fish", N=256, objective="memory")
    fused = {f.name for f in FORMS if f.fused}
    kept = {c.form: c.cost.kept for c in choice.candidates if c.cost is not None and c.form in fused}
    assert len(kept) > 1 and choice.taken == min(kept, key=kept.__getitem__)


def test_a_form_that_lost_on_cost_is_noted_with_how_it_compares():
    plan = tdiag.load("mlk").plan(N=16, objective="flops")
    assert "normalize box over m: linear-time order refused: costs more FLOPs than the materialized box" in plan.refused


# ---- shown ---------------------------------------------------------------------------------


def test_tdiag_plan_prints_every_candidate_with_time_memory_flops_and_the_one_taken(capsys):
    assert main(["plan", str(DESIGNS / "mhsa.td"), "--at", "N=64"]) == 0
    out = capsys.readouterr().out
    table = out.split("box forms at the sizes planned for")[1].split("rewrites taken:")[0]
    assert "softmax box over m (objective time)" in table
    assert "time (ms)" in table and "kept" in table and "FLOPs" in table
    taken = next(line for line in table.splitlines() if line.strip().startswith("*"))
    assert "sdpa" in taken and taken.endswith("taken") and " MB" in taken
    assert "materialized" in table and "does not apply: not asked for" in table


def test_the_plan_in_html_and_markdown_shows_the_candidates():
    plan = tdiag.load("mhsa").plan(N=64)
    assert "does not apply: one query leg" in plan._repr_html_()
    assert "does not apply: one query leg" in plan._repr_markdown_()
