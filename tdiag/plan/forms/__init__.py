"""The candidate forms of a softmax or normalize box, as data.

When a multilinear region meets a box, every form in `FORMS` is asked whether it applies to the
box (`Form.refusal`, with the reason when it does not); those that apply are emitted on trial
and costed by one model (cost.py: estimated training-step time, bytes kept for backward, FLOPs),
and one chooser takes one by the objective (choice.py, with its rules). The real plan keeps the
record of every decision in `Plan.choices`; `tdiag plan` prints it per box.

Forms, in the order that breaks ties (a fused form before the box computed as such, which
comes before the linear-time order: at equal cost the box is not rewritten into sums):

- sdpa_grouped: SDPA with query heads grouped over the key heads (enable_gqa), several query legs
- sdpa: SDPA with the query legs folded into the query rows (plain SDPA for one query leg)
- sdpa_padded: SDPA with q and k (or v) zero-padded to one head width, for the flash kernel
- sdpa_repeated: causal SDPA over several keys per position, each query repeated over them
- sdpa_sink: SDPA for a box with a sink, the sink as one more key (grouped or folded query heads)
- global_heads: SDPA in the global-head form (k over the global heads shared by local heads)
- flex: FlexAttention, when asked for (`attention="flex"`)
- banded: a windowed softmax box with its queries in blocks, each with the keys of its window (N·W)
- materialized: the box computed as such
- linear: the linear-time order of a normalize box (chunked prefix sums under a causal mask)

A causal product (a region with a causal(n, m) factor summing the key, or a decay causal by
itself) has candidate forms of its own, weighed the same way (causal_product.py: the masked
product, chunked prefix sums with decays).

To add a form: write one module here with a subclass of `forms.base.Form` that sets `name`
(and `fused` if it never stores the box, `label` for the plan's notes), implements
`refusal(ctx, site) -> str | None` (why it does not apply, cheaply: nothing emitted; return an
`Unfit` when the form is made for other boxes, so the notes leave it out) and
`emit(ctx, site) -> list[_Leaf]` (emit its steps through `ctx`, the lowering, and return
`site.others` with what replaces the box: see materialized.py for the smallest one; raise
`FormRefusedError` for a reason found only while emitting), then add an instance to `FORMS`
below. Nothing else changes: the chooser costs it, the report lists it."""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING

from ..base import _Leaf
from . import choice
from .banded import Banded
from .base import BoxChoice, BoxSite, Candidate, Cost, Form, FormRefusedError, Unfit
from .cost import choose, cost
from .flex import Flex
from .global_heads import GlobalHeadSdpa
from .linear import LinearOrder
from .materialized import Materialized
from .sdpa import Sdpa
from .sdpa_grouped import SdpaGrouped
from .sdpa_padded import SdpaPadded
from .sdpa_repeated import SdpaRepeated
from .sdpa_sink import SdpaSink

if TYPE_CHECKING:
    from ..build import _Lowering

FORMS: list[Form] = [
    SdpaGrouped(),
    Sdpa(),
    SdpaPadded(),
    SdpaRepeated(),
    SdpaSink(),
    GlobalHeadSdpa(),
    Flex(),
    Banded(),
    Materialized(),
    LinearOrder(),
]


@contextlib.contextmanager
def only_forms(*names: str) -> Iterator[None]:
    """Plan with these candidate forms of a box alone (benchmarks and tests that weigh one form
    against another); a design caches its plans, so load one per form."""
    global FORMS
    saved = FORMS
    FORMS = [form for form in saved if form.name in names]
    try:
        yield
    finally:
        FORMS = saved


def resolve_boxes(ctx: _Lowering, leaves: list[_Leaf], out: tuple[str, ...]) -> list[_Leaf]:
    """The region's leaves with each box replaced by the form the chooser takes for it."""
    return choice.resolve_boxes(ctx, leaves, out, FORMS)


__all__ = [
    "FORMS",
    "BoxChoice",
    "BoxSite",
    "Candidate",
    "Cost",
    "Form",
    "FormRefusedError",
    "Unfit",
    "choose",
    "cost",
    "only_forms",
    "resolve_boxes",
]
