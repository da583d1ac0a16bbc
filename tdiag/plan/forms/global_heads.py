"""SDPA in the global-head form (plan/global_heads.py): one scaled_dot_product_attention whose
key side holds the G global heads side by side, shared by the H local heads that the queries and
the values carry (Hard FiSH eq. 10, fishformer spec §3.3; talking-heads attention). No N×N
tensor is stored."""

from __future__ import annotations

from ..context import Leaf, Lowering
from ..global_heads import GlobalHeads, emit, recognise
from .base import BoxSite, Form, Unfit

NO_LOCAL_HEADS = "no local heads"


class GlobalHeadSdpa(Form):
    name = "global_heads"
    fused = True

    def label(self, site: BoxSite) -> str:
        return "SDPA in the global-head form"

    def refusal(self, ctx: Lowering, site: BoxSite) -> str | None:
        if site.kind != "softmax":
            return Unfit("a normalize box (SDPA fuses a softmax)")
        if site.box.sink is not None:
            return "a sink in the denominator (the SDPA sink form takes it)"
        found = recognise(ctx, site.box, site.ren, site.others, site.out)
        if isinstance(found, str):
            return Unfit(found) if found.startswith(NO_LOCAL_HEADS) else found
        site.found[self.name] = found
        return None

    def emit(self, ctx: Lowering, site: BoxSite) -> list[Leaf]:
        found: GlobalHeads = site.found[self.name]
        return emit(ctx, found)
