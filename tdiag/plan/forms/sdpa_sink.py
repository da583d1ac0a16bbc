"""SDPA for a softmax box with a sink (`softmax[m, sink = s[h]](x)`, gpt-oss's attention sinks):
exp(α·x_m) / (exp(s) + Σ_m' exp(α·x_m')) in one scaled_dot_product_attention call over the
scores, never materialized. Each query gains one feature s / scale and each key the feature 0;
one key [0, ..., 0, 1] with a zero value is put first, whose logit is then exactly s and whose
value adds nothing, so the kernel's softmax has the sink in its denominator and the max it
subtracts is taken over the scores and the sink. A causal mask stays is_causal with one query
put first (its output row dropped), so that the top-left triangle lets query i see the sink key
and keys 0..i. A padding mask or an additive bias goes into a float attn_mask with the sink
key's column visible; a row whose keys are all hidden gives 0 (the sink takes its weight), as
the materialized box and the reference do (docs/language.md, Boxes and maps). Query heads that
share key heads are grouped (enable_gqa) or folded into the query rows, as the other SDPA forms
do (sdpa.py). The generated code calls `_sink_attention` (codegen.py)."""

from __future__ import annotations

import dataclasses

from ..context import Leaf, Lowering
from ..sdpa import fuse
from ..sdpa_match import MatchedAttention
from .base import BoxSite, Form, Unfit

# why the other forms leave a box with a sink to this one; the key under which the chooser
# hands this form the attention it matched
SINK = "a sink in the denominator (the SDPA sink form takes it)"


class SdpaSink(Form):
    name = "sdpa_sink"
    fused = True

    def label(self, site: BoxSite) -> str:
        return "SDPA with the sink as one more key"

    def refusal(self, ctx: Lowering, site: BoxSite) -> str | None:
        if site.kind != "softmax":
            return Unfit("a normalize box (SDPA fuses a softmax)")
        if site.box.sink is None:
            return Unfit("no sink (the other SDPA forms take the box)")
        match: MatchedAttention | None = site.found.get(SINK)
        if match is None:
            return site.mismatch
        if len(match.masks) > 1:
            return "more than one causal mask: is_causal says one"
        return None

    def emit(self, ctx: Lowering, site: BoxSite) -> list[Leaf]:
        match: MatchedAttention = site.found[SINK]
        grouped = len(match.queries) > 1
        return fuse(ctx, site.box, site.ren, site.others, dataclasses.replace(match, grouped=grouped))
