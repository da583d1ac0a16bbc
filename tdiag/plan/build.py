from __future__ import annotations

from collections.abc import Mapping, Sequence

import sympy

from ..device import DeviceModel
from ..graph import DesignGraph
from ..graph.absorb import absorbed, unread_dropped
from ..ir import Expr, TensorRef
from ..objectives import DEFAULT_OBJECTIVE, OBJECTIVES
from . import report  # noqa: F401  (registers the plan's printers, program.PLAN_VIEWS)
from .absorb_choice import cheaper_form, replaced_tensors
from .base import DesignLowering
from .bias_fusion import fuse_linear_biases
from .boxes import expand_broadcast, materialize
from .flex import ATTENTION_KERNELS
from .forms import Form, planning_forms, resolve_boxes
from .forms.causal_product import lower_causal_product
from .layout import Sizes, assign_layouts
from .legs import all_legs
from .norms import fuse_layer_norms
from .objective import fastest_plan
from .program import (
    BATCH,
    BufferUpdate,
    ChunkCount,
    Permute,
    Plan,
    Step,
    Value,
    reads,
)
from .regions import is_batched
from .training import mark_training_only


def build_plan(
    graph: DesignGraph,
    sizes: Mapping[str, int],
    *,
    checkpoint_boxes: bool = False,
    objective: str = DEFAULT_OBJECTIVE,
    attention: str = "sdpa",
    absorb: bool = True,
    device: DeviceModel | None = None,
    forms: Sequence[Form] | None = None,
) -> Plan:
    """The plan of `graph` (`_planned`), or, where the design has an absorbed form
    (graph/absorb.py: MLA's key/value maps multiplied into the query and output side) and
    `absorb` is set, the plan of whichever form the objective finds cheaper, both planned whole
    (absorb_choice.py; the design as written on a tie). `device` prices the candidates' time
    (every objective's tie-break) instead of the planning device (device.planning_device);
    `forms` are the candidate forms of a box (None: forms.planning_forms())."""
    options = {
        "checkpoint_boxes": checkpoint_boxes,
        "objective": objective,
        "attention": attention,
        "device": device,
        "forms": planning_forms() if forms is None else tuple(forms),
    }
    plan = _planned(graph, sizes, **options)
    other = absorbed(graph) if absorb else graph
    if other is graph:
        return plan
    return cheaper_form(
        plan,
        objective,
        replaced_tensors(graph, other),
        lambda: _planned(unread_dropped(other), sizes, **options),
    )


def _planned(
    graph: DesignGraph,
    sizes: Mapping[str, int],
    *,
    checkpoint_boxes: bool = False,
    objective: str = DEFAULT_OBJECTIVE,
    attention: str = "sdpa",
    device: DeviceModel | None = None,
    forms: tuple[Form, ...] = (),
) -> Plan:
    """Lower every statement, then the outputs and the state updates. With `checkpoint_boxes`,
    each box, its content and its first consumer are recomputed in the backward pass instead of
    being kept (Tuformer §4.3, spec §3.4). Each box takes one of its candidate forms (forms/):
    the least costly in the objective's order (`time`, `flops`, `memory`: forms/cost.py), except
    that `"memory"` takes a fused attention wherever the pattern holds, since it never stores the
    box (MGK P17 multiplies the value contraction by M but keeps no N²·M scores), and
    `attention="flex"` lowers each fusable softmax box to FlexAttention where it applies (flex.py)
    instead of SDPA, whatever the objective. `Plan.choices` records every decision."""
    if objective not in OBJECTIVES:
        raise ValueError(f"objective must be one of {', '.join(OBJECTIVES)}, got {objective!r}")
    if attention not in ATTENTION_KERNELS:
        raise ValueError(f"attention must be one of {', '.join(ATTENTION_KERNELS)}, got {attention!r}")
    graph = fuse_layer_norms(graph)
    lowering = DesignLowering(
        graph,
        sizes,
        objective,
        attention=attention,
        device=device,
        forms=forms,
        resolve_boxes=resolve_boxes,
        causal_product=lower_causal_product,
    )
    lowering.lower_design()
    plan = Plan(graph, dict(sizes), lowering.leg_sizes, steps=lowering.steps)
    for name in graph.outputs:
        expr, groups = _output_expression(graph, name)
        if name not in lowering.values:  # an input given back as it is: read like a factor
            lowering.values[name] = lowering.lower(expr, lowering.identity_renaming(expr.legs))
        value = expand_broadcast(lowering, lowering.values[name], set(lowering.values[name].broadcast))
        if not value.is_batched and is_batched(lowering, expr):
            value = materialize(lowering, value, (BATCH, *value.legs))  # it reads the input, shifted away
        order = [BATCH] if value.is_batched else []
        order += [p for group in groups for leg in group for p in lowering.expand(leg)]
        plan.outputs.append((name, _reorder(lowering, value, order)))
    with lowering.emitting(plan.update_steps):
        for update in graph.updates:
            value = lowering.lower(update.expr, lowering.identity_renaming(all_legs(update.expr)))
            value = expand_broadcast(lowering, value, set(value.broadcast))
            order = [BATCH] if value.is_batched else []
            order += [p for group in update.groups for leg in group for p in lowering.expand(leg)]
            value = _reorder(lowering, value, order)
            shape = lowering.shape([leg for leg in order if leg != BATCH])
            step = Step("update", BufferUpdate(update.target, value, shape), None, f"update {update.target}")
            lowering.emit(step)
    plan.steps = lowering.steps
    keep = {value.var for _, value in plan.outputs} | {v.var for s in plan.update_steps for v in reads(s.op)}
    assign_layouts(plan.steps, keep, Sizes(lowering.number, lambda leg: lowering.shape([leg])[0]))
    gone = fuse_linear_biases(lowering, plan.steps, keep)
    dropped = _drop_unread_constants(plan.steps, keep)
    box_segments = [
        (_shifted(_shifted(start, gone), dropped), _shifted(_shifted(end, gone), dropped), var)
        for start, end, var in lowering.box_segments
    ]
    plan.names = lowering.input_vars
    plan.lowered = lowering.lowered
    plan.refused = lowering.refused
    plan.choices = lowering.choices
    if checkpoint_boxes:
        plan.segments = _checkpoint_segments(lowering.steps, box_segments)
    plan.causal = lowering.causal_masks
    plan.chunks = [ChunkCount(str(symbol), extent, size) for (extent, size), symbol in lowering.chunk_counts.items()]
    _express_chunks(plan, lowering.chunk_sizes)
    plan.stored = sorted(lowering.stored_used)
    plan.attributes = frozenset(lowering.attributes)
    mark_training_only(plan)
    if device is not None:
        plan.device = device  # the absorbed form's choice prices both plans on it (absorb_choice.plan_cost)
    if objective == "time":
        return fastest_plan(
            plan,
            lowering.device,
            lowering.rival_objectives(),
            lambda other: _planned(
                graph,
                sizes,
                checkpoint_boxes=checkpoint_boxes,
                objective=other,
                attention=attention,
                device=device,
                forms=forms,
            ),
        )
    return plan


