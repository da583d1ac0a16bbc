"""tdiag: a tensor-diagram compiler for attention designs.

design = tdiag.load("designs/thsa.td", F=256, H=4)   # parse + design graph + checks
design.show()   design.render("thsa.svg")   design.graph   # the design graph

The package's public names (`__all__`) are the facade's; each is imported on first use (PEP 562,
lazy.py), so `import tdiag` loads no stage and `import tdiag.plan.program` loads the program IR
without the parser. The modules form layers, each importing only those before it:

    core        errors, names, objectives, device, files, resources, rules, lazy, notebook
    language    parse, ir, graph/, check, printer: text -> syntax -> design graph, checked
    planner     plan/: program IR -> prices -> lowering -> forms -> chooser -> passes
    backends    codegen*, cost*, render*: a Plan as Python text, cost reports, diagrams
    runtime     module, reference, decode*, init, weights, thsa: nn.Module, oracle, caches
    constructs  constructs/: one module per expression kind, its rules for every stage
    facade      design (Design, load, loads), call_plans, this package
    tools       cli, train*, bench, measure, space/, hf, gpu_report, catalog, runs, ...

`make lint` checks the contract (scripts/architecture.py check; README, "Layers")."""

from __future__ import annotations

from typing import TYPE_CHECKING

from .lazy import lazy_exports

if TYPE_CHECKING:
    from .decode import DecodeCache, NotDecodableError
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

# The module each public name lives in. DecodeCache and NotDecodableError need torch, which the
# others never load.
_HOMES = {
    "DecodeCache": "decode",
    "NotDecodableError": "decode",
    "Design": "design",
    "load": "design",
    "loads": "design",
    "Diagnostic": "errors",
    "Span": "errors",
    "TdiagError": "errors",
    "LIMITS": "graph",
    "DesignGraph": "graph",
    "Limits": "graph",
    "linear_weight": "weights",
    "load_linear": "weights",
}

__getattr__, __dir__ = lazy_exports(__name__, _HOMES, __all__)
