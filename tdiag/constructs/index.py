"""`index(n)`: the constant over leg n whose entry i is i, made from the run-time size of n (RoPE's
angles, ALiBi's distances). Its rules for every stage."""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..evaluation import EVALUATE
from ..ir import PositionIndex
from ..printing import DESCRIBE, PRINT, nothing_to_describe

if TYPE_CHECKING:
    import torch

    from ..reference import Frame


@EVALUATE.register(PositionIndex)
def evaluate(node: PositionIndex, frame: Frame) -> torch.Tensor:
    """The leg's positions (from its start in a decoding step) in the compute dtype."""
    return frame.leg_indices(node.leg).to(frame.dtype)


@PRINT.register(PositionIndex)
def text(e: PositionIndex) -> str:
    return f"index({e.leg})"


DESCRIBE.register(PositionIndex)(nothing_to_describe)
