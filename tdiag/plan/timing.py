"""The `time` objective: a trial plan's training-step time estimated op by op on a roofline of
the planning device (device.py): each op takes the longer of its FLOPs at the device's peak and
the bytes it moves (copies included, from the footprint pass) at its bandwidth, plus a per-op
overhead; forward and backward together count three forward passes and two overheads."""

from __future__ import annotations

import sympy

from ..device import DeviceModel, planning_device
from .footprint import footprint
from .program import (
    BATCH_SIZE,
    ChunkCount,
    Elementwise,
    Map,
    MaskFill,
    Normalize,
    Plan,
    Ratio,
    Scale,
    Softmax,
    Step,
    executed_flops,
)

FORWARD_AND_BACKWARD = 3  # a backward pass costs about twice the forward's arithmetic and traffic
KERNELS_PER_OP = 2  # one kernel forward, about one backward


def step_time(device: DeviceModel, flops: float, moved: float, kind: str | None = None) -> float:
    """Seconds of one op in a training step: its forward and backward on the roofline, times the
    device's measured factor for the op's kind (`op_kind`)."""
    seconds = device.estimate(FORWARD_AND_BACKWARD * flops, FORWARD_AND_BACKWARD * moved)
    return (seconds + (KERNELS_PER_OP - 1) * device.overhead) * device.factor(kind)


def op_kind(op: object) -> str | None:
    """The elementwise kind the device model calibrates (device.measure_kinds), or None."""
    if isinstance(op, Normalize | Ratio):
        return "normalize"
    if isinstance(op, Softmax):
        return "softmax"
    if isinstance(op, MaskFill):
        return "mask"
    if isinstance(op, Map):
        return "map"
    if isinstance(op, Scale):
        return "scale"
    if isinstance(op, Elementwise):
        return "sum"
    return None


def plan_time(plan: Plan, device: DeviceModel, **sizes: int) -> float:
    """The estimated seconds of a training step (forward and backward) of the whole plan at its
    planned sizes, or at `sizes` (B included)."""
    at = plan.sizes | sizes
    graph = plan.graph

    def number(expr: sympy.Expr) -> float:
        value = graph.evaluate(sympy.sympify(expr), **{k: v for k, v in at.items() if k in graph.sizes})
        return float(value.xreplace({BATCH_SIZE: at.get("B", 1)}))

    records = footprint(plan).steps
    return sum(
        step_time(device, number(executed_flops(step)), number(record.moved), op_kind(step.op))
        for step, record in zip([*plan.steps, *plan.update_steps], records, strict=True)
    )


class TimeModel:
    """Estimates a lowering's training-step time on the planning device."""

    _device: DeviceModel | None = None
    estimates = 0  # trial estimates made: none means no choice the objective could change

    @property
    def device(self) -> DeviceModel:
        if self._device is None:
            self._device = planning_device()
        return self._device

    def context(self, steps: list[Step]) -> Plan:
        """The program so far with `steps` after it, for the footprint pass."""
        chunks = [ChunkCount(str(symbol), extent, size) for (extent, size), symbol in self.chunk_counts.items()]
        return Plan(
            self.g,
            dict(self.sizes),
            dict(self.leg_sizes),
            steps=[*self.steps, *steps],
            names=dict(self.input_vars),
            attributes=frozenset(self.attributes),
            causal=dict(self.causal_masks),
            chunks=chunks,
        )

    def estimated_time(self, steps: list[Step]) -> float:
        """Seconds a training step spends in `steps`, appended to the program so far."""
        self.estimates += 1
        records = footprint(self.context(steps)).steps[len(self.steps) :]
        return sum(
            step_time(
                self.device,
                self.at_planned_sizes(executed_flops(step)),
                self.at_planned_sizes(record.moved),
                op_kind(step.op),
            )
            for step, record in zip(steps, records, strict=True)
        )

    def at_planned_sizes(self, expr: sympy.Expr) -> float:
        value = self.g.evaluate(sympy.sympify(expr).xreplace(self.chunk_values), **self.sizes)
        return float(value.xreplace({BATCH_SIZE: self.sizes.get("B", 1)}))
