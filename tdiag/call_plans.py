"""The plans a compiled module chooses among when it is called (`attn_mask`, `key_padding_mask`,
`is_causal`, as `scaled_dot_product_attention` and `nn.MultiheadAttention` take them): the plain
plan, the causal one (graph/causal.py), and each with the call mask (graph/call_masks.py). All are
planned when the module is built, so a call only picks a method: nothing is planned or compiled at
call time, and `torch.compile` sees ordinary Python. A design that `with_causal_mask` refuses (no
attention over the key leg beside the query leg, or one that mixes positions) has none of them:
its module takes exactly the arguments it took before."""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import TdiagError
from .graph.call_masks import CallMaskError, call_mask_name, with_call_bias, with_call_mask

if TYPE_CHECKING:
    from .design import Design
    from .plan import Plan


# forward's keywords; a design with an input, mask or size of one of these names keeps its own
ARGUMENTS = ("attn_mask", "key_padding_mask", "is_causal")


@dataclass(frozen=True)
class CallPlans:
    """The plans behind one module's call-time arguments; the plans are None until planned (a
    module plans them the first time a call asks for one, module.py)."""

    query: str  # the query leg (n), whose size is the mask's second-to-last axis
    key: str  # the key leg (m), whose size is its last axis
    already_causal: bool  # the design is causal as built: is_causal changes nothing, the plain plan serves
    bias: bool  # True: every masked node is a softmax box, a mask reaches it as float scores
    refusal: str  # why a float mask is refused (empty where `bias`)
    name: str  # the call mask's tensor name in the masked plans (a float input where `bias`, else a mask)
    causal: Plan | None = None  # the plan with causal(query, key)
    masked: Plan | None = None  # the plan with the call mask
    causal_masked: Plan | None = None  # both

    @property
    def planned(self) -> bool:
        return self.masked is not None


def call_designs(design: Design, query: str = "n", key: str = "m") -> tuple | None:
    """(causal design or None where causal already, masked design, causal masked design or None,
    bias, refusal, name), or None for a design without attention over `key` beside `query` (or
    with an input, mask or size named as one of the ARGUMENTS); cached on the design, so that its plans
    are cached too."""
    from .design import Design

    cache = design.__dict__.setdefault("_call_designs", {})
    if (query, key) in cache:
        return cache[(query, key)]
    found = None
    graph = design.graph
    own = {*(t.name for t in graph.tensors_of_kind("input", "mask")), *graph.sizes} & set(ARGUMENTS)
    if query in graph.legs and key in graph.legs and not own:
        try:
            causal_graph = design.with_causal_mask(query, key).graph
        except TdiagError:
            causal_graph = None
        if causal_graph is not None:
            name = call_mask_name(graph)
            already = causal_graph is graph
            try:
                masked, bias, refusal = with_call_bias(graph, name, query, key), True, ""
                causal_masked = None if already else with_call_bias(causal_graph, name, query, key)
            except CallMaskError as error:
                masked, bias, refusal = with_call_mask(graph, name, query, key), False, str(error)
                causal_masked = None if already else with_call_mask(causal_graph, name, query, key)
            found = (
                None if already else Design(causal_graph, design.warnings),
                Design(masked, design.warnings),
                None if causal_masked is None else Design(causal_masked, design.warnings),
                bias,
                refusal,
                name,
            )
    cache[(query, key)] = found
    return found


def call_plans(
    design: Design, sizes: Mapping[str, int], *, planned: bool = True, **options: object
) -> CallPlans | None:
    """The call-time variants of `design` at `sizes` with the plain plan's `options` (objective,
    attention, checkpoint_boxes), planned or (`planned=False`) only described; None for a design
    that has none."""
    designs = call_designs(design)
    if designs is None:
        return None
    causal, masked, causal_masked, bias, refusal, name = designs
    calls = CallPlans("n", "m", already_causal=causal is None, bias=bias, refusal=refusal, name=name)
    if not planned:
        return calls
    return dataclasses.replace(
        calls,
        causal=None if causal is None else causal.plan(sizes, **options),
        masked=masked.plan(sizes, **options),
        causal_masked=None if causal_masked is None else causal_masked.plan(sizes, **options),
    )
