"""Generated source -> a class: exec of the text codegen printed (never .td text), as a module of
its own with its lines in linecache, so a failure inside it shows the generated lines."""

from __future__ import annotations

import hashlib
import linecache
import sys
import types
from collections.abc import Callable, Mapping
from typing import TYPE_CHECKING

from .codegen import class_name

if TYPE_CHECKING:
    import torch


def compile_source(source: str, name: str, methods: Mapping[str, Callable] | None = None) -> type[torch.nn.Module]:
    """Run generated source as a module of its own, registered in sys.modules (torch.compile and
    pickle look classes up by module name); one module per distinct source. `methods` are set on
    its class (module.py's pickling and new_cache), so this file needs nothing above it."""
    module_name = f"tdiag_generated_{name}_{hashlib.sha256(source.encode()).hexdigest()[:12]}"
    if module_name not in sys.modules:
        filename = f"<tdiag {name}>"
        linecache.cache[filename] = (len(source), None, source.splitlines(True), filename)
        module = types.ModuleType(module_name)
        module.__file__ = filename
        exec(compile(source, filename, "exec"), module.__dict__)  # our own generated code, never .td text
        cls = getattr(module, class_name(name))
        cls.tdiag_generated = (source, name)
        sys.modules[module_name] = module
    cls = getattr(sys.modules[module_name], class_name(name))
    for method, function in (methods or {}).items():
        setattr(cls, method, function)
    return cls
