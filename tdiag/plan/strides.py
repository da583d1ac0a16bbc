"""PyTorch's layout rules, on sizes and strides: when a reshape is a view (computeStride), how
an elementwise op lays out its result (TensorIterator's reorder_dimensions). The footprint pass
applies them to know which reads of the lowered program copy."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import Protocol


class Strided(Protocol):
    shape: tuple[int, ...]
    strides: tuple[int, ...]


def contiguous(shape: Sequence[int]) -> tuple[int, ...]:
    strides, step = [], 1
    for size in reversed(shape):
        strides.append(step)
        step *= max(size, 1)
    return tuple(reversed(strides))


def view_strides(shape: Sequence[int], strides: Sequence[int], new: Sequence[int]) -> tuple[int, ...] | None:
    """The strides of `reshape(new)` when it is a view, else None (torch's computeStride)."""
    if math.prod(shape) == 0 or not shape:
        return contiguous(new)
    result = [0] * len(new)
    view_d = len(new) - 1
    chunk = strides[-1]
    tensor_numel = view_numel = 1
    for d in range(len(shape) - 1, -1, -1):
        tensor_numel *= shape[d]
        if d == 0 or (shape[d - 1] != 1 and strides[d - 1] != tensor_numel * chunk):
            while view_d >= 0 and (view_numel < tensor_numel or new[view_d] == 1):
                result[view_d] = view_numel * chunk
                view_numel *= new[view_d]
                view_d -= 1
            if view_numel != tensor_numel:
                return None
            if d > 0:
                chunk, tensor_numel, view_numel = strides[d - 1], 1, 1
    return tuple(result) if view_d == -1 else None


def elementwise_strides(shape: Sequence[int], operands: Sequence[Strided]) -> tuple[int, ...]:
    """The output strides torch's TensorIterator gives an elementwise op: dims ordered by the
    operands' strides, the first operand deciding (reorder_dimensions), broadcast dims skipped."""
    ndim = len(shape)
    aligned = []
    for m in operands:
        pad = ndim - len(m.shape)
        aligned.append(
            tuple(0 if k < pad or m.shape[k - pad] == 1 != shape[k] else m.strides[k - pad] for k in range(ndim))
        )

    def should_swap(d0: int, d1: int) -> int:
        for strides in aligned:
            s0, s1 = strides[d0], strides[d1]
            if s0 == 0 or s1 == 0:
                continue
            if s0 < s1:
                return -1
            if s0 > s1:
                return 1
            if shape[d0] > shape[d1]:
                return 1
        return 0

    perm = list(range(ndim - 1, -1, -1))  # innermost first
    for i in range(1, ndim):
        d1 = i
        for d0 in range(i - 1, -1, -1):
            comparison = should_swap(perm[d0], perm[d1])
            if comparison > 0:
                perm[d0], perm[d1] = perm[d1], perm[d0]
                d1 = d0
            elif comparison < 0:
                break
    strides, step = [0] * ndim, 1
    for d in perm:
        strides[d] = step
        step *= max(shape[d], 1)
    return tuple(strides)


def padded(shape: tuple[int, ...], full: tuple[int, ...]) -> tuple[int, ...]:
    return (1,) * (len(full) - len(shape)) + shape
