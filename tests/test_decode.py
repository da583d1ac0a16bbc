"""Incremental decoding with a cache (issue 25, tdiag/decode.py): a step computes the new positions
from their own inputs and the cached key-side rows, and equals the causal forward over the
sequence so far, for every bundled design that has a causal form."""

import pytest
import torch
from conftest import DESIGN_FILES, DESIGNS

import tdiag
from tdiag import TdiagError
from tdiag.decode import DecodeCache, NotDecodableError, decode_rule

TOL = 1e-10
LENGTH, PROMPT = 5, 2


def small_sizes(name: str) -> dict[str, int]:
    sizes = {"F": 8, "H": 2}
    if "mgk" in name or "mlk" in name:
        sizes["D"] = 4
    return sizes


def causal(name: str, **sizes: int) -> tdiag.Design | None:
    """The design's causal form at small sizes (and `sizes`), or None where it has none."""
    try:
        return tdiag.load(DESIGNS / f"{name}.td", **(small_sizes(name) | sizes)).with_causal_mask()
    except TdiagError:
        return None


@pytest.fixture(scope="module")
def decoders() -> dict[str, torch.nn.Module]:
    """Every bundled design that has a causal form and one input over a run-time length, as its
    reference module in float64 (the graph evaluated as written), built once."""
    built = {}
    for path in DESIGN_FILES:
        design = causal(path.stem)
        if design is None or len(design.graph.inputs) != 1 or not design.graph.sizes["N"].is_free:
            continue
        built[path.stem] = design.module(dtype=torch.float64, impl="reference").eval()
    return built


def width(module: torch.nn.Module) -> int:
    graph = module.tdiag_graph
    return int(graph.evaluate(graph.inputs[0].axes[-1].size))


def inputs(module: torch.nn.Module, n: int = LENGTH) -> torch.Tensor:
    return torch.randn(2, n, width(module), dtype=torch.float64, generator=torch.Generator().manual_seed(1))


def decoded(module: torch.nn.Module, x: torch.Tensor, chunks: list[int]) -> list[torch.Tensor]:
    cache = DecodeCache(module)
    outputs, start = [], 0
    for count in chunks:
        outputs.append(cache.extend(x[:, start : start + count]))
        start += count
    return outputs


def test_the_bundled_causal_designs_are_all_decoded(decoders):
    assert len(decoders) >= 55
    assert {"mhsa", "llama", "deepseek_mla", "t5_decoder", "alibi", "mamba2_ssd", "relu2_attention"} <= set(decoders)


@pytest.mark.parametrize(
    "chunks",
    [[1] * LENGTH, [PROMPT] + [1] * (LENGTH - PROMPT), [PROMPT, 2, LENGTH - PROMPT - 2]],
    ids=["tokens", "prompt", "prompt_then_chunks"],
)
def test_each_step_equals_the_causal_forward_over_the_sequence_so_far(decoders, chunks):
    """Where the outputs do not depend on the length (all but three), the rows of the whole
    forward; for the three that read it, the forward over the positions so far."""
    wrong = {}
    for name, module in decoders.items():
        x = inputs(module)
        whole = module(x)
        stable = not DecodeCache(module).rule.reads_length
        start = 0
        for count, step in zip(chunks, decoded(module, x, chunks), strict=True):
            so_far = whole if stable or start + count == LENGTH else module(x[:, : start + count])
            expected = so_far[:, start : start + count]
            if not torch.allclose(step, expected, atol=TOL, rtol=0):
                wrong[name] = (step - expected).abs().max().item()
            start += count
    assert not wrong


def test_the_designs_that_read_the_length_are_known(decoders):
    reading = {name for name, module in decoders.items() if DecodeCache(module).rule.reads_length}
    assert reading == {"cosformer", "relu2_attention", "sigmoid_attention"}


