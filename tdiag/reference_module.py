"""The reference evaluator as a module: a design graph's parameters and buffers, run statement by
statement by the reference evaluator (reference.py), with a decoding cache that steps by it. It
sits above decode.py (new_cache), which evaluates through reference.py."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import torch
from torch import nn

from .graph import DesignGraph
from .init import initial_value, numeric_shape
from .ir import Tensor
from .reference import Frame, align, batch_dims, bind_sizes, evaluate, known_sizes, statement_value

__all__ = ["ReferenceModule"]


class ReferenceModule(nn.Module):
    """Evaluates `graph` directly and naively. Parameters are registered under their tensor's
    name with axes in declaration order; constants are non-persistent buffers, `buffer` tensors
    persistent ones. Values for one seed equal those of any module built with tdiag.init.

    forward(*inputs, return_intermediates=False, **masks): the `input` tensors positionally in
    declaration order, `mask` inputs by name (bool, True = attend; missing = attend everywhere).
    Returns the output (a tuple when there are several) and, with return_intermediates=True,
    also a dict of every statement's value by target name."""

    def __init__(
        self,
        graph: DesignGraph,
        sizes: Mapping[str, int] | None = None,
        *,
        seed: int = 0,
        dtype: torch.dtype = torch.float32,
    ):
        super().__init__()
        self.tdiag_graph = graph
        self.tdiag_dtype = dtype
        self.tdiag_sizes = known_sizes(graph, dict(sizes or {}))
        for tensor in graph.tensors.values():
            if tensor.kind not in ("param", "const", "buffer") or follows_the_input(tensor, graph, self.tdiag_sizes):
                continue
            shape = numeric_shape(tensor, self.tdiag_sizes, graph)
            value = initial_value(tensor, shape, graph, self.tdiag_sizes, seed, dtype)
            if tensor.kind == "param":
                self.register_parameter(tensor.name, nn.Parameter(value))
            else:
                self.register_buffer(tensor.name, value, persistent=tensor.kind == "buffer")

    def new_cache(self):
        """A decoding cache for this module (tdiag.DecodeCache), stepping by this evaluator:
        `self(x, cache=cache)` computes the positions of x after those it holds (docs/decoding.md)."""
        from .decode import DecodeCache

        return DecodeCache(self)

    def forward(
        self, *inputs: torch.Tensor, return_intermediates: bool = False, cache: object = None, **masks: torch.Tensor
    ) -> torch.Tensor | tuple[torch.Tensor, ...] | tuple[object, dict[str, torch.Tensor]]:
        if cache is not None:
            return self._tdiag_extend(cache, inputs, masks)
        given = self._tdiag_given(inputs, masks)
        sizes = bind_sizes(self.tdiag_graph, self.tdiag_sizes, given)
        batch_shape = torch.broadcast_shapes(*(batch_dims(x, self.tdiag_graph.tensors[n]) for n, x in given.items()))
        device = next(iter(given.values())).device if given else torch.device("cpu")
        frame = Frame(self.tdiag_graph, sizes, dict(given), self._tdiag_compute_dtype(inputs), device)
        for tensor in self.tdiag_graph.tensors.values():
            if tensor.kind == "const" and follows_the_input(tensor, self.tdiag_graph, self.tdiag_sizes):
                shape = numeric_shape(tensor, sizes, self.tdiag_graph)
                value = initial_value(tensor, shape, self.tdiag_graph, sizes, 0, frame.dtype)
                frame.values[tensor.name] = value.to(device)
            elif tensor.kind == "param" or tensor.kind == "const":
                frame.values[tensor.name] = getattr(self, tensor.name)
            elif tensor.kind == "buffer":  # a copy: the update below must not touch saved tensors
                frame.values[tensor.name] = getattr(self, tensor.name).clone()
            elif tensor.kind == "random":
                frame.values[tensor.name] = self._tdiag_noise(tensor, batch_shape, frame)
        intermediates = {}
        for statement in self.tdiag_graph.statements:
            frame.values[statement.target] = intermediates[statement.target] = statement_value(statement, frame)
        outputs = tuple(frame.values[name] for name in self.tdiag_graph.outputs)
        if self.training:
            self._tdiag_update_buffers(frame)
        output = outputs[0] if len(outputs) == 1 else outputs
        return (output, intermediates) if return_intermediates else output

    def _tdiag_compute_dtype(self, inputs: Sequence[torch.Tensor]) -> torch.dtype:
        """Constants, positions and noise are made in the first input's dtype, as in the compiled
        module, so that `.double()` on the module and float64 inputs evaluate in float64."""
        return next((x.dtype for x in inputs if x.is_floating_point()), self.tdiag_dtype)

    def _tdiag_extend(
        self, cache: object, inputs: Sequence[torch.Tensor], masks: Mapping[str, torch.Tensor]
    ) -> torch.Tensor | tuple[torch.Tensor, ...]:
        """The outputs at the positions of the one input, after those the decoding cache holds."""
        if not callable(getattr(cache, "extend", None)):
            raise TypeError(f"cache must be the decoding cache module.new_cache() makes, got {type(cache).__name__}")
        if len(inputs) != 1:
            raise ValueError(f"a decoding cache extends one input, got {len(inputs)}")
        return cache.extend(inputs[0], module=self, **masks)

    def _tdiag_given(
        self, inputs: Sequence[torch.Tensor], masks: Mapping[str, torch.Tensor]
    ) -> dict[str, torch.Tensor]:
        """The inputs and masks by name, checked for count, names and mask dtype."""
        declared = [t.name for t in self.tdiag_graph.inputs]
        if len(inputs) != len(declared):
            raise ValueError(
                f"{self.tdiag_graph.name} takes {len(declared)} input(s) ({', '.join(declared)}), got {len(inputs)}"
            )
        for name, x in zip(declared, inputs, strict=True):
            if not x.is_floating_point():
                raise TypeError(f"input {name} must be a floating-point tensor, got {x.dtype}")
        mask_names = [t.name for t in self.tdiag_graph.tensors_of_kind("mask")]
        for name, mask in masks.items():
            if name not in mask_names:
                known = ", ".join(mask_names) or "none"
                raise ValueError(f"{self.tdiag_graph.name} has no mask input '{name}' (its masks: {known})")
            if mask is not None and mask.dtype != torch.bool:
                raise ValueError(f"mask {name} must be a bool tensor (True = attend), got {mask.dtype}")
        return dict(zip(declared, inputs, strict=True)) | {k: v for k, v in masks.items() if v is not None}

    def _tdiag_noise(self, tensor: Tensor, batch_shape: torch.Size, frame: Frame) -> torch.Tensor:
        """Fresh N(0, 1) noise (global RNG) when the mode says so, zeros otherwise."""
        shape = (*batch_shape, *numeric_shape(tensor, frame.sizes, self.tdiag_graph))
        mode = tensor.init.param("mode", "train") if tensor.init else "train"
        if mode == "always" or (mode == "train" and self.training):
            return torch.randn(shape, dtype=frame.dtype, device=frame.device)
        return torch.zeros(shape, dtype=frame.dtype, device=frame.device)

    def _tdiag_update_buffers(self, frame: Frame) -> None:
        """Evaluate every update rule (no gradient, averaged over the batch dims) from this forward
        pass's values, then copy the results into the buffers."""
        new = {}
        with torch.no_grad():
            for update in self.tdiag_graph.updates:
                x = align(evaluate(update.expr, frame), update.expr.legs, update.legs)
                batch = x.dim() - len(update.legs)
                new[update.target] = x.mean(dim=tuple(range(batch))) if batch else x
            for name, x in new.items():
                buffer = getattr(self, name)
                buffer.copy_(x.reshape(buffer.shape))


def follows_the_input(tensor, graph: DesignGraph, sizes: Mapping[str, int]) -> bool:
    """A const over a run-time size (N) that the module was not built for: made at each call at
    the size read from the input, never stored (check refuses a param or buffer over one)."""
    return tensor.kind == "const" and any(not graph.evaluate(a.size, **sizes).is_Integer for a in tensor.axes)
