"""Recurrent decoding states (issue 25, tdiag/decode_state.py, cache kind "state"): a causal
product or causal normalize box taken in its linear order keeps the running sums of its key side,
so that a step reads a state of a fixed size instead of every earlier position, and equals the
causal forward."""

import pytest
import torch
from conftest import DESIGN_FILES, DESIGNS
from test_decode import causal as small_causal

import tdiag
import tdiag.decode_state as decode_state
from tdiag.decode import DecodeCache, decode_rule

TOL = 1e-10
LENGTH = 6
STATE = {
    "based",  # a sum of three multilinear terms: 1 + q·k + (q·k)²/2
    "gla",  # per-feature decay, a per-head norm after the product
    "lfish",  # heads mixed by a simplex over k inside the box
    "lightning",  # λ_h^(n−m) with causal(n, m)
    "mamba2_ssd",  # per-head decay, a skip term beside the product
    "mlk",
    "mlstm",  # two products (numerator and denominator) sharing a decay
    "performer",
    "retnet",
    "smlk",
    "thsa_elu",
    "thsa_poly",
}


SMALLER = {"mamba2_ssd": {"S": 4}, "based": {"Dk": 3}}  # beside test_decode's small sizes


def causal(name: str) -> tdiag.Design | None:
    return small_causal(name, **SMALLER.get(name, {}))


@pytest.fixture(scope="module")
def kinds() -> dict[str, object]:
    """The decoding rule of every bundled design with a causal form and one input over N."""
    rules = {}
    for path in DESIGN_FILES:
        design = causal(path.stem)
        if design is None or len(design.graph.inputs) != 1 or not design.graph.sizes["N"].is_free:
            continue
        rules[path.stem] = decode_rule(design.graph)
    return rules


@pytest.fixture(scope="module")
def modules() -> dict[str, torch.nn.Module]:
    """The reference module of each design that takes a state, float64, built once."""
    return {name: causal(name).module(dtype=torch.float64, impl="reference").eval() for name in sorted(STATE)}


def inputs(module: torch.nn.Module, n: int = LENGTH, seed: int = 1) -> torch.Tensor:
    graph = module.tdiag_graph
    width = int(graph.evaluate(graph.inputs[0].axes[-1].size))
    return torch.randn(2, n, width, dtype=torch.float64, generator=torch.Generator().manual_seed(seed))


def decoded(module: torch.nn.Module, x: torch.Tensor, chunks: list[int]) -> tuple[torch.Tensor, DecodeCache]:
    cache = DecodeCache(module)
    outputs, start = [], 0
    for count in chunks:
        outputs.append(cache.extend(x[:, start : start + count]))
        start += count
    return torch.cat(outputs, 1), cache


def test_the_linear_and_scan_designs_take_a_recurrent_state(kinds):
    assert {name for name, rule in kinds.items() if rule.kind == "state"} == STATE


@pytest.mark.parametrize(
    "chunks", [[1] * LENGTH, [3, 1, 1, 1], [2, 1, 3]], ids=["tokens", "prompt then tokens", "chunks"]
)
def test_decoding_with_the_state_equals_the_causal_forward(modules, chunks):
    wrong = {}
    with torch.no_grad():
        for name, module in modules.items():
            x = inputs(module)
            steps, cache = decoded(module, x, chunks)
            assert cache.kind == "state", name
            difference = (steps - module(x)).abs().max().item()
            if difference > TOL:
                wrong[name] = difference
    assert not wrong


@pytest.mark.parametrize("name", ["mlk", "gla", "mamba2_ssd"])
def test_the_state_does_not_grow_with_the_positions(modules, name):
    module = modules[name]
    x = inputs(module, 50)
    cache = DecodeCache(module)
    with torch.no_grad():
        cache.extend(x[:, :1])
        after_one = {key: tuple(value.shape) for key, value in cache.tensors.items()}
        for t in range(1, 50):
            cache.extend(x[:, t : t + 1])
    assert after_one == {key: tuple(value.shape) for key, value in cache.tensors.items()}
    assert set(after_one) == set(cache.rule.states)
    assert cache.length == 50


