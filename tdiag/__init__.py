"""tdiag: a tensor-diagram compiler for attention designs.

design = tdiag.load("designs/thsa.td", F=256, H=4)   # parse + design graph + checks
design.show()   design.render("thsa.svg")   design.graph   # the design graph
"""

from .design import Design, load, loads
from .errors import Diagnostic, Span, TdiagError
from .graph import LIMITS, DesignGraph, Limits

__all__ = ["LIMITS", "Design", "DesignGraph", "Diagnostic", "Limits", "Span", "TdiagError", "load", "loads"]
__version__ = "0.1.0"
