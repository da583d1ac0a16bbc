"""Creating the stored tensors of a design: parameters from their initializers, constants and
buffers from their fills. Deterministic for a seed: each tensor draws from its own generator
seeded from (seed, tensor name), so adding a tensor does not change the others."""

from __future__ import annotations

import hashlib
from collections.abc import Mapping
from typing import TYPE_CHECKING

import sympy

from .graph import DesignGraph
from .graph.model import numeric_shape as numeric_shape  # moved to the language; still read from here
from .ir import Init, Tensor

if TYPE_CHECKING:
    import torch


def tensor_seed(seed: int, name: str) -> int:
    digest = hashlib.sha256(f"{seed}:{name}".encode()).digest()
    return int.from_bytes(digest[:8], "little") & ((1 << 63) - 1)


def _number(value: sympy.Expr | str | None, graph: DesignGraph, sizes: Mapping[str, int], default: float) -> float:
    if value is None:
        return default
    return float(graph.evaluate(sympy.sympify(value), **sizes))


def initial_value(
    tensor: Tensor,
    shape: tuple[int, ...],
    graph: DesignGraph,
    sizes: Mapping[str, int],
    seed: int = 0,
    dtype: torch.dtype | None = None,
) -> torch.Tensor:
    """The tensor's initial value (float32 unless `dtype` is given). A param without an initializer
    gets normal(std=1/sqrt(fan_in)), fan_in being the size of its first axis, 1 for a scalar
    (docs/language.md)."""
    import torch

    init = tensor.init or Init("normal", (("std", sympy.Integer(shape[0] if shape else 1) ** sympy.Rational(-1, 2)),))
    generator = torch.Generator().manual_seed(tensor_seed(seed, tensor.name))
    value = torch.empty(shape, dtype=torch.float64)
    if init.name == "normal":
        value.normal_(
            _number(init.param("mean"), graph, sizes, 0.0),
            _number(init.param("std"), graph, sizes, 1.0),
            generator=generator,
        )
    elif init.name == "uniform":
        value.uniform_(
            _number(init.param("low"), graph, sizes, 0.0),
            _number(init.param("high"), graph, sizes, 1.0),
            generator=generator,
        )
    elif init.name in ("zeros", "ones", "fill"):
        value.fill_({"zeros": 0.0, "ones": 1.0}.get(init.name) or _number(init.param("value"), graph, sizes, 0.0))
    elif init.name == "identity":
        value = identity(shape, dtype=torch.float64) * _number(init.param("scale"), graph, sizes, 1.0)
    elif init.name == "values":
        entries = [float(graph.evaluate(v, **sizes)) for v in init.values]
        value = torch.tensor(entries, dtype=torch.float64).reshape(shape)
    else:
        raise AssertionError(f"initializer {init.name} was not checked")
    return value.to(dtype or torch.float32)


def identity(shape: tuple[int, ...], dtype: torch.dtype | None = None) -> torch.Tensor:
    """δ over all axes (which have one size): 1 where every index is equal (float32 by default)."""
    import torch

    value = torch.zeros(shape, dtype=dtype or torch.float32)
    value[(torch.arange(shape[0]),) * len(shape) if shape else ()] = 1  # a scalar's δ is 1
    return value
