"""The decoding step planned and compiled (issues 24 and 25, tdiag/decode_step.py): a "kv" cache
of a compiled module steps by generated code, equal to the reference evaluator's step and to the
causal forward; MLA's absorbed form is the planner's choice by its time model."""

import pytest
import torch
from conftest import DESIGN_FILES, DESIGNS
from test_decode import causal

import tdiag
from tdiag.decode import DecodeCache, NotDecodableError, check_decodes
from tdiag.decode_step import decode_form, pin_form, step_graphs

TOL = 1e-10
CHUNKS = [2, 1, 2, 1]  # a prompt, one position, two at once after cached ones, one more
FAST = ["mhsa", "llama", "deepseek_mla", "alibi", "t5_decoder", "rope_partial"]
_BUILT: dict[str, tuple[torch.nn.Module, torch.nn.Module] | None] = {}


def built(name: str) -> tuple[torch.nn.Module, torch.nn.Module] | None:
    """The design's causal form at small sizes as a compiled float64 module whose cache is of
    kind "kv" and its reference module with the same weights, built once per file; None where
    it has none."""
    if name not in _BUILT:
        design = causal(name)
        pair = None
        if design is not None and len(design.graph.inputs) == 1 and design.graph.sizes["N"].is_free:
            reference = design.module(dtype=torch.float64, impl="reference").eval()
            try:
                if DecodeCache(reference).kind == "kv":
                    module = design.module(dtype=torch.float64, objective="flops").eval()  # planned faster
                    reference.load_state_dict(module.state_dict())
                    pair = module, reference
            except NotDecodableError:
                pass
        _BUILT[name] = pair
    return _BUILT[name]


def compiled(name: str) -> torch.nn.Module | None:
    pair = built(name)
    return pair[0] if pair else None


def decoded(cache: DecodeCache, x: torch.Tensor) -> torch.Tensor:
    outputs, start = [], 0
    for count in CHUNKS:
        outputs.append(cache.extend(x[:, start : start + count]))
        start += count
    return torch.cat(outputs, 1)


