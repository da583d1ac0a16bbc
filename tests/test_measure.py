"""tdiag.measure: the bytes autograd saves for backward, by storage and by the op that saves them,
without parameters, buffers and inputs; and the wall time of training steps."""

import gc
import weakref

import torch
from conftest import DESIGNS
from torch import nn
from torch.utils.checkpoint import checkpoint

import tdiag
from tdiag.measure import saved_for_backward, time_step

B, N, F, G = 2, 5, 3, 7
FLOAT = 4  # bytes


class Lambda(nn.Module):
    """A module with one parameter W[F, G] whose forward is `body(self, *inputs, **kw)`."""

    def __init__(self, body):
        super().__init__()
        self.W = nn.Parameter(torch.randn(F, G))
        self.register_buffer("scale", torch.ones(G))
        self.body = body

    def forward(self, *inputs, **kw):
        return self.body(self, *inputs, **kw)


def x():
    return torch.randn(B, N, F)


def softmax_of_projection(m, x):
    return (x @ m.W).softmax(-1)


def test_the_softmax_of_x_at_w_saves_exactly_its_output():
    saved = saved_for_backward(Lambda(softmax_of_projection), x())
    assert saved.total_bytes == B * N * G * FLOAT
    assert saved.tensors == 1
    assert saved.storages[0].saved_by == ("SoftmaxBackward0.result",)
    assert saved.storages[0].shape == (B, N, G)


def test_parameters_buffers_and_inputs_are_not_counted():
    saved = saved_for_backward(Lambda(lambda m, x: (x @ m.W) * m.scale), x())
    assert saved.total_bytes == 0 and saved.storages == []


def test_an_input_needs_a_gradient_as_inside_a_network_whether_or_not_the_tensor_given_does():
    for given in (x(), x().requires_grad_()):
        saved = saved_for_backward(Lambda(lambda m, x: x.exp() + m.W.sum()), given)
        assert saved.total_bytes == B * N * F * FLOAT  # exp keeps its result for the input's gradient


def test_a_boolean_input_is_passed_as_it_is():
    """A mask cannot need a gradient; masked_fill keeps it, but as an input it is held anyway."""
    keep = torch.ones(B, N, G) > 0
    saved = saved_for_backward(Lambda(lambda m, x, keep: (x @ m.W).masked_fill(keep, 0)), x(), keep)
    assert saved.tensors == 0 and saved.total_bytes == 0


def test_a_storage_saved_by_two_ops_counts_once():
    saved = saved_for_backward(Lambda(lambda m, x: (h := x @ m.W).sin() + h.cos()), x())
    assert saved.tensors == 2
    assert saved.total_bytes == B * N * G * FLOAT
    assert set(saved.storages[0].saved_by) == {"SinBackward0.self", "CosBackward0.self"}


def test_by_node_charges_each_storage_to_its_first_saver():
    saved = saved_for_backward(Lambda(lambda m, x: (h := x @ m.W).sin() + h.cos() + h.exp()), x())
    assert saved.by_node() == {"SinBackward0": B * N * G * FLOAT, "ExpBackward0": B * N * G * FLOAT}


def test_a_saved_view_counts_its_whole_storage():
    saved = saved_for_backward(Lambda(lambda m, x: (x @ m.W)[..., :1].sin()), x())
    assert saved.storages[0].shape == (B, N, 1)
    assert saved.total_bytes == B * N * G * FLOAT


def test_what_a_dropped_branch_saved_is_not_counted():
    def body(m, x):
        (x @ m.W).exp()  # its graph and saved result die with it
        return (x @ m.W).sin()

    assert saved_for_backward(Lambda(body), x()).tensors == 1


def test_several_inputs_and_a_keyword_mask_are_all_excluded():
    def body(m, a, b, *, mask):
        return (a @ m.W + b).masked_fill(mask, 0.0)

    mask = torch.rand(B, N, G) > 0.5
    saved = saved_for_backward(Lambda(body), x(), torch.randn(B, N, G), mask=mask)
    assert saved.total_bytes == 0


def test_a_mask_made_inside_the_forward_is_counted_at_one_byte_per_entry():
    saved = saved_for_backward(Lambda(lambda m, x: (x @ m.W).masked_fill(x[..., :1] > 0, 0.0)), x())
    assert saved.total_bytes == B * N * 1
    assert saved.storages[0].dtype == "bool"


def test_what_checkpoint_saves_is_reported_as_recomputed_not_stored():
    saved = saved_for_backward(
        Lambda(lambda m, x: checkpoint(lambda h: h.exp().sin(), x @ m.W, use_reentrant=False)), x()
    )
    assert saved.total_bytes == 0 and saved.recomputed == 2


def test_a_compiled_design_with_a_padding_mask_attributes_every_storage_to_a_node_and_a_line():
    text = (DESIGNS / "mhsa.td").read_text()
    text = text.replace("softmax[m, scale = 1 / sqrt(D)]", "softmax[m, scale = 1 / sqrt(D), mask = pad[m]]")
    design = tdiag.loads(text.replace("param WQ", "mask pad[m: N]\nparam WQ", 1), F=8, H=2)
    module = design.module(N=N)
    saved = saved_for_backward(module, torch.randn(B, N, 8), pad=torch.ones(B, N, dtype=torch.bool))
    assert saved.total_bytes > 0
    assert all(s.saved_by and s.where and "<tdiag" in s.where[0] for s in saved.storages)


def test_the_table_shows_the_op_and_the_code_line_that_saved_each_storage():
    table = str(saved_for_backward(Lambda(softmax_of_projection), x()))
    assert f"{B * N * G * FLOAT:,} bytes" in table
    assert "SoftmaxBackward0.result" in table
    assert "(x @ m.W).softmax(-1)" in table


def test_time_step_times_only_the_repeats_and_runs_backward():
    module = Lambda(softmax_of_projection)
    times = time_step(module, x(), repeats=3, warmup=1)
    assert len(times) == 3 and all(t > 0 for t in times)
    assert module.W.grad is not None


def test_time_step_without_backward_computes_no_gradient():
    module = Lambda(lambda m, x, *, shift: (x @ m.W + shift).softmax(-1))
    assert len(time_step(module, [x()], kwargs={"shift": 1.0}, backward=False, repeats=2, warmup=0)) == 2
    assert module.W.grad is None


def test_bench_rounds_start_at_each_implementation_in_turn():
    from tdiag.bench import measure_all

    calls: list[str] = []

    class Recorder(torch.nn.Module):
        def __init__(self, name: str):
            super().__init__()
            self.name, self.w = name, torch.nn.Parameter(torch.ones(()))

        def forward(self, x):
            calls.append(self.name)
            return x * self.w

    modules = [Recorder("a"), Recorder("b"), Recorder("c")]
    measure_all(modules, torch.randn(2, 3), causal=False, repeat=3)
    timed = calls[6:15]  # after two warm-up steps of each
    assert [timed[0], timed[3], timed[6]] == ["a", "b", "c"]
    assert sorted(timed) == ["a"] * 3 + ["b"] * 3 + ["c"] * 3


def test_what_autograd_saved_is_freed_when_the_measurement_returns():
    """The graph's hooks hold the record of saved tensors, which holds the graph: a cycle Python's
    collector cannot break unless the record is emptied."""
    outputs = []

    def body(m, x):
        y = (x @ m.W).softmax(-1)
        outputs.append(weakref.ref(y))
        return y

    saved_for_backward(Lambda(body), x())
    gc.collect()
    assert outputs[0]() is None