@pytest.mark.parametrize(
    ("name", "cached"),
    [
        ("mhsa", ("K", "V")),
        ("llama", ("Kr", "V")),  # the RoPE-rotated keys
        ("alibi", ("K", "V")),
        ("t5_decoder", ("K", "V")),
        ("deepseek_mla", ("Ckn", "KRr")),  # the normalized latent and the shared rotated key
        ("gpt_neox", ("Kr", "QKV")),  # the fused projection, read at every key for its pass-through part
        ("differential_attention", ("K1", "K2", "V")),
        ("rope_partial", ("Kr", "X", "V")),  # the pass-through scores read the input itself at every key
    ],
)
def test_softmax_designs_cache_the_smallest_rows_the_attention_reads_at_every_key(name, cached):
    """At the design's own sizes (the rule is read off the graph; no module is built)."""
    rule = decode_rule(tdiag.load(DESIGNS / f"{name}.td").with_causal_mask().graph)
    assert rule.kind == "kv"
    assert set(rule.cached) == set(cached)


def test_mla_decodes_from_its_latent_in_the_absorbed_form():
    design = tdiag.load(DESIGNS / "deepseek_mla.td", F=16, H=4, KL=4, QL=8).with_causal_mask()
    module = design.module(dtype=torch.float64, impl="reference").eval()
    x = torch.randn(2, LENGTH, 16, dtype=torch.float64, generator=torch.Generator().manual_seed(5))
    cache = DecodeCache(module)
    steps = [cache.extend(x[:, :PROMPT])] + [cache.extend(x[:, t : t + 1]) for t in range(PROMPT, LENGTH)]
    assert torch.allclose(torch.cat(steps, 1), module(x), atol=TOL, rtol=0)
    assert cache.tensors["Ckn"].shape == (2, LENGTH, 4)  # KL = 4 entries per position, not H·(C + V) = 256


def test_grouped_query_attention_caches_one_key_per_group_not_per_query_head():
    design = tdiag.load(DESIGNS / "grouped_query.td", F=8, H=4, G=2).with_causal_mask()
    module = design.module(dtype=torch.float64, impl="reference").eval()
    cache = DecodeCache(module)
    cache.extend(inputs(module))
    assert cache.tensors["K"].shape == cache.tensors["V"].shape == (2, LENGTH, 2, 2)  # [batch, m, g, d]


@pytest.mark.parametrize(
    ("name", "why"),
    [
        ("forgetting_attention", "scans along the positions"),  # and a softmax over the keys: no state either
        ("multi_token_attention", "convolves along the positions"),
    ],
)
def test_designs_without_a_recurrent_state_keep_the_prefix_and_say_why(decoders, name, why):
    cache = DecodeCache(decoders[name])
    assert cache.kind == "prefix"
    assert why in cache.reason


def test_a_step_computes_the_key_rows_of_the_new_positions_only(decoders, monkeypatch):
    import tdiag.decode as decode

    seen: list[tuple[str, int]] = []
    real = decode.statement_value

    def recording(statement, frame):
        value = real(statement, frame)
        if statement.target in ("K", "Q"):
            seen.append((statement.target, value.shape[-3]))
        return value

    monkeypatch.setattr(decode, "statement_value", recording)
    module = decoders["mhsa"]
    x = inputs(module)
    cache = DecodeCache(module)
    cache.extend(x[:, :PROMPT])
    assert seen == [("Q", PROMPT), ("K", PROMPT)]
    for t in range(PROMPT, LENGTH):
        seen.clear()
        cache.extend(x[:, t : t + 1])
        assert seen == [("Q", 1), ("K", 1)]
        assert cache.tensors["K"].shape[-3] == cache.tensors["V"].shape[-3] == cache.length == t + 1


def test_a_prefix_cache_holds_the_inputs_so_far(decoders):
    module = decoders["forgetting_attention"]
    x = inputs(module)
    cache = DecodeCache(module)
    for t in range(LENGTH):
        cache.extend(x[:, t : t + 1])
    assert list(cache.tensors) == ["X"] and torch.equal(cache.tensors["X"], x)
    assert cache.length == LENGTH


@pytest.fixture(scope="module")
def compiled() -> dict[str, torch.nn.Module]:
    built = {}
    for name in ("mhsa", "llama"):
        built[name] = causal(name).module(dtype=torch.float64, N=8)
    return built


