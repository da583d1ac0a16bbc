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
`emit(ctx, site) -> list[Leaf]` (emit its steps through `ctx`, the lowering as the protocol
`context.Lowering` describes it, and the lowering's functions of it — regions.contract,
boxes.materialize, ... —, and return `site.others` with what replaces the box: see
materialized.py for the smallest one; raise
`FormRefusedError` for a reason found only while emitting), then add an instance to `FORMS`
below. Nothing else changes: the chooser costs it, the report lists it."""

from __future__ import annotations

import contextlib
import contextvars
from collections.abc import Iterator

from ..chooser import Cost, choose
from ..context import Leaf, Lowering
from . import choice
from .banded import Banded
from .base import BoxChoice, BoxSite, Candidate, Form, FormRefusedError, Unfit
from .cost import cost
from .flex import Flex
from .global_heads import GlobalHeadSdpa
from .linear import LinearOrder
from .materialized import Materialized
from .sdpa import Sdpa
from .sdpa_grouped import SdpaGrouped
from .sdpa_padded import SdpaPadded
from .sdpa_repeated import SdpaRepeated
from .sdpa_sink import SdpaSink

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


# the names of the forms `only_forms` keeps, in the block that set them (None: every form)
_ONLY: contextvars.ContextVar[tuple[str, ...] | None] = contextvars.ContextVar("only_forms", default=None)


@contextlib.contextmanager
def only_forms(*names: str) -> Iterator[None]:
    """Plan with these candidate forms of a box alone (benchmarks and tests that weigh one form
    against another): the plans made in the block weigh `planning_forms()`, and a design caches
    them apart from its plans with every form."""
    token = _ONLY.set(names)
    try:
        yield
    finally:
        _ONLY.reset(token)


def planning_forms() -> tuple[Form, ...]:
    """The candidate forms a plan made now weighs: FORMS, or those `only_forms` keeps."""
    names = _ONLY.get()
    return tuple(form for form in FORMS if names is None or form.name in names)


def resolve_boxes(ctx: Lowering, leaves: list[Leaf], out: tuple[str, ...]) -> list[Leaf]:
    """The region's leaves with each box replaced by the form the chooser takes for it, among
    the forms of the lowering's config."""
    return choice.resolve_boxes(ctx, leaves, out, ctx.config.forms)


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
    "planning_forms",
    "resolve_boxes",
]