def test_a_step_evaluates_every_statement_at_the_new_positions_only(modules, monkeypatch):
    """The work of a step does not depend on the positions held: each statement is computed for
    the new rows alone (no statement reads an earlier row; the states stand for them)."""
    module = modules["gla"]
    rows: list[int] = []
    real = decode_state.statement_value
    symbol = module.tdiag_graph.sizes["N"].symbol

    def recording(statement, frame):
        value = real(statement, frame)
        axes = frame.graph.tensors[statement.target].axes
        rows.extend(value.shape[k - len(axes)] for k, a in enumerate(axes) if a.size == symbol)
        return value

    monkeypatch.setattr(decode_state, "statement_value", recording)
    x = inputs(module, 30)
    cache = DecodeCache(module)
    with torch.no_grad():
        cache.extend(x[:, :20])
        for t in range(20, 30):
            rows.clear()
            cache.extend(x[:, t : t + 1])
            assert rows and set(rows) == {1}


def test_a_long_prompt_runs_in_chunks_and_equals_the_forward():
    """A compiled module (its planner's graph, its layer norm fused) with a prompt longer than
    one chunk of the step (64 positions)."""
    module = causal("gla").module(dtype=torch.float64, N=80)
    x = torch.randn(2, 80, 8, dtype=torch.float64, generator=torch.Generator().manual_seed(3))
    cache = module.new_cache()
    with torch.no_grad():
        steps = [module(x[:, :70], cache=cache)] + [module(x[:, t : t + 1], cache=cache) for t in range(70, 80)]
        assert cache.kind == "state"
        assert torch.allclose(torch.cat(steps, 1), module(x), atol=TOL, rtol=0)


def test_a_sum_content_keeps_a_numerator_and_a_denominator_state_per_term(modules):
    cache = DecodeCache(modules["based"])
    assert cache.rule.states == tuple(f"A.{part}{k}" for part in ("numerator", "denominator") for k in (1, 2, 3))
    cache.extend(inputs(modules["based"]))
    assert cache.tensors["A.denominator1"].shape == ()  # Σ_{m ≤ n} 1: the count of positions
    assert cache.tensors["A.numerator3"].shape == (2, 2, 4, 3, 3)  # [batch, h, e, d, d']: (q·k)² multiplied out


def test_a_decay_keeps_its_query_side_at_the_last_position_and_a_gate_keeps_nothing_more(modules):
    """λ^(n−m) = exp(λ n − λ m) keeps λ·(P − 1); a segment sum's running sum is taken from the
    last position held, so only the state is kept."""
    assert DecodeCache(modules["lightning"]).rule.states == ("O.state", "O.decay")
    assert DecodeCache(modules["gla"]).rule.states == ("O.state",)
    assert set(DecodeCache(modules["mlstm"]).rule.states) == {"Num.state", "Den.state"}


GROUPED = """design grouped_linear
size F = 8, G = 2, R = 2, D = 2
size N
input X[n: N, f: F]
param WQ[f: F, g: G, r: R, d: D] = normal(std = 1)
param WK[f: F, g: G, d: D] = normal(std = 1)
param WV[f: F, g: G, e: D] = normal(std = 1)
param WO[g: G, r: R, e: D, o: F] = normal(std = 1)
Q[n g r d] = X[n f] WQ[f g r d]
K[m g d] = X[m f] WK[f g d]
V[m g e] = X[m f] WV[f g e]
A[g r n m] = normalize[m, eps = 1e-6](elu1(Q[n g r d]) elu1(K[m g d]))
Y[n o] = A[g r n m] V[m g e] WO[g r e o]
output Y
"""


def test_grouped_heads_keep_one_state_per_key_value_group():
    module = tdiag.loads(GROUPED).with_causal_mask().module(dtype=torch.float64, impl="reference")
    x = inputs(module)
    steps, cache = decoded(module, x, [2, 1, 1, 2])
    assert torch.allclose(steps, module(x), atol=TOL, rtol=0)
    assert cache.tensors["A.numerator"].shape == (2, 2, 2, 2)  # [batch, g, d, e], not per query head r


TWO_BOXES = """design two_boxes
size F = 8, H = 2, D = 2
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1)
param WK[f: F, h: H, d: D] = normal(std = 1)
param WV[f: F, h: H, e: D] = normal(std = 1)
param WO[h: H, e: D, o: F] = normal(std = 1)
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
A1[h n m] = normalize[m, eps = 1e-6](elu1(Q[n h d]) elu1(K[m h d]))
A2[h n m] = normalize[m, eps = 1e-6](relu(Q[n h d]) relu(K[m h d]) + 1)
Y1[n o] = A1[h n m] V[m h e] WO[h e o]
Y2[n o] = A2[h n m] V[m h e] WO[h e o]
Y[n o] = Y1[n o] - 0.5 Y2[n o]
output Y
"""