@pytest.mark.parametrize("name", ["mhsa", "llama"])
def test_a_compiled_module_called_with_its_cache_decodes_as_its_forward(compiled, name):
    module = compiled[name]
    x = torch.randn(3, LENGTH, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(2))
    cache = module.new_cache()
    steps = [module(x[:, :PROMPT], cache=cache)] + [module(x[:, t : t + 1], cache=cache) for t in range(PROMPT, LENGTH)]
    assert torch.allclose(torch.cat(steps, 1), module(x), atol=TOL, rtol=0)
    assert cache.length == LENGTH


def test_tdiag_exports_the_cache_class(compiled):
    assert isinstance(compiled["mhsa"].new_cache(), tdiag.DecodeCache)


def test_only_a_causal_module_takes_a_cache_argument():
    design = tdiag.load(DESIGNS / "mhsa.td", **small_sizes("mhsa"))
    assert "cache" not in design.source(N=8)
    assert "cache=None" in design.with_causal_mask().source(N=8)


def test_a_module_that_is_not_causal_has_no_cache():
    module = tdiag.load(DESIGNS / "mhsa.td", **small_sizes("mhsa")).module(dtype=torch.float64, N=8)
    with pytest.raises(NotDecodableError, match=r"is not causal: .* \(Design.with_causal_mask\(\)\)"):
        module.new_cache()


def test_a_design_of_two_inputs_has_no_cache():
    module = tdiag.load(DESIGNS / "cross_attention.td", **small_sizes("cross")).module(dtype=torch.float64, N=8)
    with pytest.raises(NotDecodableError, match="has 2 inputs"):
        DecodeCache(module)


def test_a_cache_serves_only_the_module_that_made_it(compiled):
    cache = compiled["mhsa"].new_cache()
    other = causal("mhsa").module(dtype=torch.float64, N=8)
    with pytest.raises(ValueError, match="made by another module"):
        other(torch.zeros(1, 1, 8, dtype=torch.float64), cache=cache)


def test_a_cache_refuses_a_new_batch_shape(compiled):
    module = compiled["mhsa"]
    cache = module.new_cache()
    module(torch.zeros(2, 3, 8, dtype=torch.float64), cache=cache)
    with pytest.raises(ValueError, match=r"holds a batch of shape \(2,\); got \(3,\)"):
        module(torch.zeros(3, 1, 8, dtype=torch.float64), cache=cache)


def test_training_mode_noise_needs_eval_mode_to_decode(decoders):
    module = decoders["fish"].train()
    try:
        with pytest.raises(ValueError, match=r"decode in eval mode \(module.eval\(\)\)"):
            DecodeCache(module).extend(inputs(module))
    finally:
        module.eval()


