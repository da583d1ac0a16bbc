"""A package's public names imported on first use (PEP 562): `import tdiag` and `import
tdiag.plan.program` then load only what they name, so a stage low in the layers never drags in
the parser, the planner or the facade through a package's `__init__`. A core module: it imports
nothing of tdiag."""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterable, Mapping


def lazy_exports(
    package: str, homes: Mapping[str, str], public: Iterable[str]
) -> tuple[Callable[[str], object], Callable[[], list[str]]]:
    """`__getattr__` and `__dir__` for `package`: a name of `homes` is imported from its module
    (`homes[name]`, relative to the package) the first time it is read, and kept; any other
    public name is a submodule, imported by its name (`tdiag.decode` after `import tdiag`)."""

    def attribute(name: str) -> object:
        if name in homes:
            value = getattr(importlib.import_module(f"{package}.{homes[name]}"), name)
            setattr(sys.modules[package], name, value)
            return value
        if name.isidentifier() and not name.startswith("_"):
            spec = importlib.util.find_spec(f"{package}.{name}")
            if spec is not None and spec.origin is not None:  # a module, not a folder of data
                return importlib.import_module(f"{package}.{name}")
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def names() -> list[str]:
        return sorted({*vars(sys.modules[package]), *public})

    return attribute, names
