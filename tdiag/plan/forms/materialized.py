"""The box computed as such (boxes.py): its entries materialized once, masked, normalized, then
read by its consumer's contraction like any other factor. Applies to every box; the fallback
whenever no other form applies or pays."""

from __future__ import annotations

from ..boxes import lower_box
from ..context import Leaf, Lowering
from ..legs import value_leaves
from .base import BoxSite, Form


class Materialized(Form):
    name = "materialized"
    rewrite = False  # the box as written: no rewrite taken or refused

    def label(self, site: BoxSite) -> str:
        return "the materialized box"

    def refusal(self, ctx: Lowering, site: BoxSite) -> str | None:
        return None

    def emit(self, ctx: Lowering, site: BoxSite) -> list[Leaf]:
        """The box's value among the other leaves at its place. A softmax box lays out first the
        legs its consumer shares with the other factors (its batch legs), so that the consumer's
        matmul reads it without a copy."""
        box, ren, others, k = site.box, site.ren, site.others, site.index
        prefer = {leg for o in others for leg in o.legs} if box.is_exp else set()
        value = ctx.memoized(box, ren, lambda: lower_box(ctx, box, ren, None, prefer))
        return [*others[:k], *value_leaves(value), *others[k:]]