TEXT = ("To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 8).strip()


@pytest.fixture(scope="module")
def corpus_file(tmp_path_factory):
    import gzip

    path = tmp_path_factory.mktemp("decode") / "tiny.txt.gz"
    path.write_bytes(gzip.compress(TEXT.encode()))
    return path


def language_model(design: str, corpus_file):
    from tdiag.train import TrainConfig, build_model, read_corpus

    config = TrainConfig(design=str(DESIGNS / f"{design}.td"), data=str(corpus_file), layers=2, width=16, heads=2,
                         context=16, batch=2, steps=1, out="unused")  # fmt: skip
    corpus = read_corpus(config.data, config.context)
    model, _ = build_model(config, corpus.vocab, torch.device("cpu"))
    return model, corpus, config


@pytest.mark.parametrize("design", ["mhsa", "llama"])
def test_sampling_with_the_caches_draws_the_characters_the_re_run_draws(design, corpus_file):
    from tdiag.train import sample

    model, corpus, config = language_model(design, corpus_file)
    assert [cache.kind for cache in model.new_caches()] == ["kv", "kv"]
    prompt = [corpus.chars.index(c) for c in "the mind"]  # 8 characters, then 24 more: past the context of 16
    cpu = torch.device("cpu")
    assert sample(model, corpus, config, cpu, 24, prompt, 3) == sample(
        model, corpus, config, cpu, 24, prompt, 3, use_cache=False
    )


def test_a_design_that_reads_the_length_samples_by_re_running_the_context(corpus_file):
    model, _, _ = language_model("relu2_attention", corpus_file)
    assert model.new_caches() is None


def test_an_input_of_another_dtype_is_refused_naming_both(compiled):
    with pytest.raises(TypeError, match=r"input X is torch\.float32 but the module.s parameters are torch\.float64"):
        compiled["mhsa"](torch.zeros(1, 1, 8), cache=compiled["mhsa"].new_cache())


def test_an_input_without_positions_is_refused(compiled):
    with pytest.raises(ValueError, match="no new positions"):
        compiled["mhsa"](torch.zeros(1, 0, 8, dtype=torch.float64), cache=compiled["mhsa"].new_cache())


def test_an_input_of_another_width_is_refused_naming_the_leg(compiled):
    with pytest.raises(ValueError, match="input X: leg f has size F = 8, got 9"):
        compiled["mhsa"](torch.zeros(1, 2, 9, dtype=torch.float64), cache=compiled["mhsa"].new_cache())


def test_a_cache_that_is_not_a_decoding_cache_is_refused_naming_it(compiled):
    with pytest.raises(TypeError, match=r"cache must be the decoding cache module\.new_cache\(\) makes, got dict"):
        compiled["mhsa"](torch.zeros(1, 2, 8, dtype=torch.float64), cache={})


def test_a_design_causal_through_its_segment_sums_takes_a_cache_as_written():
    module = tdiag.load(DESIGNS / "mamba2_ssd.td", **small_sizes("mamba2_ssd")).module(
        dtype=torch.float64, impl="reference"
    )
    x = inputs(module)
    cache = DecodeCache(module)
    steps = [cache.extend(x[:, :PROMPT]), cache.extend(x[:, PROMPT:])]
    assert cache.kind == "state"
    assert torch.allclose(torch.cat(steps, 1), module(x), atol=TOL, rtol=0)


def test_check_decodes_is_zero_for_a_cache_that_decodes_as_the_forward(decoders, compiled):
    from tdiag.decode import check_decodes

    for module in (decoders["mhsa"], compiled["llama"]):
        x = inputs(decoders["mhsa"])  # F = 8 for both
        assert check_decodes(module, x, [PROMPT, 1, 2]) < TOL
        assert check_decodes(module, x, [1] * LENGTH, compiled=False) < TOL


def test_check_decodes_measures_a_step_that_differs_from_the_forward(decoders, monkeypatch):
    from tdiag.decode import check_decodes

    real = DecodeCache.extend
    monkeypatch.setattr(DecodeCache, "extend", lambda self, x, **kw: real(self, x, **kw) * (1 + 1e-3 * self.length))
    assert check_decodes(decoders["mhsa"], inputs(decoders["mhsa"]), [PROMPT, 1, 1, 1]) == pytest.approx(5e-3, rel=1e-6)


CANCELLING = """design cancelling
size F = 4, H = 2, E = 2
size N
input X[n: N, f: F]
param WV[f: F, h: H, e: E] = normal(std = 0.5)
param WO[h: H, e: E, g: F] = normal(std = 0.5)
V[m h e] = X[m f] WV[f h e]
O[n h e] = causal(n, m) X[n f] X[m f] V[m h e]
Oc[n h e] = O[n h e] - mean[e](O[n h e])
Y[n g] = sum[c](Oc[n h c]) sum[e](WO[h e g])
output Y
"""


def test_check_decodes_compares_rows_that_cancel_to_rounding_noise_absolutely():
    # Σ_c of a centred vector is 0: both the forward and the steps are ~1e-16, and their
    # difference, of the same order, is no error (the fuzzer read it as 2.76 relative)
    from tdiag.decode import check_decodes

    module = tdiag.loads(CANCELLING).module(dtype=torch.float64).eval()
    x = torch.randn(1, 6, 4, dtype=torch.float64, generator=torch.Generator().manual_seed(0))
    assert module(x).abs().max() < 1e-12
    assert check_decodes(module, x, [1] * 6) < TOL
    assert check_decodes(module, x, [1] * 6, compiled=False) < TOL


def test_check_decodes_raises_why_a_module_has_no_cache():
    from tdiag.decode import check_decodes

    module = tdiag.load(DESIGNS / "mhsa.td", **small_sizes("mhsa")).module(dtype=torch.float64, impl="reference")
    with pytest.raises(NotDecodableError, match="is not causal"):
        check_decodes(module, inputs(module), [LENGTH])


def test_check_decodes_refuses_an_input_that_is_not_a_tensor_naming_it(decoders):
    from tdiag.decode import check_decodes

    with pytest.raises(TypeError, match=r"input X must be a torch\.Tensor, got list"):
        check_decodes(decoders["mhsa"], [[0.0] * 8], [1])


@pytest.mark.parametrize("chunks", [[2, 2], [0, 5], [], [2.0, 3]])
def test_check_decodes_refuses_chunks_that_do_not_cover_the_input(decoders, chunks):
    from tdiag.decode import check_decodes

    with pytest.raises(ValueError, match="chunks"):
        check_decodes(decoders["mhsa"], inputs(decoders["mhsa"]), chunks)


def test_tdiag_exports_the_error_a_module_without_a_cache_raises():
    assert tdiag.NotDecodableError is NotDecodableError
    assert "NotDecodableError" in tdiag.__all__


def test_a_reference_module_makes_its_own_cache_and_decodes_with_it(decoders):
    module = decoders["llama"]
    x = inputs(module)
    cache = module.new_cache()
    assert isinstance(cache, tdiag.DecodeCache) and cache.step is None
    steps = [module(x[:, :PROMPT], cache=cache)] + [module(x[:, t : t + 1], cache=cache) for t in range(PROMPT, LENGTH)]
    assert torch.allclose(torch.cat(steps, 1), module(x), atol=TOL, rtol=0)
    with pytest.raises(TypeError, match="cache must be the decoding cache"):
        module(x, cache={})


STICK_BREAKING = (DESIGNS / "stick_breaking.td").read_text()
STRICTLY_BEFORE = {
    "clamp_statement": STICK_BREAKING,
    "clamp_factor": STICK_BREAKING.replace(
        "exp(R[h n m] - softplus(-Z[h n m])) B[n m]",
        "exp(R[h n m] - softplus(-Z[h n m])) clamp(index(n) - index(m), 0, 1)",
    ),
    "relu_of_the_difference": STICK_BREAKING.replace(
        "clamp(index(n) - index(m), 0, 1)", "clamp(relu(index(n) - index(m)), 0, 1)"
    ),
    "causal_minus_identity": STICK_BREAKING.replace(
        "B[n m]   = clamp(index(n) - index(m), 0, 1)", "B[n m]   = causal(n, m) - I[n m]"
    ).replace("size N\n", "size N\nconst I[n: N, m: N] = identity\n"),
}


@pytest.mark.parametrize("form", sorted(STRICTLY_BEFORE))
def test_a_design_strictly_causal_as_written_is_causal_to_with_causal_mask_and_to_its_cache(form):
    """One test of causality (graph/causal.py hides_the_future): the design with_causal_mask
    returns as it is takes a cache, and decodes as its forward over each prefix."""
    from tdiag.decode import check_decodes
    from tdiag.graph.causal import hides_the_future

    design = tdiag.loads(STRICTLY_BEFORE[form], F=8, H=2)
    assert hides_the_future(design.graph)
    assert design.with_causal_mask().graph is design.graph
    x = torch.randn(2, LENGTH, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    reference = design.module(dtype=torch.float64, impl="reference")
    assert check_decodes(reference, x, [1] * LENGTH) < TOL
    assert check_decodes(reference, x, [PROMPT, LENGTH - PROMPT]) < TOL
    if form != "causal_minus_identity":  # the planner's lowering of causal(n, m) - I is another fix's (h-plan)
        compiled = design.module(dtype=torch.float64, N=8)
        assert check_decodes(compiled, x, [PROMPT, 1, LENGTH - PROMPT - 1]) < TOL


def test_a_design_that_sees_later_keys_through_an_anti_causal_clamp_is_not_causal():
    design = tdiag.loads(STICK_BREAKING.replace("index(n) - index(m), 0, 1", "index(m) - index(n), 0, 1"), F=8, H=2)
    module = design.module(dtype=torch.float64, impl="reference")
    with pytest.raises(NotDecodableError, match="is not causal"):
        module.new_cache()


COSFORMER_KEY_SIDE = (
    (DESIGNS / "cosformer.td")
    .read_text()
    .split("W[n]")[0]
    .replace("size N\n", "size N\nconst I0[s: 2] = values(1, 0)\nconst I1[s: 2] = values(0, 1)\n")
    + """W[n]        = 3.141592653589793 / 2 (index(n) + 1) / N
CS[m s]     = cos(W[m]) I0[s] + sin(W[m]) I1[s]
CQ[n s]     = cos(W[n]) I0[s] + sin(W[n]) I1[s]
Kf[m h d s] = CS[m s] K[m h d]
A[h n m]    = normalize[m, eps = 1e-6](CQ[n s] Q[n h d] Kf[m h d s])
Y[n g]      = A[h n m] V[m h e] WO[h e g]
output Y
"""
)


@pytest.mark.parametrize("impl", ["reference", "compiled"])
def test_a_key_side_tensor_that_reads_the_length_is_recomputed_at_each_step_not_cached_stale(impl):
    """cosFormer's re-weighting cos(πm/2N) on the key side: Kf's earlier rows change as N grows."""
    from tdiag.decode import check_decodes

    design = tdiag.loads(COSFORMER_KEY_SIDE, F=8, H=2).with_causal_mask()
    module = (
        design.module(dtype=torch.float64, impl="reference")
        if impl == "reference"
        else design.module(dtype=torch.float64, N=8)
    )
    cache = module.new_cache()
    assert cache.kind == "kv" and "Kf" not in cache.rule.cached and set(cache.rule.cached) == {"K", "V"}
    assert "Kf reads the length N as a number: recomputed" in cache.reason
    x = torch.randn(2, 6, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(4))
    for compiled in (None, False):
        assert check_decodes(module, x, [1] * 6, compiled=compiled) < TOL
        assert check_decodes(module, x, [2, 1, 3], compiled=compiled) < TOL


def test_a_bundled_design_whose_causal_form_no_cache_serves_says_why():
    """The designs with a causal form that `decoders` leaves out (several inputs, no run-time
    length): new_cache() refuses them with NotDecodableError naming the design and the reason."""
    refused = {}
    for path in DESIGN_FILES:
        design = causal(path.stem)
        if design is None or (len(design.graph.inputs) == 1 and design.graph.sizes["N"].is_free):
            continue
        with pytest.raises(NotDecodableError) as refusal:
            design.module(dtype=torch.float64, impl="reference").new_cache()
        refused[path.stem] = str(refusal.value)
    assert refused
    for name, why in refused.items():
        assert f"'{name}'" in why and ("inputs" in why or "run-time length" in why), why


def compiled_causal(name: str) -> torch.nn.Module:
    return causal(name, **({"S": 4} if name == "mamba2_ssd" else {})).module(dtype=torch.float64, N=8).eval()


def causal_designs() -> list[str]:
    """The bundled designs with a causal form of one input over a run-time length."""
    names = []
    for path in DESIGN_FILES:
        design = causal(path.stem)
        if design is not None and len(design.graph.inputs) == 1 and design.graph.sizes["N"].is_free:
            names.append(path.stem)
    return names


# one of each kind and way: kv, state, prefix, reads the length, strictly causal as written
EACH_KIND = ["mhsa", "retnet", "gla", "forgetting_attention", "cosformer", "stick_breaking"]


def check_compiled(name: str) -> dict[str, float]:
    module = compiled_causal(name)
    x = torch.randn(2, LENGTH, width_of(module), dtype=torch.float64, generator=torch.Generator().manual_seed(6))
    from tdiag.decode import check_decodes

    errors = {}
    for chunks in ([1] * LENGTH, [PROMPT, 2, LENGTH - PROMPT - 2]):
        for by_code in (None, False):
            errors[f"{chunks} compiled={by_code}"] = check_decodes(module, x, chunks, compiled=by_code)
    return errors


def width_of(module: torch.nn.Module) -> int:
    graph = module.tdiag_plan.graph
    return int(graph.evaluate(graph.inputs[0].axes[-1].size))


@pytest.mark.parametrize("name", EACH_KIND)
def test_a_compiled_module_of_each_kind_decodes_as_its_causal_forward_by_code_and_by_the_reference(name):
    errors = check_compiled(name)
    assert max(errors.values()) < TOL, errors


@pytest.mark.slow
def test_every_bundled_causal_design_compiled_decodes_as_its_causal_forward():
    wrong = {}
    for name in causal_designs():
        errors = check_compiled(name)
        if max(errors.values()) >= TOL:
            wrong[name] = errors
    assert not wrong


@pytest.mark.parametrize("name", ["bert", "cohere_qk_norm"])
def test_a_compiled_module_whose_plan_fuses_layer_norms_decodes_by_the_reference_evaluator_too(name):
    errors = check_compiled(name)
    assert max(errors.values()) < TOL, errors


HALF_CAUSAL = """design half_causal
size F = 8, H = 2, D = 4
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1)
param WK[f: F, h: H, d: D] = normal(std = 1)
param WV[f: F, h: H, e: D] = normal(std = 1)
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
Y[n h e] = causal(n, m) Q[n h d] K[m h d] V[m h e] + Q[n h d] K[m h d] V[m h e] / 100
output Y
"""


def test_a_design_with_a_causal_term_beside_one_that_sees_later_keys_is_refused_until_masked():
    """A causal factor somewhere is not enough: the second term sums every key."""
    from tdiag.decode import check_decodes

    design = tdiag.loads(HALF_CAUSAL)
    with pytest.raises(NotDecodableError, match="'half_causal' is not causal"):
        design.module(dtype=torch.float64, impl="reference").new_cache()
    masked = design.with_causal_mask().module(dtype=torch.float64, impl="reference")
    x = torch.randn(1, LENGTH, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(7))
    assert check_decodes(masked, x, [PROMPT, LENGTH - PROMPT]) < TOL


def test_a_box_normalized_over_the_positions_after_a_causal_attention_is_not_causal():
    # normalize[h n] of a causal attention's output sums over every position, no key leg beside
    # it (the fuzzer decoded it at 0312c41, relative error 4.1)
    text = (
        "design over_positions\nsize F = 2, H = 3\nsize N\ninput X[n: N, f: F]\nparam Wv[f: F, h: H]\n"
        "A[n h] = softmax[m, mask = causal(n, m)](X[n f] X[m f]) X[m j] Wv[j h]\n"
        "Y[n h] = normalize[h n](exp(A[n h]))\noutput Y\n"
    )
    design = tdiag.loads(text)
    with pytest.raises(NotDecodableError, match="not causal"):
        DecodeCache(design.module(dtype=torch.float64).eval())
    with pytest.raises(TdiagError, match="box normalized over query leg 'n'"):
        design.with_causal_mask()


def test_a_causal_box_normalized_over_the_query_leg_too_is_not_causal():
    # softmax[m n, mask = causal(n, m)] sums over every query: an earlier row changes when a later
    # query arrives (the fuzzer decoded it at 3ece505, relative error 0.2)
    text = (
        "design over_queries\nsize F = 2\nsize N\ninput X[n: N, f: F]\n"
        "S[n m] = X[n f] X[m f]\nY[n m] = softmax[m n, mask = causal(n, m)](S[n m])\noutput Y\n"
    )
    module = tdiag.loads(text).module(dtype=torch.float64).eval()
    with pytest.raises(NotDecodableError, match="not causal"):
        DecodeCache(module)
