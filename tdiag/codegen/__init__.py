"""Plan -> the source of a standalone PyTorch module: one class that imports only torch (and the
standard library), parameters named after the `.td` tensors with axes in declared order, one
line per step with its legs and cost as a comment. The in-process module runs this same text.

The printer in layers, each importing only those below it:
  text.py      the one door into the source (`source`): names, numbers, literals, sizes as Python
  state.py     what printing is in the middle of (tables made once, a float32 step's widened reads)
  helpers.py   the helper functions the generated file carries, as text
  stored.py    the module's stored tensors: their shapes and seeded initializer calls
  ops.py       one printer per tensor op (plan/ops.py), dispatched on the op's type (`op_code`)
  box_ops.py   the printers of a softmax box's lowered forms: chunks, bands, SDPA, FlexAttention
  steps.py     a step as lines of forward: assignment, legs and cost, run-time checks, autocast runs
  tables.py    steps computed once when the module is built (constant tables)
  entry.py     forward's entry: reading the inputs, binding run-time sizes, masks, noise
  forward.py   forward as a whole: signature, decoding cache, body, checkpoints, outputs
  calls.py     forward with call-time masks (attn_mask, key_padding_mask, is_causal)
  skeleton.py  `generate`: the file and the class around forward"""

from .calls import CALL_HELPERS, METHODS
from .helpers import CALLED_HELPERS, HELPERS
from .ops import op_code
from .skeleton import generate
from .state import TABLE_PREFIX
from .text import class_name, data_literal, python_text, source

__all__ = [
    "CALLED_HELPERS",
    "CALL_HELPERS",
    "HELPERS",
    "METHODS",
    "TABLE_PREFIX",
    "class_name",
    "data_literal",
    "generate",
    "op_code",
    "python_text",
    "source",
]
