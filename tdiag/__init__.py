"""tdiag: a tensor-diagram compiler for attention designs.

design = tdiag.load("designs/thsa.td", F=256, H=4)   # parse + design graph + checks
design.show()   design.render("thsa.svg")   design.graph   # the design graph
"""

from .design import Design, load, loads
from .errors import Diagnostic, Span, TdiagError
from .graph import LIMITS, DesignGraph, Limits
from .weights import linear_weight, load_linear

__all__ = [
    "LIMITS",
    "DecodeCache",
    "Design",
    "DesignGraph",
    "Diagnostic",
    "Limits",
    "NotDecodableError",
    "Span",
    "TdiagError",
    "linear_weight",
    "load",
    "load_linear",
    "loads",
]
__version__ = "0.1.0"


def __getattr__(name: str) -> object:
    """`tdiag.DecodeCache` and `tdiag.NotDecodableError`, imported on first use: they need torch,
    which `import tdiag` does not load."""
    if name in ("DecodeCache", "NotDecodableError"):
        from . import decode

        return getattr(decode, name)
    raise AttributeError(f"module 'tdiag' has no attribute {name!r}")