def test_each_box_of_a_design_keeps_its_own_states():
    module = tdiag.loads(TWO_BOXES).with_causal_mask().module(dtype=torch.float64, impl="reference")
    x = inputs(module)
    steps, cache = decoded(module, x, [2, 1, 3])
    assert torch.allclose(steps, module(x), atol=TOL, rtol=0)
    assert set(cache.tensors) == {"A1.numerator", "A1.denominator"} | {
        f"A2.{part}{k}" for part in ("numerator", "denominator") for k in (1, 2)
    }


DECAYED_BOX = """design decayed_box
size F = 8, H = 2, D = 2
size N
input X[n: N, f: F]
param WQ[f: F, h: H, d: D] = normal(std = 1)
param WK[f: F, h: H, d: D] = normal(std = 1)
param WV[f: F, h: H, e: D] = normal(std = 1)
param Wa[f: F, h: H] = normal(std = 1)
Q[n h d] = X[n f] WQ[f h d]
K[m h d] = X[m f] WK[f h d]
V[m h e] = X[m f] WV[f h e]
La[n h] = -softplus(X[n f] Wa[f h])
A[h n m] = normalize[m, eps = 1e-6](exp(segsum[n, m](La[n h])) elu1(Q[n h d]) elu1(K[m h d]))
Y[n h e] = A[h n m] V[m h e]
output Y
"""


def test_a_normalize_box_causal_through_its_decay_keeps_decayed_states():
    """No causal mask: the segment sums hide the future; numerator and denominator both decay."""
    module = tdiag.loads(DECAYED_BOX).module(dtype=torch.float64, impl="reference")
    x = inputs(module)
    steps, cache = decoded(module, x, [2, 1, 3])
    assert cache.kind == "state"
    assert torch.allclose(steps, module(x), atol=TOL, rtol=0)
    assert set(cache.tensors) == {"A.numerator", "A.denominator"}


def test_a_box_with_a_padding_mask_keeps_its_state_since_a_cache_takes_no_design_mask():
    text = (DESIGNS / "mlk.td").read_text().replace("input X[n: N, f: F]", "input X[n: N, f: F]\nmask pad[m: N]")
    text = text.replace("normalize[m, eps = 1e-6]", "normalize[m, eps = 1e-6, mask = pad[m]]")
    module = tdiag.loads(text, F=8, H=2, D=4).with_causal_mask().module(dtype=torch.float64, impl="reference")
    x = inputs(module)
    steps, cache = decoded(module, x, [2, 1, 3])
    assert cache.kind == "state"
    assert torch.allclose(steps, module(x), atol=TOL, rtol=0)


def test_cosformer_at_a_fixed_horizon_keeps_a_state_per_re_weighting():
    """cosFormer's πi/2N re-weights every key as N grows (no state); with the paper's horizon a
    fixed size L, its cos and sin terms each keep a numerator and a denominator."""
    text = (DESIGNS / "cosformer.td").read_text()
    text = text.replace("size N\n", "size N, L = 64\n").replace("(index(n) + 1) / N", "(index(n) + 1) / L")
    module = tdiag.loads(text, F=8, H=2).with_causal_mask().module(dtype=torch.float64, impl="reference")
    x = inputs(module)
    steps, cache = decoded(module, x, [2, 1, 3])
    assert cache.kind == "state"
    assert torch.allclose(steps, module(x), atol=TOL, rtol=0)
    assert len(cache.tensors) == 4


@pytest.mark.parametrize(
    ("name", "kind", "why"),
    [
        ("mhsa", "kv", "A is a softmax over positions m"),
        ("cosformer", "kv", "it reads the length N"),  # cos(πi/2N) re-weights every key as N grows
        ("forgetting_attention", "prefix", "A is a softmax over positions m"),
        ("stick_breaking", "kv", "Z keeps two position legs"),
    ],
)
def test_the_designs_without_a_state_keep_their_kind_and_say_why(kinds, name, kind, why):
    assert kinds[name].kind == kind
    assert f"no recurrent state: {why}" in kinds[name].reason


REFUSED = "design t\nsize F = 4, D = 2\nsize N\ninput X[n: N, f: F]\nparam WQ[f: F, d: D]\nparam WK[f: F, d: D]\n"
REFUSED += "Q[n d] = X[n f] WQ[f d]\nK[m d] = X[m f] WK[f d]\n"


