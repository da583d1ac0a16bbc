"""Memory footprint of a lowered program: which storages each op allocates, copies and saves for
the backward pass, found by running the program abstractly on shapes and strides (at the sizes it
runs at) with PyTorch's own rules: elementwise results keep their operands' memory order, reductions,
softmax and matmul results are contiguous, a reshape is a view exactly when torch's stride rule
allows it (else a copy), torch.matmul folds batch legs and saves the operands it multiplies, and
each autograd node saves what its backward reads (softmax and exp their result; log, pow, clamp,
elu their input; division both operands; masked_fill its mask; SDPA q, k, v, its output and the
log-sum-exp, or on the math fallback the whole attention; a boolean attn_mask converted to float).
The rules depend on the sizes the code runs at (a batch of one is a matrix to torch.matmul), so
the footprint is found at those sizes, not only at the ones planned for.

Input convention: the design's inputs need a gradient, as the input of a layer inside a network
does (tdiag.measure.INPUT_CONVENTION, which the measurement follows); their own storage is not
counted, as parameters' and buffers' is not.

Guarantees: `Footprint.saved` lists every activation storage autograd keeps after the forward
pass (parameters, buffers and inputs excluded), each once, with its size as a formula in the
design's sizes and B; `copies` the elements each step copies that the program does not show."""

from __future__ import annotations

from collections.abc import Mapping

from . import footprint_boxes, footprint_tensors  # noqa: F401  (they register their rules in RULES)
from .abstract import FLOAT, AbstractMachine, Footprint, Meta
from .footprint_rules import RULES
from .footprint_tensors import SHORT_ROW, bmm_loops, row_extent
from .program import Plan, Step

__all__ = ["FLOAT", "RULES", "SHORT_ROW", "Footprint", "Meta", "bmm_loops", "footprint", "row_extent"]


class _Interpreter(AbstractMachine):
    """The abstract machine with the op rules: each step runs through its op's rule (RULES)."""

    def op(self, op: object, step: Step) -> Meta | None:
        found = RULES.get(type(op))
        if found is None:
            raise TypeError(f"no footprint rule for {type(op).__name__}")
        return found(self, op, step)


def footprint(plan: Plan, sizes: Mapping[str, int] | None = None) -> Footprint:
    """The storages the plan's forward allocates and keeps for backward (see the module doc), when
    its code runs at `sizes` (default: the sizes it was planned for; B, the batch, defaults to 1)."""
    return _Interpreter(plan, sizes).run()