def _output_expression(graph: DesignGraph, name: str) -> tuple[Expr, tuple[tuple[str, ...], ...]]:
    """What an output evaluates and its axes' legs: a statement's expression, or for a declared
    input named as an output (`output X`) the input itself over its declared legs."""
    tensor = graph.tensors[name]
    if tensor.statement is not None:
        return tensor.statement.expr, tensor.statement.groups
    groups = tuple((leg,) for leg in tensor.legs)
    return TensorRef(tensor.legs, tensor.span, name, groups), groups


def _express_chunks(plan: Plan, sizes: Mapping[sympy.Symbol, sympy.Expr]) -> None:
    """Cost formulas in the design's sizes: a chunk count ⌈N / C⌉ is written N / C (exact
    when C divides N)."""
    if not sizes:
        return
    fields = ("flops", "exps", "divisions", "entries", "elementwise", "paper", "score_flops", "score_paper")
    for step in [*plan.steps, *plan.update_steps]:
        for name in fields:
            setattr(step, name, sympy.sympify(getattr(step, name)).xreplace(sizes))
    plan.leg_sizes = {leg: size.xreplace(sizes) for leg, size in plan.leg_sizes.items()}


def _reorder(lowering: DesignLowering, value: Value, order: list[str]) -> Value:
    if list(value.legs) == order:
        return value
    name = lowering.names.fresh(f"{value.var}_out")
    permutation = tuple(value.legs.index(leg) for leg in order)
    return lowering.emit(Step("permute", Permute(value, permutation), Value(name, tuple(order)), "reorder legs"))  # type: ignore[return-value]


def _drop_unread_constants(steps: list[Step], kept: set[str]) -> list[int]:
    """Remove, in place, each constant step no step reads (a statement of no legs, `hi[] = ...`,
    whose every use was folded into a number); returns their indices in `steps` as they were."""
    read = kept | {value.var for step in steps for value in reads(step.op)}
    gone = [k for k, s in enumerate(steps) if s.kind == "constant" and s.out is not None and s.out.var not in read]
    steps[:] = [s for k, s in enumerate(steps) if k not in set(gone)]
    return gone


def _shifted(index: int, gone: list[int]) -> int:
    """A step's index once the steps at `gone` are removed (a removed one: the step after it)."""
    return index - sum(1 for k in gone if k < index)


def _checkpoint_segments(steps: list[Step], boxes: list[tuple[int, int, str]]) -> list[tuple[int, int]]:
    """Each box's steps extended to the first step that reads the box, merged where they meet."""
    segments = []
    for start, end, var in boxes:
        consumer = next((k for k in range(end + 1, len(steps)) if any(v.var == var for v in steps[k].inputs)), end)
        segments.append((start, consumer))
    merged: list[tuple[int, int]] = []
    for start, end in sorted(segments):
        if merged and start <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(end, merged[-1][1]))
        else:
            merged.append((start, end))
    return merged
