"""Softmax boxes fused with their consumer as scaled_dot_product_attention: q, k, v laid out
(heads, positions, features), key biases as one more feature (MGK P17), causal masks as
is_causal or a boolean attn_mask. Taken when no dearer than the materialized box."""

from __future__ import annotations

import sympy

from ..ir import (
    SoftmaxBox,
)
from .base import _Leaf
from .program import (
    Attention,
    Step,
    Value,
    VisibleMask,
    show_legs,
)


class FusedAttention:
    """Emits a matched softmax box and its consumer as one SDPA call."""

    def cheaper_fused(self, box, ren, leaf: _Leaf, others: list[_Leaf], out, fused) -> bool:
        def materialized() -> None:
            value = self.lower_box(box, ren, None)
            self.contract([*others, _Leaf(value.legs, value=value)], out, sympy.Integer(1), None)

        def as_sdpa() -> None:
            self.contract(self.fuse(box, ren, others, fused), out, sympy.Integer(1), None)

        if self.objective == "memory":
            return True  # the fused kernel never materializes the box's entries
        return self.trial(as_sdpa) <= self.trial(materialized)

    def fuse(self, box: SoftmaxBox, ren, others: list[_Leaf], fused: dict) -> list[_Leaf]:
        """Emit q, k, v and the SDPA call; return the region's leaves with the attention output
        standing in for the box and its value side."""
        heads, queries, keys, latent, features = (fused[k] for k in ("heads", "queries", "keys", "latent", "features"))
        prelude, memo = fused["prelude"]
        for step in prelude:
            self.emit(step)
        self.memo.update(memo)
        self.box_depth += 1
        q = self.contract(fused["query"], tuple(heads + queries + latent), sympy.Integer(1), "q")
        k = self.contract(fused["key"], tuple(heads + keys + latent), sympy.Integer(1), "k")
        bias = self.key_bias(fused) if fused["biases"] else None
        self.box_depth -= 1
        v = self.contract(fused["value"], tuple(heads + keys + features), sympy.Integer(1), "v")
        v = self.expand_broadcast(v, set(keys))  # values tied across a key leg (MGK's r, P17)
        # a lone batch leg stays 3-D: SDPA then runs its math kernel (bmm, softmax), which at one
        # wide head (single-head, F features) is faster on CPU than the fused kernel of a unit
        # head axis (1.07-2.3x slower measured at N = F = 256, batch 8)
        flat = [[h] for h in heads]
        bias_operand, pad_value, pad_query_key, width = None, 0, 0, None
        if bias is not None:
            bias_operand = self.arrange(bias, [*flat, keys])
            # the fused kernels want one head width for q, k and v: zero features change nothing
            query_width, value_width = self.numel_number(latent) + 1, self.numel_number(features)
            if value_width < query_width:
                pad_value, width = query_width - value_width, value_width
            elif value_width > query_width:
                pad_query_key = value_width - query_width
        causal, visible = False, None
        if fused["masks"] and keys == [fused["masks"][0][1]]:
            causal = True
        elif fused["masks"]:
            visible = self.causal_attention_mask(fused["masks"][0], queries[0], keys)
        name = self.names.fresh("attended")
        legs = tuple(heads + queries + features)
        attention = Attention(
            self.arrange(q, [*flat, queries, latent]),
            self.arrange(k, [*flat, keys, latent]),
            self.arrange(v, [*flat, keys, features]),
            self.runtime(fused["scale"]),
            causal=causal,
            mask=visible,
            bias=bias_operand,
            pad_value=pad_value,
            pad_query_key=pad_query_key,
            width=width,
            shape=self.shape(legs) if len(queries) != 1 or len(features) != 1 else None,
        )
        entries = self.numel([*heads, *queries, *keys])
        latent_size = self.numel(latent) + (1 if bias is not None else 0)
        flops = 2 * entries * (latent_size + self.numel(features))
        description = (
            f"scaled_dot_product_attention over {' '.join(show_legs(keys))}, heads {' '.join(show_legs(heads))}"
        )
        if bias is not None:
            description += ", key bias as one more feature (MGK P17)"
        value = self.emit(
            Step(
                "sdpa",
                attention,
                Value(name, legs),
                description,
                tuple(keys),
                flops,
                exps=entries,
                divisions=entries,
                entries=entries,
                inputs=(q, k, v) if bias is None else (q, k, v, bias),
                paper=entries * (2 * latent_size - 1) + self.numel(legs) * (2 * self.numel(keys) - 1),
                score_flops=2 * entries * latent_size,
                score_paper=entries * (2 * latent_size - 1),
            )
        )
        if self.target is self.steps:
            how = " with the key bias as a feature (MGK P17)" if bias is not None else ""
            self.lowered.append(
                f"softmax box over {' '.join(show_legs(keys))} lowered to scaled_dot_product_attention{how}"
            )
        rest = [o for o in others if o not in fused["value"]]
        return [*rest, _Leaf(value.legs, value=value)]  # type: ignore[union-attr]

    def key_bias(self, fused: dict) -> Value:
        """Σ of the bias terms (each along heads and keys only) divided by the SDPA scale, so that
        [q, 1]·[k, bias] = q·k + bias/scale: the augmented keys of MGK P17."""
        heads, keys = fused["heads"], fused["keys"]
        parts = []
        for kind, weight, e in fused["biases"]:
            if kind == "norm":
                key_value, over = fused["key_norm"]
                kept = tuple(leg for leg in key_value.legs if leg not in over)
                value = self.squared_norm(key_value, kept)
            else:
                value = self.lower(e, fused["ren"])
            factor = sympy.simplify(weight * fused["box_scale"] / fused["scale"])
            if factor != 1:
                value = self.scale(value, factor)
            parts.append((1, self.as_missing_legs(value)))
        bias = self.combine("bias", parts, tuple(heads + keys), "bias") if len(parts) > 1 else parts[0][1]
        missing = [leg for leg in (*heads, *keys) if leg not in bias.legs]
        if not missing:
            return bias
        return self.materialize(bias, tuple(leg for leg in (*heads, *keys)))

    def causal_attention_mask(self, pair: tuple[str, str], query: str, keys: list[str]) -> Value:
        """The boolean SDPA mask (True = attend) of a causal mask over one of several flattened
        key legs: key (m, r) is visible from n when m ≤ n."""
        mask_query, mask_key = pair
        causal = Value(self.causal_mask(mask_query, mask_key), (mask_query, mask_key))
        aligned = self.align(causal, (query, *keys), invert=True)
        visible = Value(self.names.fresh("visible"), (query, *keys))
        op = VisibleMask(aligned, self.shape([query, *keys]), self.group_size([query]))
        self.emit(Step("mask", op, visible, inputs=()))
        return visible