def sequence(module: torch.nn.Module) -> torch.Tensor:
    graph = module.tdiag_plan.graph
    width = int(graph.evaluate(graph.inputs[0].axes[-1].size))
    return torch.randn(2, sum(CHUNKS), width, dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def check_design(name: str) -> DecodeCache:
    """Decode the design's compiled module in CHUNKS; equal to the reference evaluator's steps
    and (where the outputs do not depend on the length) to the causal forward."""
    module, reference_module = built(name)
    x = sequence(module)
    cache = DecodeCache(module)
    with torch.no_grad():
        steps = decoded(cache, x)
        reference = decoded(DecodeCache(reference_module), x)
        assert (steps - reference).abs().max().item() < TOL, name
        if not cache.rule.reads_length:
            assert (steps - module(x)).abs().max().item() < TOL, name
    assert cache.length == sum(CHUNKS)
    return cache


@pytest.mark.parametrize("name", FAST)
def test_compiled_step_equals_the_reference_step_and_the_forward(name):
    assert check_design(name).step.reason is None


# the designs whose "kv" steps the generated programs do not take (docs/decoding.md says why)
STEPPED_BY_THE_REFERENCE = {"cosformer", "gpt_neox", "phi"}


@pytest.mark.slow
def test_every_kv_design_steps_equal_to_the_reference_step_and_the_forward():
    by_reference = set()
    decoded_designs = 0
    for name in sorted(p.stem for p in DESIGN_FILES if p.stem not in FAST):
        if built(name) is None:
            continue
        decoded_designs += 1
        if check_design(name).step.reason is not None:
            by_reference.add(name)
    assert by_reference == STEPPED_BY_THE_REFERENCE
    assert decoded_designs > 35  # 45 kv designs (12 others hold a recurrent state), FAST among them


def test_a_sliding_window_steps_by_generated_code_hiding_the_keys_before_it():
    design = tdiag.load(DESIGNS / "mistral.td", F=8, H=2, W=2).with_causal_mask()
    module = design.module(dtype=torch.float64).eval()
    reference = design.module(dtype=torch.float64, impl="reference").eval()
    reference.load_state_dict(module.state_dict())
    x = sequence(module)
    cache = DecodeCache(module)
    assert cache.step.reason is None
    with torch.no_grad():
        steps = decoded(cache, x)
        assert (steps - decoded(DecodeCache(reference), x)).abs().max().item() < TOL
        assert (steps - module(x)).abs().max().item() < TOL
    wide = tdiag.load(DESIGNS / "mistral.td", F=8, H=2, W=6).with_causal_mask().module(dtype=torch.float64)
    wide.load_state_dict(module.state_dict())
    with torch.no_grad():
        assert (steps - wide(x)).abs().max().item() > 1e-3  # the window hides keys


def test_a_cached_tensor_read_at_the_new_positions_alone_steps_by_the_reference_evaluator_and_says_why():
    module = compiled("gpt_neox")
    cache = DecodeCache(module)
    assert "QKV is read at the new positions alone" in cache.step.reason and "reference evaluator" in repr(cache)
    x = sequence(module)
    with torch.no_grad():
        assert (decoded(cache, x) - module(x)).abs().max().item() < TOL


def test_noise_is_zero_in_a_compiled_step_as_in_eval_mode():
    module = compiled("fish")
    assert DecodeCache(module).step.reason is None
    check_design("fish")


NOISE_OVER_BOTH_POSITIONS = """
design noise_over_both
size N, F = 2
input X[n: N, f: F]
random E[m: N, n: N] = normal(mode = never)
T0[m n] = 0.25 * E[m n]
Y[n f] = causal(n, m) abs[m, mask = causal(n, m)](T0[m n] - T0[m n]) + X[n f]
output Y
"""


def test_noise_over_both_position_legs_that_no_cached_tensor_carries_steps_by_the_reference_evaluator():
    """The fuzzer's run at 390c4b1: the step's generated code made `torch.zeros(B, M, T)` with M
    bound by no input (NameError)."""
    module = tdiag.loads(NOISE_OVER_BOTH_POSITIONS).module(dtype=torch.float64).eval()
    cache = DecodeCache(module)
    assert "E is over every position" in cache.step.reason
    assert check_decodes(module, torch.randn(2, 5, 2, dtype=torch.float64), [2, 1, 1, 1]) < TOL


def test_a_design_reading_the_length_steps_by_generated_code_at_the_length_so_far():
    module = compiled("sigmoid_attention")
    assert DecodeCache(module).step.reason is None
    check_design("sigmoid_attention")


def test_a_reference_module_steps_by_the_reference_evaluator():
    module = causal("mhsa").module(dtype=torch.float64, impl="reference")
    assert DecodeCache(module).step is None


def test_several_new_positions_after_cached_ones_run_the_attention_program_once():
    module = compiled("llama")
    cache = DecodeCache(module)
    calls = []
    hooks = [
        program.register_forward_hook(lambda *_, key=key: calls.append(key))
        for key, program in (("one", cache.step.attend), ("any", cache.step.program("any")))
    ]
    x = sequence(module)
    with torch.no_grad():
        cache.extend(x[:, :2])
        three = cache.extend(x[:, 2:5])
        assert (three - module(x[:, :5])[:, 2:]).abs().max().item() < TOL
        cache.extend(x[:, 5:6])
    for hook in hooks:
        hook.remove()
    assert calls == ["any", "one"]  # the three positions at once with their causal mask, then one without


def test_the_step_programs_take_the_lengths_at_run_time():
    graphs = step_graphs(causal("llama").graph)
    sizes = {graphs.sizes["T"], graphs.sizes["M"]}
    for part in (graphs.attend, graphs.attend_one, graphs.rows):
        assert sizes & {name for name, size in part.sizes.items() if size.is_free}
        assert "N" not in part.sizes
    assert graphs.attend.sizes[graphs.sizes["P"]].definition is not None  # P = M − T


def test_the_compiled_step_runs_under_torch_compile():
    module = compiled("mhsa")
    cache = DecodeCache(module)
    x = sequence(module)
    with torch.no_grad():
        cache.extend(x[:, :3])
        attend = cache.step.attend
        rows = cache.step.rows
        new = x[:, 3:4]
        keys = {
            name: torch.cat([cache.tensors[name], part], 1) for name, part in zip(("K", "V"), rows(new), strict=True)
        }
        eager = attend(new, keys["K"], keys["V"])
        traced = torch.compile(attend, fullgraph=True, backend="eager")(new, keys["K"], keys["V"])
        assert (eager - traced).abs().max().item() == 0
        assert (eager - module(x[:, :4])[:, 3:]).abs().max().item() < TOL


def test_a_module_under_torch_compile_decodes_with_its_cache():
    module = compiled("mhsa")
    traced = torch.compile(module, backend="eager")
    cache = module.new_cache()
    x = sequence(module)
    with torch.no_grad():
        steps = [traced(x[:, :2], cache=cache)] + [traced(x[:, k : k + 1], cache=cache) for k in range(2, x.shape[1])]
        assert (torch.cat(steps, 1) - module(x)).abs().max().item() < TOL


@pytest.fixture(scope="module")
def mla() -> tdiag.Design:
    return tdiag.load(DESIGNS / "deepseek_mla.td").with_causal_mask()


def test_mla_takes_the_absorbed_form_for_one_query_against_a_long_cache(mla):
    form = decode_form(mla.graph, queries=1, past=1023)
    assert form.form == "absorbed"
    costs = {c.form: c for c in form.costs}
    assert costs["absorbed"].seconds < costs["plain"].seconds
    assert costs["absorbed"].width < costs["plain"].width  # the latent: fewer entries per position


def test_mla_takes_the_plain_form_over_a_whole_sequence(mla):
    assert decode_form(mla.graph, queries=4096, past=4096).form == "plain"


def test_mla_training_forward_stays_plain(mla):
    assert decode_form(mla.graph, queries=4096, past=0).form == "plain"


def test_the_cache_shows_the_form_and_its_estimates(mla):
    module = mla.module(dtype=torch.float64, objective="flops")
    cache = module.new_cache()
    assert cache.rule.cached == ("Ckn", "KRr")
    assert "absorbed form at T = 1 after P = 1023" in repr(cache)
    assert cache.step.reason is None


def test_a_pinned_form_replaces_the_planners_choice_and_says_so():
    design = tdiag.load(DESIGNS / "deepseek_mla.td", F=64, H=4).with_causal_mask()
    pin_form(design.graph, "plain")
    module = design.module(dtype=torch.float64).eval()
    cache = module.new_cache()
    assert cache.rule.cached == ("KN", "KRr", "Vh")
    assert "plain form pinned (the planner's choice" in repr(cache)
    x = torch.randn(1, 4, 64, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    with torch.no_grad():
        steps = torch.cat([cache.extend(x[:, :2]), cache.extend(x[:, 2:3]), cache.extend(x[:, 3:4])], 1)
        assert (steps - module(x)).abs().max().item() < TOL


def test_pinning_an_unknown_form_is_refused():
    with pytest.raises(ValueError, match="form must be 'plain' or 'absorbed'"):
        pin_form(causal("llama").graph, "latent")


def test_a_constant_over_the_length_that_the_step_never_reads_is_not_made_for_it():
    # the step's graph replaces the length N by its own sizes; a const over N it never reads was
    # kept and crashed planning the step (KeyError: 'N'; found by the fuzzer at 4bbeeea)
    text = (
        "design unread_constant\nsize F = 2, H = 1\nsize N\ninput X[n: N, f: F]\nconst U[f: F, n: N] = ones\n"
        "param WQ[f: F, d: F]\nparam WK[f: F, d: F]\nparam WV[f: F, h: H]\n"
        "A[n h] = softmax[m, mask = causal(n, m)](X[n f] WQ[f d] X[m k] WK[k d]) X[m j] WV[j h]\noutput A\n"
    )
    module = tdiag.loads(text).module(dtype=torch.float64).eval()
    assert DecodeCache(module).kind == "kv"
    from tdiag.decode import check_decodes

    x = torch.randn(1, 5, 2, dtype=torch.float64)
    assert check_decodes(module, x, [2, 1, 2]) < TOL
