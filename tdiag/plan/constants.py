"""Constant folding: identity constants merge the legs they join, fills and all-ones become a
coefficient, so THSA with C = I_H ⊗ J_D costs what MHSA costs (Tuformer Prop. 1).
Guarantees: no identity or all-ones tensor reaches an op."""

from __future__ import annotations

import sympy

from .base import _Leaf


class ConstantFolding:
    """Folds identity and all-ones constants out of a region."""

    def fold_constants(self, leaves: list[_Leaf], out: tuple[str, ...], coefficient: sympy.Expr):
        """Identity constants merge the legs they join; fills and all-ones become a coefficient."""
        parent: dict[str, str] = {}

        def find(leg: str) -> str:
            while parent.get(leg, leg) != leg:
                leg = parent[leg]
            return leg

        kept: list[_Leaf] = []
        for leaf in leaves:
            tensor = leaf.tensor
            if tensor is None or tensor.kind != "const" or tensor.init is None:
                kept.append(leaf)
                continue
            init = tensor.init
            if init.name in ("ones", "zeros", "fill"):
                value = {"ones": sympy.Integer(1), "zeros": sympy.Integer(0)}.get(init.name)
                coefficient *= value if value is not None else sympy.sympify(init.param("value"))
                continue
            roots = {find(leg) for leg in leaf.legs}
            if init.name == "identity" and len([r for r in roots if r in out]) <= 1:
                coefficient *= sympy.sympify(init.param("scale", sympy.Integer(1)))
                anchor = next((r for r in roots if r in out), sorted(roots)[0])
                for root in roots:
                    parent[root] = anchor
                parent.setdefault(anchor, anchor)
                continue
            kept.append(leaf)
        if not parent:
            return kept, out, coefficient
        renamed = [
            _Leaf(
                tuple(find(leg) for leg in leaf.legs),
                leaf.tensor,
                leaf.value,
                tuple(tuple(find(leg) for leg in a) for a in leaf.view),
            )
            for leaf in kept
        ]
        return renamed, tuple(find(leg) for leg in out), coefficient
