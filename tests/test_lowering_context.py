"""The lowering's context (tdiag/plan/context.py): a trial is a fork of it, and its scopes are
undone on every exit (issue 37: "a trial ... leaves the real context exactly as it was")."""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import sympy

import tdiag
from tdiag import TdiagError
from tdiag.plan.context import LoweringConfig, LoweringContext, NameSupply
from tdiag.resources import bundled_designs

# not the lowering's state: what it was asked (config, g), the planning device it resolves once
# when first asked (a cache of the config), and the context's tally of the estimates the trials
# made, which the `time` objective reads afterwards to know which rival objectives to plan
NOT_STATE = {"config", "g", "_device", "estimates", "fusion_estimates"}
SMALL = 32  # every run-time size (N, M) at which the designs are planned here


def snapshot(value: object) -> object:
    """`value` as plain data that compares equal exactly when the state it describes is equal:
    containers by content, objects field by field (so a change in place is seen too)."""
    if isinstance(value, dict):
        return {key: snapshot(v) for key, v in value.items()}
    if isinstance(value, list | tuple):
        return (type(value).__name__, tuple(snapshot(v) for v in value))
    if isinstance(value, set | frozenset):
        return frozenset(value)
    if isinstance(value, sympy.Basic):
        return value
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return (type(value).__name__, {f.name: snapshot(getattr(value, f.name)) for f in dataclasses.fields(value)})
    if hasattr(value, "__dict__") and not callable(value):
        return (type(value).__name__, {k: snapshot(v) for k, v in vars(value).items()})
    return value


def context_snapshot(ctx: LoweringContext) -> dict[str, object]:
    return {name: snapshot(value) for name, value in vars(ctx).items() if name not in NOT_STATE}


def changed_fields(before: dict[str, object], after: dict[str, object]) -> list[str]:
    """The fields (a field of `state` as state.<name>) whose value differs."""
    found = []
    for name in sorted(set(before) | set(after)):
        old, new = before.get(name), after.get(name)
        if name == "state" and isinstance(old, tuple) and isinstance(new, tuple):
            found += [f"state.{k}" for k in sorted(old[1]) if old[1][k] != new[1].get(k)]
        elif old != new:
            found.append(name)
    return found


@pytest.fixture
def checked_trials(monkeypatch):
    """Every trial compares the whole context before and after it; the fields that differed."""
    leaks: set[str] = set()
    original = LoweringContext.trial

    @contextlib.contextmanager
    def checked(self):
        before = context_snapshot(self)
        try:
            with original(self) as steps:
                yield steps
        finally:
            leaks.update(changed_fields(before, context_snapshot(self)))

    monkeypatch.setattr(LoweringContext, "trial", checked)
    return leaks


def small_sizes(design) -> dict[str, int]:
    return {name: SMALL for name, size in design.graph.sizes.items() if size.is_free}


def variants(name: str):
    design = tdiag.load(name)
    yield design
    with contextlib.suppress(TdiagError):
        yield design.with_causal_mask()


@pytest.mark.parametrize("name", bundled_designs())
def test_a_trial_leaves_the_lowering_context_as_it_was(name, checked_trials):
    """Over every bundled design, plain and causal, for each objective: whatever a candidate
    emitted, named, noted or counted on trial, the context after the trial equals the context
    before it, field by field."""
    leaks = checked_trials
    for design in variants(name):
        for objective in ("time", "flops", "memory"):
            design.plan(small_sizes(design), objective=objective)
    assert not leaks, f"fields a trial changed: {', '.join(sorted(leaks))}"


def test_the_property_test_sees_a_leak():
    """The snapshot sees a name taken, a leg made and a note written (the check can fail)."""
    design = tdiag.load("mhsa")
    ctx = LoweringContext(LoweringConfig(design.graph, {"N": SMALL}))
    before = context_snapshot(ctx)
    ctx.names.fresh("q")
    ctx.new_leg("n")
    ctx.note("a rewrite")
    assert changed_fields(before, context_snapshot(ctx)) == [
        "state.leg_sizes",
        "state.legs_made",
        "state.lowered",
        "state.names",
    ]


def test_a_trial_forks_every_field_and_puts_it_back():
    """Inside a trial the context takes names, legs, memo, notes and chunk counts of its own;
    after it they are the real context's again, and its steps were emitted into the trial's list."""
    design = tdiag.load("mhsa")
    ctx = LoweringContext(LoweringConfig(design.graph, {"N": SMALL}))
    before = context_snapshot(ctx)
    with ctx.trial() as steps:
        assert ctx.trialing
        ctx.names.fresh("q")
        ctx.new_leg("n")
        ctx.memo[("key",)] = (None, ())  # type: ignore[assignment]
        ctx.chunk_counts[(sympy.Integer(8), 4)] = sympy.Symbol("chunks_4")
        ctx.count_stabilization()
        ctx.refuse("not kept")
        assert steps is ctx.target
    assert not ctx.trialing
    assert changed_fields(before, context_snapshot(ctx)) == []


