"""The Einstein product of factors (Tuformer Sec. 2.1): `summed` legs contracted, `batch` legs
kept and shared. Its rules for every stage."""

from __future__ import annotations

import string
from typing import TYPE_CHECKING

from ..evaluation import EVALUATE
from ..ir import Contraction

if TYPE_CHECKING:
    import torch

    from ..reference import Frame


@EVALUATE.register(Contraction)
def evaluate(node: Contraction, frame: Frame) -> torch.Tensor:
    """coefficient * einsum of the factors: `summed` legs are summed, the others kept."""
    inner = {leg for factor in node.factors for leg in factor.legs}
    assert inner == set(node.legs) | set(node.summed), f"contraction legs {inner} vs {node.legs} + {node.summed}"
    letters = dict(zip(sorted(inner | set(node.legs)), string.ascii_letters, strict=False))
    inputs = ",".join("..." + "".join(letters[leg] for leg in factor.legs) for factor in node.factors)
    spec = f"{inputs}->..." + "".join(letters[leg] for leg in node.legs)
    return frame.number(node.coefficient) * frame.einsum(spec, *(frame.evaluate(f) for f in node.factors))
