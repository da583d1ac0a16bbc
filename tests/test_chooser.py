"""The one chooser (tdiag/plan/chooser.py): every comparison of prices in the planner and the
decoder takes the least in one order, the first listed of equal ones, and says why the others
lost (issue 37)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

from tdiag.plan.chooser import ORDER, Cost, NoCandidateError, cheapest, choose, key, within, worse

ROOT = Path(__file__).resolve().parents[1]
FAST = Cost(time=1.0, kept=300.0, flops=50)
LEAN = Cost(time=2.0, kept=100.0, flops=40)
FEW = Cost(time=1.5, kept=200.0, flops=10)


@pytest.mark.parametrize(
    ("objective", "taken"), [("time", "fast"), ("memory", "lean"), ("flops", "few")], ids=["time", "memory", "flops"]
)
def test_choose_takes_the_least_in_the_objectives_order(objective, taken):
    assert choose(objective, [("fast", FAST), ("lean", LEAN), ("few", FEW)]) == taken


def test_the_time_order_breaks_a_tie_in_seconds_by_the_bytes_kept():
    kept_less = Cost(time=1.0, kept=100.0, flops=99)
    assert choose("time", [("fast", FAST), ("kept less", kept_less)]) == "kept less"


def test_of_equal_costs_the_first_listed_is_taken():
    assert choose("time", [("first", FAST), ("second", FAST)]) == "first"
    assert cheapest([("a", 2), ("b", 1), ("c", 1)]) == "b"


def test_cheapest_compares_tuples_figure_by_figure():
    assert cheapest([("copies", (3, 0)), ("rank", (2, 1)), ("both", (2, 0))]) == "both"


def test_a_choice_among_no_candidates_is_refused():
    with pytest.raises(NoCandidateError, match="no candidate"):
        cheapest([])
    with pytest.raises(NoCandidateError):
        choose("time", [])
    with pytest.raises(NoCandidateError):
        within([], 1.1)


def test_within_keeps_the_items_at_most_slack_times_the_least_in_order():
    priced = [(16, 1.30), (32, 1.00), (64, 1.09), (128, 1.11)]
    assert within(priced, 1.1) == [32, 64]
    assert within(priced, 1.0) == [32]


def test_key_lists_the_figures_of_the_objectives_order():
    assert key("memory", FAST) == (300.0, 1.0, 50)
    assert set(ORDER) == {"time", "flops", "memory"}


def test_worse_names_the_first_figure_of_the_order_in_which_the_loser_is_worse():
    assert worse("time", LEAN, FAST) == "is estimated slower than"
    assert worse("memory", FAST, LEAN) == "keeps more for backward than"
    assert worse("flops", FAST, FEW) == "costs more FLOPs than"
    assert worse("time", FAST, FAST) == "costs the same as (and is listed after)"


# The min/max calls with a key in the planner and the decoder that pick by a fact of layout or
# a size, not a price among candidates: (file, the name assigned).
NOT_A_PRICE = {
    ("tdiag/plan/sdpa_match.py", "shared"): "the longest shared leg list of the splits",
    ("tdiag/plan/sdpa_match.py", "sequence"): "the sequence leg: the longest query leg",
    ("tdiag/plan/layout.py", "largest"): "torch lays a broadcast result out as its largest operand",
    ("tdiag/plan/combine.py", "largest"): "the largest operand is read in its own layout",
}


def keyed_extrema(path: Path) -> list[tuple[str, int]]:
    """The names assigned (or "return") from a min(...) or max(...) call with key=, with their lines."""
    found = []
    for node in ast.walk(ast.parse(path.read_text())):
        call = node.value if isinstance(node, ast.Assign | ast.AnnAssign | ast.Return) else None
        if isinstance(call, ast.IfExp):
            call = call.orelse
        if not (isinstance(call, ast.Call) and isinstance(call.func, ast.Name) and call.func.id in ("min", "max")):
            continue
        if any(k.arg == "key" for k in call.keywords):
            if isinstance(node, ast.Return):
                found.append(("return", node.lineno))
                continue
            targets = node.targets if isinstance(node, ast.Assign) else [node.target]
            name = targets[0].id if isinstance(targets[0], ast.Name) else ast.unparse(targets[0])
            found.append((name, node.lineno))
    return found


def test_no_planner_or_decoder_module_compares_prices_by_hand():
    """A least-cost choice is chooser.cheapest or chooser.choose; a new min/max with a key in the
    planner or the decoder is either routed there or listed in NOT_A_PRICE with its reason."""
    files = [*sorted((ROOT / "tdiag/plan").rglob("*.py")), *sorted((ROOT / "tdiag").glob("decode*.py"))]
    by_hand = [
        f"{path.relative_to(ROOT)}:{line} {name}"
        for path in files
        if path.name != "chooser.py"
        for name, line in keyed_extrema(path)
        if (str(path.relative_to(ROOT)), name) not in NOT_A_PRICE
    ]
    assert by_hand == []


def test_the_guard_finds_a_least_cost_choice_written_by_hand(tmp_path):
    source = tmp_path / "form.py"
    source.write_text("def f(costs):\n    best = min(costs, key=lambda c: c.time)\n    return max(costs, key=len)\n")
    assert keyed_extrema(source) == [("best", 2), ("return", 3)]
