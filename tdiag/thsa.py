"""Tuformer helpers for THSA-family modules: the core matrix C, its stable rank (the number of
heads, Tuformer Def. 2 read as Σσ²/max σ², spec tuformer.md A2) and the exact initialization of
THSA from a trained MHSA (Prop. 1 with C = √H·(I_H ⊗ J_D), spec §3.2, P1)."""

from __future__ import annotations

import math

import torch
from torch import nn

from .graph import DesignGraph
from .init import initial_value, numeric_shape
from .reference import Frame, statement_value


def _graph(module: nn.Module) -> DesignGraph:
    plan = getattr(module, "tdiag_plan", None)
    graph = plan.graph if plan is not None else getattr(module, "graph", None)
    if graph is None:
        raise TypeError("expected a module built by tdiag (Design.module())")
    return graph


def core_matrix(module: nn.Module) -> torch.Tensor:
    """The R×R core C of a THSA-family module, evaluated from its own tensors when it is derived
    (skip-left, skip-right, Kronecker: C = C1 ⊗ C2ᵀC3)."""
    graph = _graph(module)
    tensor = graph.tensors.get("C")
    if tensor is None:
        raise ValueError(f"design '{graph.name}' has no core matrix C")
    stored = dict(module.named_parameters()) | dict(module.named_buffers())
    sizes = {k: int(v) for k, v in graph.size_values().items()}
    value = next(iter(stored.values()))
    frame = Frame(graph, sizes, {k: v.detach() for k, v in stored.items()}, value.dtype, value.device)
    for const in graph.tensors_of_kind("const"):  # folded away by the compiler, so made here
        if const.name not in frame.values:
            shape = numeric_shape(const, sizes, graph)
            frame.values[const.name] = initial_value(const, shape, graph, sizes, dtype=value.dtype).to(value.device)
    for statement in graph.statements:
        if statement.target == "C" or statement.target in graph.depends_on("C"):
            frame.values[statement.target] = statement_value(statement, frame)
    return frame.values["C"].detach()


def stable_rank(core: torch.Tensor | nn.Module) -> float:
    """Σσ²/max σ² = ‖C‖_F² / ‖C‖_2²: H for I_H ⊗ J_D, 1 for J_R, between 1 and rank(C)."""
    matrix = core_matrix(core) if isinstance(core, nn.Module) else core
    matrix = matrix.detach().to(torch.float64)
    singular = torch.linalg.matrix_norm(matrix, ord=2)
    return float(torch.linalg.matrix_norm(matrix, ord="fro") ** 2 / singular**2)


@torch.no_grad()
def init_from_mhsa(thsa: nn.Module, mhsa: nn.Module) -> None:
    """Copy MHSA into THSA so both compute the same function: the projections are stacked
    head-major (r = h·D + d), W^O is reshaped, and C = √H·(I_H ⊗ J_D) makes up for THSA's 1/√R
    against MHSA's 1/√D. `mhsa` is a module compiled from mhsa.td or a bias-free
    torch.nn.MultiheadAttention."""
    if isinstance(mhsa, nn.MultiheadAttention):
        if mhsa.in_proj_bias is not None or mhsa.out_proj.bias is not None or mhsa.in_proj_weight is None:
            raise ValueError("init_from_mhsa copies a bias-free MultiheadAttention with one input projection")
        width, heads = mhsa.embed_dim, mhsa.num_heads
        wq, wk, wv = (w.T for w in mhsa.in_proj_weight.chunk(3))
        wo = mhsa.out_proj.weight.T
    else:
        width, heads = mhsa.WQ.shape[0], mhsa.WQ.shape[1]
        wq, wk, wv = (w.reshape(width, -1) for w in (mhsa.WQ, mhsa.WK, mhsa.WV))
        wo = mhsa.WO.reshape(-1, mhsa.WO.shape[-1])
    rank = wq.shape[1]
    if thsa.C.shape != (rank, rank):
        raise ValueError(f"THSA core has shape {tuple(thsa.C.shape)}, but MHSA has rank H·D = {rank}")
    for name, value in (("WQ", wq), ("WK", wk), ("WV", wv), ("WO", wo)):
        getattr(thsa, name).copy_(value.reshape(getattr(thsa, name).shape))
    blocks = torch.block_diag(*[torch.ones(rank // heads, rank // heads)] * heads)
    thsa.C.copy_(math.sqrt(heads) * blocks)