def test_the_scopes_are_undone_when_the_block_raises():
    """box(), wide() and scope() put their field back on every exit, an exception's included."""
    design = tdiag.load("mhsa")
    ctx = LoweringContext(LoweringConfig(design.graph, {"N": SMALL}))
    with pytest.raises(ValueError), ctx.box(), ctx.wide(), ctx.scope(stabilized=frozenset({"n"})):
        raise ValueError("inside")
    assert (ctx.box_depth, ctx.wide_depth, ctx.stabilized) == (0, 0, None)


def test_a_field_of_the_state_is_not_written_from_outside():
    """The state's fields are changed through the context's methods, never rebound."""
    ctx = LoweringContext(LoweringConfig(tdiag.load("mhsa").graph, {"N": SMALL}))
    with pytest.raises(AttributeError, match="state"):
        ctx.memo = {}  # type: ignore[misc]


def test_an_aside_keeps_the_names_its_steps_took():
    """Steps emitted aside may be emitted later (an attention's prelude): the names they took
    stay taken, their memo is forgotten."""
    ctx = LoweringContext(LoweringConfig(tdiag.load("mhsa").graph, {"N": SMALL}))
    with ctx.aside():
        name = ctx.names.fresh("q")
        ctx.memo[("key",)] = (None, ())  # type: ignore[assignment]
    assert name in ctx.names.used and ("key",) not in ctx.memo
    assert isinstance(ctx.names, NameSupply)


def context_writes(source: str) -> list[str]:
    """The attributes of a lowering context that `source` assigns: `ctx.x = ...` or
    `lowering.x += ...`, and `self.x = ...` in a class built on the context."""
    import ast

    tree = ast.parse(source)
    subclasses = [
        node
        for node in ast.walk(tree)
        if isinstance(node, ast.ClassDef)
        and any(isinstance(base, ast.Name) and base.id.endswith(("Lowering", "LoweringContext")) for base in node.bases)
    ]
    owners = {"ctx", "lowering"}
    found = []
    for scope, names in [(tree, owners), *((cls, owners | {"self"}) for cls in subclasses)]:
        for node in ast.walk(scope):
            if isinstance(node, ast.Assign):
                targets = node.targets
            elif isinstance(node, ast.AugAssign | ast.AnnAssign):
                targets = [node.target]
            else:
                continue
            for target in targets:
                if (
                    isinstance(target, ast.Attribute)
                    and isinstance(target.value, ast.Name)
                    and target.value.id in names
                ):
                    found.append(f"{node.lineno} {target.value.id}.{target.attr}")
    return sorted(set(found))


def test_the_write_check_sees_a_pass_setting_a_field():
    source = "class TimeModel(DesignLowering):\n    def f(self):\n        self.estimates += 1\n"
    assert context_writes(source) == ["3 self.estimates"]
    assert context_writes("def f(ctx):\n    ctx.box_depth = 2\n") == ["2 ctx.box_depth"]


def test_no_attribute_of_the_context_is_written_outside_its_module():
    """Every field of the lowering's context is set in plan/context.py (the state through its
    methods and scopes): no pass rebinds `ctx.x` or `lowering.x`, and no class built on the
    context sets attributes of its own."""
    from pathlib import Path

    plan = Path(tdiag.__file__).parent / "plan"
    written = [
        f"{path.relative_to(plan)}:{write}"
        for path in sorted(plan.rglob("*.py"))
        if path != plan / "context.py"
        for write in context_writes(path.read_text())
    ]
    assert written == []


def test_the_walk_has_every_member_the_protocol_of_forms_and_rules_names():
    """context.Lowering, the protocol forms and lower rules are typed against, describes the
    one class that lowers (base.DesignLowering): each field and method it names is there."""
    from tdiag.plan.base import DesignLowering
    from tdiag.plan.context import Lowering

    ctx = DesignLowering(tdiag.load("mhsa").graph, {"N": SMALL})
    members = {*Lowering.__annotations__, *(name for name in vars(Lowering) if not name.startswith("_"))}
    assert {"lower", "lower_nonlinear", "memoized", "emit", "trial"} <= members
    assert [name for name in sorted(members) if not hasattr(ctx, name)] == []


def test_an_expression_at_the_sizes_is_remembered_with_the_chunk_counts_in_force():
    """at_sizes remembers each expression by the chunk counts' values: a trial that binds a chunk
    count reads its value, the real lowering the unbound count before and after it."""
    graph = tdiag.load("mhsa").graph
    ctx = LoweringContext(LoweringConfig(graph, {"N": SMALL}))
    chunks = sympy.Symbol("chunks_0")
    expr = graph.sizes["N"].symbol * chunks
    assert ctx.at_sizes(expr) == SMALL * chunks
    with ctx.trial():
        ctx.chunk_values[chunks] = sympy.Integer(4)
        assert ctx.at_sizes(expr) == 4 * SMALL
    assert ctx.at_sizes(expr) == SMALL * chunks
    assert len(ctx.config.evaluated) == 2
