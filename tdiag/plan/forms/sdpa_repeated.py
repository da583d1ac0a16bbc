"""SDPA with each query repeated over the keys of one position (sdpa.py, `repeated`): a causal
softmax box whose keys are several per position, (m, r) with r over R entries (MGK's M keys per
position, mgk spec), masked by m ≤ n on the position leg only. Laid out key j = m·R + r, query
n may see exactly the keys j ≤ n·R + R − 1; so with the query rows repeated R times (rows n·R ..
n·R + R − 1) the top-left is_causal of a square call (row i sees keys j ≤ i) is that mask on the
rows n·R + R − 1, which the output keeps (a strided view). The call does R times the query rows
of the attention, but the kernel skips the blocks above the diagonal (about the FLOPs of the
dense masked call, `kernel_flops`) and no N×(N·R) attn_mask is built or kept for backward (the
ordinary SDPA form's causal mask over several key legs, which torch's kernel converts to floats)."""

from __future__ import annotations

import dataclasses

from ..context import Leaf, Lowering
from ..program import show_legs
from ..sdpa import fuse
from .base import BoxSite, Form, Unfit


class SdpaRepeated(Form):
    name = "sdpa_repeated"
    fused = True

    def label(self, site: BoxSite) -> str:
        match = site.attention
        if match is None or not match.masks:
            return "SDPA with the queries repeated per key of a position"
        position = match.masks[0][1]
        rest = " ".join(show_legs(leg for leg in match.keys if leg != position))
        return f"SDPA with each query repeated over the {rest} keys of a position (is_causal)"

    def refusal(self, ctx: Lowering, site: BoxSite) -> str | None:
        if site.kind != "softmax":
            return Unfit("a normalize box (SDPA fuses a softmax)")
        if site.attention is None:
            return site.mismatch
        match = site.attention
        if not match.masks:
            return Unfit("no causal mask (the ordinary SDPA form has no mask to lay out)")
        query, position = match.masks[0]
        if len(match.masks) > 1:
            return "more than one causal mask: is_causal says one"
        if match.window is not None:
            return "a window: is_causal says no band"
        if match.keys == [position]:
            return Unfit("one key per position: the ordinary SDPA form's is_causal is the mask")
        if position not in match.keys:
            return "the causal mask is on no normalized leg"
        if match.queries != [query]:
            return "several query legs: the repeated rows are those of one query position leg"
        if ctx.size(query) != ctx.size(position):
            return "query and key positions of different lengths: is_causal on the repeated rows is a square's"
        if match.pads:
            return "a padding mask needs a float attn_mask over the scores, which this form exists to avoid"
        if match.score_biases:
            return "an additive bias along the queries needs a float attn_mask over the scores"
        return None

    def emit(self, ctx: Lowering, site: BoxSite) -> list[Leaf]:
        match = site.matched()
        position = match.masks[0][1]
        keys = [position, *(leg for leg in match.keys if leg != position)]  # key j = m·R + r
        repeated = dataclasses.replace(match, keys=keys, grouped=False, repeated=True)
        return fuse(ctx, site.box, site.ren, site.others, repeated)