@pytest.mark.parametrize(
    ("statements", "why"),
    [
        (
            "A[n m] = normalize[m](elu1(Q[n d] K[m d]))\nY[n d] = A[n m] K[m d]\nZ[n d] = A[n m] Q[m d]\n"
            "W[n d] = Y[n d] + Z[n d]\noutput W",
            "A is an output or read by 2 statements",
        ),
        ("Y[n d] = causal(n, m) relu(Q[n e] K[m e]) K[m d]\noutput Y", "does not split into a query side"),
        ("Y[n d] = causal(n, m) exp(Q[n e] K[m e]) K[m d]\noutput Y", "not a decay"),
    ],
    ids=["box read twice", "a factor of both positions", "an exp that is no decay"],
)
def test_a_product_the_rule_does_not_cover_is_refused_with_the_reason(statements, why):
    design = tdiag.loads(REFUSED + statements).with_causal_mask()
    rule = decode_rule(design.graph)
    assert rule.kind == "kv"
    assert why in rule.reason


def test_the_rule_without_the_state_is_the_one_the_design_had():
    graph = causal("mlk").graph
    assert decode_rule(graph).kind == "state"
    old = decode_rule(graph, state=False)
    assert old.kind == "kv" and set(old.cached) == {"Kbar", "V"}


def test_sampling_with_state_caches_draws_the_characters_the_re_run_draws(tmp_path):
    """`tdiag train`'s sample (and `tdiag generate`) on a design that decodes with a state."""
    import gzip

    from tdiag.train import TrainConfig, build_model, read_corpus, sample

    text = "To be, or not to be, that is the question:\nWhether 'tis nobler in the mind to suffer\n" * 8
    (tmp_path / "tiny.txt.gz").write_bytes(gzip.compress(text.encode()))
    config = TrainConfig(design=str(DESIGNS / "mlk.td"), data=str(tmp_path / "tiny.txt.gz"), layers=2, width=16,
                         heads=2, context=16, batch=2, steps=1, out="unused")  # fmt: skip
    corpus = read_corpus(config.data, config.context)
    model, _ = build_model(config, corpus.vocab, torch.device("cpu"))
    assert [cache.kind for cache in model.new_caches()] == ["state", "state"]
    prompt = [corpus.chars.index(c) for c in "the mind"]
    cpu = torch.device("cpu")
    assert sample(model, corpus, config, cpu, 24, prompt, 3) == sample(
        model, corpus, config, cpu, 24, prompt, 3, use_cache=False
    )


DECAY_STATEMENTS = {
    "retnet": (
        "O[n h e]      = causal(n, m) exp(lg[h] (index(n) - index(m))) Qr[n h d] Kr[m h d] V[m h e]",
        "Dec[h n m]    = causal(n, m) exp(lg[h] (index(n) - index(m)))\n"
        "O[n h e]      = (Qr[n h d] Kr[m h d] * Dec[h n m]) V[m h e]",
    ),
    "mamba2_ssd": (
        "O[n h p]  = exp(segsum[n, m](La[n h])) Cm[n s] Bm[m s] dt[m h] Xs[m h p] + Dskip[h] Xs[n h p]",
        "L[h n m]  = exp(segsum[n, m](La[n h]))\n"
        "O[n h p]  = (Cm[n s] Bm[m s] * L[h n m]) dt[m h] Xs[m h p] + Dskip[h] Xs[n h p]",
    ),
}


@pytest.mark.parametrize("name", sorted(DECAY_STATEMENTS))
def test_a_decay_matrix_written_as_a_statement_of_its_own_is_part_of_its_causal_product(name):
    """RetNet's D and Mamba-2's L as the papers write them: the state the inlined form keeps."""
    from tdiag.decode import check_decodes

    inline, own = DECAY_STATEMENTS[name]
    source = (DESIGNS / f"{name}.td").read_text()
    assert inline in source
    design = tdiag.loads(source.replace(inline, own), F=8, H=2, **SMALLER.get(name, {})).with_causal_mask()
    module = design.module(dtype=torch.float64, impl="reference").eval()
    cache = DecodeCache(module)
    assert cache.kind == "state", cache.reason
    x = inputs(module)
    assert check_decodes(module, x, [1] * LENGTH) < TOL
    assert check_decodes(module, x, [2, 1, LENGTH - 3]) < TOL
    cache.extend(x)
    shapes = {held: tuple(t.shape) for held, t in cache.tensors.items()}
    cache.extend(x[:, :1])
    assert {held: tuple(t.shape) for held, t in cache.tensors.items()} == shapes  # no row per position
