"""The plans a compiled module chooses among when it is called (`attn_mask`, `key_padding_mask`,
`is_causal`, as `scaled_dot_product_attention` and `nn.MultiheadAttention` take them): the plain
plan, the causal one (graph/causal.py), each with the call mask (graph/call_masks.py), and each
without the design's own masks where none is given (graph/absent_masks.py). The plain plans are
made with the module, the others the first time a call asks for one or with
`Design.module(plan_calls=True)` (module.py); a call then only picks a method, and
`torch.compile` sees ordinary Python. A design that `with_causal_mask` refuses (no
attention over the key leg beside the query leg, or one that mixes positions) has none of them:
its module takes exactly the arguments it took before.

This module makes them from Designs (the facade layer); their record, CallPlans, lives below in
plan/call_variants.py, where codegen and module.py read it."""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Mapping
from dataclasses import dataclass
from typing import TYPE_CHECKING

from .errors import TdiagError
from .graph.absent_masks import without_masks
from .graph.call_masks import call_mask_name, call_mask_refusals, with_call_bias, with_call_mask
from .plan.call_variants import CallPlans

if TYPE_CHECKING:
    from .design import Design


# forward's keywords; a design with an input, mask or size of one of these names keeps its own
ARGUMENTS = ("attn_mask", "key_padding_mask", "is_causal")


@dataclass
class CallDesigns:
    """A design's call-time variants as designs: the causal one made when the module is built
    (whether it exists decides `is_causal`), the masked ones when first planned."""

    plain: Design
    causal: Design | None  # None where the design is causal already
    bias: bool
    refusal: str
    name: str
    heads: tuple | None  # the sizes of the nodes' head legs where a mask per head is taken
    heads_refusal: str = ""  # why a mask per head is refused
    query: str = "n"
    key: str = "m"

    @functools.cached_property
    def masked(self) -> Design:
        return self._with_mask(self.plain)

    @functools.cached_property
    def causal_masked(self) -> Design | None:
        return None if self.causal is None else self._with_mask(self.causal)

    @functools.cached_property
    def masked_heads(self) -> Design | None:
        return None if self.heads is None else self._with_mask(self.plain, per_head=True)

    @functools.cached_property
    def causal_masked_heads(self) -> Design | None:
        return None if self.heads is None or self.causal is None else self._with_mask(self.causal, per_head=True)

    @functools.cached_property
    def unmasked(self) -> Design | None:
        return _without_masks(self.plain)

    @functools.cached_property
    def causal_unmasked(self) -> Design | None:
        return None if self.causal is None else _without_masks(self.causal)

    def _with_mask(self, design: Design, per_head: bool = False) -> Design:
        from .design import Design

        if self.bias:
            graph = with_call_bias(design.graph, self.name, self.query, self.key, per_head)
        else:
            graph = with_call_mask(design.graph, self.name, self.query, self.key, per_head)
        how = ("call mask", design.made_from, self.bias, self.name, self.query, self.key, per_head)
        return Design(graph, design.warnings, made_from=design.made_from and how)


def _without_masks(design: Design) -> Design | None:
    from .design import Design

    graph = without_masks(design.graph)
    made_from = design.made_from and ("without masks", design.made_from)
    return None if graph is None else Design(graph, design.warnings, made_from=made_from)


def call_designs(design: Design, query: str = "n", key: str = "m") -> CallDesigns | None:
    """The design's call-time variants, or None for a design without attention over `key` beside
    `query` that with_causal_mask can mask (or with an input, mask or size named as one of the
    ARGUMENTS); cached on the design, so that their plans are cached too."""
    cache = design.__dict__.setdefault("_call_designs", {})
    if (query, key) not in cache:
        cache[(query, key)] = _call_designs(design, query, key)
    return cache[(query, key)]


def _call_designs(design: Design, query: str, key: str) -> CallDesigns | None:
    graph = design.graph
    own = {*(t.name for t in graph.tensors_of_kind("input", "mask")), *graph.sizes} & set(ARGUMENTS)
    if query not in graph.legs or key not in graph.legs or own:
        return None
    try:
        causal = design.with_causal_mask(query, key)
    except TdiagError:
        return None
    name = call_mask_name(graph)
    refusal, heads, heads_refusal = call_mask_refusals(graph, name, query, key)
    already = causal.graph is graph
    causal_design = None if already else causal
    return CallDesigns(design, causal_design, not refusal, refusal, name, heads, heads_refusal, query, key)


def call_plans(
    design: Design, sizes: Mapping[str, int], *, planned: bool = True, **options: object
) -> CallPlans | None:
    """The call-time variants of `design` at `sizes` with the plain plan's `options` (objective,
    attention, checkpoint_boxes), planned or (`planned=False`) only described; None for a design
    that has none."""
    designs = call_designs(design)
    if designs is None:
        return None
    causal = designs.causal
    calls = CallPlans(
        designs.query,
        designs.key,
        already_causal=causal is None,
        bias=designs.bias,
        refusal=designs.refusal,
        name=designs.name,
        heads=designs.heads,
        heads_refusal=designs.heads_refusal,
    )
    unmasked = designs.unmasked
    if unmasked is not None:
        calls = dataclasses.replace(calls, unmasked=unmasked.plan(sizes, **options))
    if not planned:
        return calls
    planned_designs = {
        "causal": causal,
        "masked": designs.masked,
        "causal_masked": designs.causal_masked,
        "masked_heads": designs.masked_heads,
        "causal_masked_heads": designs.causal_masked_heads,
        "causal_unmasked": designs.causal_unmasked,
    }
    plans = {k: None if d is None else d.plan(sizes, **options) for k, d in planned_designs.items()}
    return dataclasses.replace(calls, **plans)
