"""The words of the .td language that name no tensor: boxes, elementwise maps, reductions, pairings,
mask and position functions, box options and initializers, each a tuple or dict that the builder
checks names against and lists in its hints (`one of: ...`); BUILD, the table of build rules by
word, and FUNCTIONS, every word it has a rule for and the scalar functions; and the stand-ins (POISON_NAME,
POISON_SIZE) that let one mistake be reported once."""

from __future__ import annotations

from collections.abc import Collection, Iterable, Iterator

import sympy

from ..rules import Rules

BOXES = ("softmax", "normalize")
# elementwise maps: name -> number of arguments after the tensor
MAPS = {
    **dict.fromkeys(
        ("exp", "log", "relu", "elu1", "sigmoid", "tanh", "softplus", "silu", "gelu", "sin", "cos", "sqrt", "abs"), 0
    ),
    "clamp": 2,
}
REDUCTIONS = ("max", "logsumexp", "mean")
# `sum[k](x)`: the leg rule's sum written out, Σ_k x, for a leg that one factor alone carries
SUMS = ("sum",)
# `max(x, c)`, `min(x, c)`: a tensor and a number or size, elementwise (no legs): the map's name
BOUNDS = {"max": "maximum", "min": "minimum"}
# maps written as another expression: `rsqrt(x)` is x ^ -0.5 (torch.rsqrt, as RMS norms are written)
RSQRT = "rsqrt"
SCANS = ("cumsum", "logcumsumexp")  # prefix scans along a position leg, which stays
SEGMENT_SUMS = ("segsum",)  # Σ_{k=m+1..n} a_k over (n, m), causal
CONVOLUTIONS = ("conv",)  # conv[n = n - i](x, kernel): shifts along position legs, summed with a kernel
PAIRINGS = ("sqdist",)
SCALAR_FUNCTIONS = ("sqrt", "exp", "log", "floor", "ceil")  # of numbers and sizes: a scalar, not a map
MASK_FACTORS = ("causal", "window")
POSITION_FUNCTIONS = ("index",)

BUILD: Rules = Rules("build")  # word of the language -> rule(expression builder, call, legs kept)


class Words(Collection[str]):
    """The words of the language that call a function: every word a construct registers a build
    rule for (`rules`, tdiag/constructs) and the `scalar` functions of numbers and sizes. Read from
    the table when asked, so a construct's new word needs no edit here."""

    def __init__(self, rules: Rules, scalar: Iterable[str]):
        self.rules, self.scalar = rules, frozenset(scalar)

    def __contains__(self, name: object) -> bool:
        return isinstance(name, str) and (self.rules.named(name) is not None or name in self.scalar)

    def __iter__(self) -> Iterator[str]:
        return iter(sorted(self.rules.names() | self.scalar))

    def __len__(self) -> int:
        return len(self.rules.names() | self.scalar)


FUNCTIONS = Words(BUILD, SCALAR_FUNCTIONS)
BOX_OPTIONS = {"softmax": ("mask", "scale", "sink"), "normalize": ("eps", "mask")}
SCAN_OPTIONS = ("exclusive", "mask", "reverse")  # exclusive = 1, reverse = 1: flags, 0 or 1
INITIALIZERS = {
    "param": ("fill", "identity", "normal", "ones", "uniform", "values", "zeros"),
    "const": ("fill", "identity", "ones", "values", "zeros"),
    "buffer": ("fill", "normal", "ones", "uniform", "zeros"),
    "random": ("normal",),
}
INIT_PARAMS = {
    "normal": ("mean", "std"),
    "uniform": ("low", "high"),
    "fill": ("value",),
    "identity": ("scale",),
    "ones": (),
    "zeros": (),
    "values": (),  # any number of entries, row-major
}
RANDOM_MODES = ("always", "never", "train")


POISON_NAME = ""  # the name of a stand-in for an expression that had an error
POISON_SIZE = sympy.Symbol("_invalid_", positive=True)  # the size of a leg bound by a mistake
