"""The bridge to Hugging Face transformers (issue 25): a causal LM whose attention blocks are
compiled designs, so that `model(...)` and `model.generate()` run a design in a real model.

    model = transformers.LlamaForCausalLM(config)
    tdiag.hf.use_design(model)                  # its own attention (designs/llama.td), its weights
    tdiag.hf.use_design(model, "mgk")           # another design, fresh weights, causal

With no design the model's own attention is compiled from the bundled design of its family at the
config's sizes and each layer's weights are imported, so the logits do not change. The families
(FAMILIES, by the config's model_type): llama (designs/llama.td), mistral (mistral.td with the
config's sliding window; llama.td without one), qwen2 (qwen2.td), qwen3 (qwen3.td), olmo2
(olmo2.td), starcoder2 (starcoder2.td with its window; mistral.td without biases), phi (phi.td),
gemma2 (gemma2.td and gemma2_sliding.td by layer type), gemma3_text (Gemma3ForCausalLM: gemma3.td
and gemma3_sliding.td by layer type) and gpt2 (gpt2.td); any other model type is refused naming
them.
Any other design is compiled causal, at the config's model width F (and head count H where the
design has one), with weights from its initializers.

Decoding with the model's DynamicCache uses the design's own key-value rows where it has them
(tdiag/decode.py, docs/decoding.md: softmax designs, e.g. llama's rotated keys and values, grouped
per key-value head): each layer keeps them in the cache, packed as one tensor, and computes only the
new positions' projections. A design without them (a scan, segment sums) keeps the layer's inputs
in the cache and re-runs the prefix at each step, at O(N) work per new token. Generation with the
cache is exact for every design; recurrent states are not built yet. Padding inside a batch (an
attention mask that is not the causal one) is refused.
transformers is optional: this module imports it only to rebuild a cache layer of a model it is
given (it reads the model); `import tdiag` does not import this module."""

from __future__ import annotations

import re
import sys
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType
from typing import Any

import torch

from .design import Design, load
from .weights import load_linear

__all__ = ["IGNORED_KEYWORDS", "SUPPORTED_TRANSFORMERS", "DesignAttention", "use_design"]

# The transformers versions the bridge is written for, [lowest, below): from 5.24 the decoder
# layers pass the cache to their attention as `cache=` (5.23 and before: `past_key_values=`, which
# the bridge would not see, so each step would attend to its new tokens alone); 6.0 is the next
# major version, where transformers removes the interfaces it deprecates in 5.x.
SUPPORTED_TRANSFORMERS = ((5, 24), (6, 0))

# Keywords HF's decoder layers pass to their attention that the bridge takes and ignores by design,
# with the reason. Any other keyword is refused (DesignAttention.forward), so that a renamed one is
# an error, never a silently different computation.
IGNORED_KEYWORDS: dict[str, str] = {
    "position_embeddings": "the design computes its own position code from the positions",
    "use_cache": "whether a cache is given decides",
    "output_hidden_states": "the decoder layer's outputs, not its attention's",
    "output_router_logits": "a mixture of experts' routing, not the attention's",
    "num_items_in_batch": "the loss's normalization",
}

# Keywords the bridge takes only at the value it computes with (None always allowed): a packed
# batch (flash attention's sequence boundaries), bidirectional attention, attention weights.
_DEFAULT_ONLY: dict[str, tuple[object, str]] = {
    "is_causal": (True, "the design is compiled causal"),
    "output_attentions": (False, "the design gives no attention weights"),
    "cu_seq_lens_q": (None, "packed sequences are not supported"),
    "cu_seq_lens_k": (None, "packed sequences are not supported"),
    "max_length_q": (None, "packed sequences are not supported"),
    "max_length_k": (None, "packed sequences are not supported"),
    "seq_idx": (None, "packed sequences are not supported"),
}


@dataclass(frozen=True)
class LayerDesign:
    """What one decoder layer of a family computes: a bundled design, its sizes beyond the
    family's, and the sliding window the layer attends within (HF's `sliding_window`: the query
    and the W − 1 keys before it; None: every earlier position)."""

    design: str
    sizes: tuple[tuple[str, int], ...] = ()
    window: int | None = None


@dataclass(frozen=True)
class Family:
    """A model family whose attention a bundled design writes exactly: the design, where the
    decoder layers and their attention are, the design's sizes from the config, what the design
    does not model (refused), how a layer's weights map onto the design's tensors, and (for a
    family whose layers differ, e.g. Gemma's sliding and global layers) each layer's design."""

    design: str
    layers: Callable[[Any], list]
    attribute: str
    sizes: Callable[[Any], dict[str, int]]
    unsupported: Callable[[Any], str | None]
    import_weights: Callable[[Any, Any], None]
    layer: Callable[[Any, int], LayerDesign] | None = None

    def layer_design(self, config: Any, index: int) -> LayerDesign:
        return LayerDesign(self.design) if self.layer is None else self.layer(config, index)


def _llama_sizes(config: Any) -> dict[str, int]:
    heads = config.num_attention_heads
    return {
        "F": config.hidden_size,
        "H": heads,
        "G": config.num_key_value_heads or heads,
        "D": getattr(config, "head_dim", None) or config.hidden_size // heads,
        "Theta": _whole(config.rope_parameters["rope_theta"], "rope_theta"),
    }


def _llama_unsupported(config: Any) -> str | None:
    if config.attention_bias:
        return "attention_bias = True (designs/llama.td has no projection biases)"
    rope = config.rope_parameters.get("rope_type", "default")
    if rope != "default":
        return f"rope_type {rope!r} (designs/llama.td computes the default RoPE frequencies)"
    if getattr(config, "pretraining_tp", 1) not in (None, 1):
        return f"pretraining_tp = {config.pretraining_tp}"
    return None


def _llama_weights(attention: Any, block: Any) -> None:
    load_linear(block, "WQ", attention.q_proj.weight, cols="f")
    load_linear(block, "WK", attention.k_proj.weight, cols="f")
    load_linear(block, "WV", attention.v_proj.weight, cols="f")
    load_linear(block, "WO", attention.o_proj.weight, cols="g r e")


def _qwen3_unsupported(config: Any) -> str | None:
    reason = _llama_unsupported(config)
    if reason is None and config.rms_norm_eps != 1e-6:
        reason = f"rms_norm_eps = {config.rms_norm_eps} (designs/qwen3.td's QK-norm takes 1e-6)"
    if reason is None and any(kind != "full_attention" for kind in config.layer_types):
        reason = "sliding-window layers (designs/qwen3.td attends to every earlier position)"
    return reason.replace("llama.td", "qwen3.td") if reason else None


def _qwen3_weights(attention: Any, block: Any) -> None:
    _llama_weights(attention, block)
    load_linear(block, "nq", attention.q_norm.weight, cols="")
    load_linear(block, "nk", attention.k_norm.weight, cols="")


def _gpt2_unsupported(config: Any) -> str | None:
    if not config.scale_attn_weights:
        return "scale_attn_weights = False (designs/gpt2.td scales by head_dim^-0.5)"
    if config.scale_attn_by_inverse_layer_idx:
        return "scale_attn_by_inverse_layer_idx = True (a scale per layer)"
    if config.add_cross_attention:
        return "add_cross_attention = True (cross-attention layers)"
    return None


def _gpt2_weights(attention: Any, block: Any) -> None:
    load_linear(block, "Wattn", attention.c_attn.weight.T, cols="f")
    load_linear(block, "battn", attention.c_attn.bias, cols="")
    load_linear(block, "WO", attention.c_proj.weight.T, cols="h e")
    load_linear(block, "bo", attention.c_proj.bias, cols="")


def _rope_unsupported(rope: dict, design: str, types: tuple[str, ...] = ("default",)) -> str | None:
    kind = rope.get("rope_type", "default")
    if kind not in types:
        return f"rope_type {kind!r} (designs/{design}.td computes the {' or '.join(types)} RoPE frequencies)"
    return None


def _mistral_layer(config: Any, index: int) -> LayerDesign:
    """Mistral's layers are alike: mistral.td with its window, or llama.td where the config has
    none (sliding_window = None: Mistral's attention is then Llama's)."""
    if config.sliding_window is None:
        return LayerDesign("llama")
    return LayerDesign("mistral", (("W", config.sliding_window),), config.sliding_window)


def _mistral_unsupported(config: Any) -> str | None:
    return _rope_unsupported(config.rope_parameters, "mistral")


def _qwen2_unsupported(config: Any) -> str | None:
    if any(kind != "full_attention" for kind in config.layer_types):
        return "sliding-window layers (designs/qwen2.td attends to every earlier position)"
    return _rope_unsupported(config.rope_parameters, "qwen2")


def _qwen2_weights(attention: Any, block: Any) -> None:
    _llama_weights(attention, block)
    _biases(attention, block)


def _biases(attention: Any, block: Any) -> None:
    """The q/k/v projections' biases [H·D] and [G·D], head-major, as bq[g r d], bk[g d], bv[g e]."""
    load_linear(block, "bq", attention.q_proj.bias, cols="")
    load_linear(block, "bk", attention.k_proj.bias, cols="")
    load_linear(block, "bv", attention.v_proj.bias, cols="")


def _gemma_sizes(config: Any) -> dict[str, int]:
    heads = config.num_attention_heads
    return {
        "F": config.hidden_size,
        "H": heads,
        "G": config.num_key_value_heads or heads,
        "D": config.head_dim,
        "QS": _whole(config.query_pre_attn_scalar, "query_pre_attn_scalar"),
    }


def _gemma_common_unsupported(config: Any, design: str) -> str | None:
    if config.attention_bias:
        return f"attention_bias = True (designs/{design}.td has no projection biases)"
    if getattr(config, "use_bidirectional_attention", False):
        return "use_bidirectional_attention = True (tdiag.hf runs causal designs)"
    if any(kind not in ("full_attention", "sliding_attention") for kind in config.layer_types):
        return f"layer types {sorted(set(config.layer_types))} (designs/{design}.td has global and sliding layers)"
    return None


def _gemma2_layer(config: Any, index: int) -> LayerDesign:
    if config.layer_types[index] == "sliding_attention":
        return LayerDesign("gemma2_sliding", (("W", config.sliding_window),), config.sliding_window)
    return LayerDesign("gemma2")


def _gemma2_unsupported(config: Any) -> str | None:
    if config.attn_logit_softcapping != 50:
        return f"attn_logit_softcapping = {config.attn_logit_softcapping} (designs/gemma2.td caps the logits at 50)"
    if float(config.rope_parameters.get("rope_theta", 10000)) != 10000:
        return f"rope_theta = {config.rope_parameters['rope_theta']} (designs/gemma2.td's RoPE base is 10000)"
    return _gemma_common_unsupported(config, "gemma2") or _rope_unsupported(config.rope_parameters, "gemma2")


def _gemma3_layer(config: Any, index: int) -> LayerDesign:
    kind = config.layer_types[index]
    rope = config.rope_parameters[kind]
    theta = ("Theta", _whole(rope["rope_theta"], "rope_theta"))
    if kind == "sliding_attention":
        return LayerDesign("gemma3_sliding", (theta, ("W", config.sliding_window)), config.sliding_window)
    factor = _whole(rope.get("factor", 1) if rope.get("rope_type") == "linear" else 1, "the RoPE factor")
    return LayerDesign("gemma3", (theta, ("Factor", factor)))


def _gemma3_unsupported(config: Any) -> str | None:
    if config.attn_logit_softcapping is not None:
        return f"attn_logit_softcapping = {config.attn_logit_softcapping} (designs/gemma3.td does not cap the logits)"
    if config.rms_norm_eps != 1e-6:
        return f"rms_norm_eps = {config.rms_norm_eps} (designs/gemma3.td's QK-norm takes 1e-6)"
    reason = _gemma_common_unsupported(config, "gemma3")
    for kind in sorted(set(config.layer_types)) if reason is None else ():
        rope = config.rope_parameters.get(kind, {})
        reason = reason or _rope_unsupported(
            rope, "gemma3", ("default", "linear") if kind == "full_attention" else ("default",)
        )
    return reason


def _gemma3_weights(attention: Any, block: Any) -> None:
    _qwen3_weights(attention, block)


def _olmo2_unsupported(config: Any) -> str | None:
    if config.rms_norm_eps != 1e-6:
        return f"rms_norm_eps = {config.rms_norm_eps} (designs/olmo2.td's QK-norm takes 1e-6)"
    reason = _llama_unsupported(config)
    return reason.replace("llama.td", "olmo2.td") if reason else None


def _olmo2_weights(attention: Any, block: Any) -> None:
    _qwen3_weights(attention, block)


def _starcoder2_layer(config: Any, index: int) -> LayerDesign:
    """StarCoder2's layers are alike: starcoder2.td (mistral.td with biases on every projection),
    or mistral.td where the config has no biases (use_bias = False)."""
    design = "starcoder2" if config.use_bias else "mistral"
    return LayerDesign(design, (("W", config.sliding_window),), config.sliding_window)


def _starcoder2_unsupported(config: Any) -> str | None:
    if config.sliding_window is None:
        return "sliding_window = None (designs/starcoder2.td attends within a window)"
    return _rope_unsupported(config.rope_parameters, "starcoder2")


def _starcoder2_weights(attention: Any, block: Any) -> None:
    _llama_weights(attention, block)
    if attention.o_proj.bias is not None:
        _biases(attention, block)
        load_linear(block, "bo", attention.o_proj.bias, cols="")


def _phi_sizes(config: Any) -> dict[str, int]:
    sizes = _llama_sizes(config)
    rotary = sizes["D"] * config.rope_parameters.get("partial_rotary_factor", 1.0)
    return sizes | {"Dr": _whole(rotary, "head_dim · partial_rotary_factor")}


def _phi_unsupported(config: Any) -> str | None:
    if config.qk_layernorm:
        return "qk_layernorm = True (designs/phi.td has no norm on the queries and keys)"
    return _rope_unsupported(config.rope_parameters, "phi")


def _phi_weights(attention: Any, block: Any) -> None:
    load_linear(block, "WQ", attention.q_proj.weight, cols="f")
    load_linear(block, "WK", attention.k_proj.weight, cols="f")
    load_linear(block, "WV", attention.v_proj.weight, cols="f")
    load_linear(block, "WO", attention.dense.weight, cols="g r e")
    _biases(attention, block)
    load_linear(block, "bo", attention.dense.bias, cols="")


FAMILIES: dict[str, Family] = {
    "llama": Family(
        "llama",
        lambda model: model.base_model.layers,
        "self_attn",
        _llama_sizes,
        _llama_unsupported,
        _llama_weights,
    ),
    "qwen3": Family(
        "qwen3",
        lambda model: model.base_model.layers,
        "self_attn",
        _llama_sizes,
        _qwen3_unsupported,
        _qwen3_weights,
    ),
    "mistral": Family(
        "mistral",
        lambda model: model.base_model.layers,
        "self_attn",
        _llama_sizes,
        _mistral_unsupported,
        _llama_weights,
        _mistral_layer,
    ),
    "qwen2": Family(
        "qwen2",
        lambda model: model.base_model.layers,
        "self_attn",
        _llama_sizes,
        _qwen2_unsupported,
        _qwen2_weights,
    ),
    "gemma2": Family(
        "gemma2",
        lambda model: model.base_model.layers,
        "self_attn",
        _gemma_sizes,
        _gemma2_unsupported,
        _llama_weights,
        _gemma2_layer,
    ),
    "gemma3_text": Family(
        "gemma3",
        lambda model: model.base_model.layers,
        "self_attn",
        _gemma_sizes,
        _gemma3_unsupported,
        _gemma3_weights,
        _gemma3_layer,
    ),
    "olmo2": Family(
        "olmo2",
        lambda model: model.base_model.layers,
        "self_attn",
        _llama_sizes,
        _olmo2_unsupported,
        _olmo2_weights,
    ),
    "starcoder2": Family(
        "starcoder2",
        lambda model: model.base_model.layers,
        "self_attn",
        _llama_sizes,
        _starcoder2_unsupported,
        _starcoder2_weights,
        _starcoder2_layer,
    ),
    "phi": Family(
        "phi",
        lambda model: model.base_model.layers,
        "self_attn",
        _phi_sizes,
        _phi_unsupported,
        _phi_weights,
    ),
    "gpt2": Family(
        "gpt2",
        lambda model: model.base_model.h,
        "attn",
        lambda config: {"F": config.n_embd, "H": config.n_head},
        _gpt2_unsupported,
        _gpt2_weights,
    ),
}


def use_design(model: Any, design: str | Path | Design | None = None, *, seed: int = 0) -> Any:
    """Replace the attention of every decoder layer of `model` (a HF model of a family in
    FAMILIES, with or without its LM head) by a compiled causal design, in place; returns the model.

    `design=None` compiles the model's own attention (each layer's: Gemma's sliding layers
    their windowed design) and imports each layer's weights (the logits are the model's); a
    bundled design's name, a `.td` path or a loaded Design is compiled at the config's width F
    (and H, if the design has a head count) with weights drawn from `seed`. Nothing is replaced
    unless every layer's design is built."""
    _check_transformers_version(model)
    config = model.config
    family = FAMILIES.get(config.model_type)
    if family is None:
        known = ", ".join(sorted(FAMILIES))
        raise ValueError(f"model: tdiag.hf knows the families {known}, not {config.model_type!r}")
    layers = list(family.layers(model))
    if design is None:
        designs = _own_designs(family, config, len(layers))
    else:
        designs = [(_sized(design, config).with_causal_mask(), None)] * len(layers)
    parameter = next(model.parameters())
    replacements = []
    for index, (layer, (causal, window)) in enumerate(zip(layers, designs, strict=True)):
        block = causal.module(seed=seed + index, dtype=parameter.dtype, device=parameter.device)
        _check_width(block, config.hidden_size, causal.name)
        if design is None:
            family.import_weights(getattr(layer, family.attribute), block)
        replacements.append(DesignAttention(block, index, window))
    for layer, replacement in zip(layers, replacements, strict=True):
        setattr(layer, family.attribute, replacement)
    return model


def _own_designs(family: Family, config: Any, count: int) -> list[tuple[Design, int | None]]:
    """Each layer's own design, compiled causal at the config's sizes (one per kind of layer),
    with its window; refused where the family's designs do not compute the config's attention."""
    reason = family.unsupported(config)
    if reason is not None:
        raise ValueError(f"model: its attention is not what designs/{family.design}.td computes: {reason}")
    loaded: dict[LayerDesign, Design] = {}
    designs = []
    for index in range(count):
        layer = family.layer_design(config, index)
        if layer not in loaded:
            loaded[layer] = load(layer.design, **family.sizes(config), **dict(layer.sizes)).with_causal_mask()
        designs.append((loaded[layer], layer.window))
    return designs


def _check_transformers_version(model: Any) -> None:
    """Refuse a transformers outside SUPPORTED_TRANSFORMERS: the keywords its layers pass the
    attention (the cache's above all) are those of the versions the bridge is written for."""
    low, below = SUPPORTED_TRANSFORMERS
    supported = f"transformers >= {low[0]}.{low[1]}, < {below[0]}.{below[1]}"
    versions = _transformers_versions()
    if not versions:
        raise RuntimeError(f"model: tdiag.hf bridges {supported}, which is not imported (a {type(model).__name__})")
    for installed in sorted(versions):
        found = re.match(r"(\d+)\.(\d+)", installed)
        if found is None or not low <= (int(found[1]), int(found[2])) < below:
            raise RuntimeError(f"model: tdiag.hf supports {supported}, not the installed {installed}")


def _transformers_versions() -> set[str]:
    """The `__version__` of each transformers module object the process holds: transformers
    executes its __init__ a second time (processing_utils' direct_transformers_import) and
    replaces its sys.modules entry, while a module that imported it earlier holds the first."""
    holders = [sys.modules.get("transformers")]
    holders += [getattr(module, "__dict__", {}).get("transformers") for module in list(sys.modules.values())]
    found = {holder for holder in holders if isinstance(holder, ModuleType) and holder.__name__ == "transformers"}
    return {str(getattr(holder, "__version__", "unknown")) for holder in found}


class DesignAttention(torch.nn.Module):
    """A compiled causal design in the place of a HF attention block. With a cache, a design that
    decodes with its own key-value rows (tdiag.DecodeCache of kind "kv") keeps them in the HF
    cache, packed as one tensor per layer, and computes the new positions from them; any other
    keeps the layer's inputs so far there and runs over the whole prefix, returning the new
    positions' outputs. HF's (output, weights) pair is returned with no weights.

    It takes `hidden_states`, `attention_mask` (the causal one only), `cache`, `position_ids`
    (consecutive from the cache's length only), the keywords of IGNORED_KEYWORDS, and those of
    _DEFAULT_ONLY at their default; any other keyword is a TypeError."""

    def __init__(self, block: torch.nn.Module, layer_idx: int, window: int | None = None) -> None:
        super().__init__()
        self.block = block
        self.layer_idx = layer_idx
        self.window = window  # the sliding window the design attends within (None: every earlier key)

    def forward(
        self,
        hidden_states: torch.Tensor,
        attention_mask: torch.Tensor | None = None,
        cache: Any = None,
        position_ids: torch.Tensor | None = None,
        **keywords: Any,
    ) -> tuple[torch.Tensor, None]:
        _check_keywords(keywords)
        new = hidden_states.shape[-2]
        before = 0 if cache is None else cache.get_seq_length(self.layer_idx)
        _check_positions(position_ids, before, new)
        if cache is not None:
            _keep_every_position(cache, self.layer_idx)
        if cache is not None and _decodes(self.block):
            return _decoded(cache, self.block, hidden_states, self.layer_idx, attention_mask, self.window), None
        if cache is not None:
            hidden_states = _prefix(cache, hidden_states, self.layer_idx)
        _check_mask(attention_mask, new, hidden_states.shape[-2], self.window)
        return self.block(hidden_states)[..., -new:, :], None


def _check_keywords(keywords: dict[str, Any]) -> None:
    """Refuse a keyword the bridge does not know (a transformers whose layers name their arguments
    otherwise) and one of _DEFAULT_ONLY at a value the design does not compute."""
    for name, value in keywords.items():
        if name in IGNORED_KEYWORDS:
            continue
        if name not in _DEFAULT_ONLY:
            taken = ", ".join(sorted({"attention_mask", "cache", "position_ids", *IGNORED_KEYWORDS, *_DEFAULT_ONLY}))
            raise TypeError(
                f"tdiag.hf.DesignAttention got an unexpected keyword argument {name!r}; it takes "
                f"hidden_states and the keywords {taken} (transformers >= 5.24 passes the cache as cache=)"
            )
        default, reason = _DEFAULT_ONLY[name]
        if value is not None and value != default:
            raise ValueError(f"{name}={value!r}: tdiag.hf cannot honour it ({reason})")


def _check_positions(position_ids: torch.Tensor | None, before: int, new: int) -> None:
    """Position ids are accepted only when they are those the design computes with: the new
    tokens at positions before .. before + new − 1 (the cache's length onwards) in every row."""
    if position_ids is None:
        return
    expected = torch.arange(before, before + new, device=position_ids.device)
    if position_ids.shape[-1] != new or not bool((position_ids == expected).all()):
        raise ValueError(
            f"position_ids: tdiag.hf runs the new tokens at positions {before} .. {before + new - 1} "
            "(the cache's length onwards); other positions (padding, packed sequences) are not supported"
        )


def _decodes(block: torch.nn.Module) -> bool:
    """Whether the block decodes with its own key-value rows (tdiag.DecodeCache of kind "kv")."""
    from .decode import DecodeCache, NotDecodableError

    try:
        return DecodeCache(block).kind == "kv"
    except NotDecodableError:
        return False


def _keep_every_position(cache: Any, layer_idx: int) -> None:
    """HF's DynamicCache keeps a sliding-window layer's last W − 1 positions alone; the design's
    rows are kept at every position (a window compares absolute positions, docs/decoding.md), so
    an empty sliding layer of the cache becomes a full one (transformers' DynamicLayer)."""
    layers = getattr(cache, "layers", None)
    if not isinstance(layers, list) or layer_idx >= len(layers):
        return
    from transformers.cache_utils import DynamicLayer, DynamicSlidingWindowLayer

    if type(layers[layer_idx]) is DynamicSlidingWindowLayer and not layers[layer_idx].is_initialized:
        layers[layer_idx] = DynamicLayer()


def _decoded(
    cache: Any,
    block: torch.nn.Module,
    hidden_states: torch.Tensor,
    layer_idx: int,
    mask: torch.Tensor | None,
    window: int | None,
) -> torch.Tensor:
    """The new positions' outputs from the block's key-value rows so far, which the HF cache
    keeps as its keys (one tensor [batch, 1, positions, width], values empty), so that its own
    bookkeeping (its length, reordering for beam search, cropping) applies to them; the new
    positions' rows are appended."""
    from .decode import DecodeCache

    decoder = DecodeCache(block)
    batch = hidden_states.shape[0]
    empty = hidden_states.new_zeros(batch, 1, 0, decoder.width())
    kept, _ = cache.update(empty, empty[..., :0], layer_idx)  # the rows so far, nothing added
    if kept.shape[-1] != decoder.width() or kept.dim() != 4:
        raise ValueError(
            f"cache: a {type(cache).__name__} whose layer {layer_idx} holds other rows than the design's;"
            " tdiag.hf needs a fresh DynamicCache"
        )
    before = kept.shape[-2]
    if before != cache.get_seq_length(layer_idx):
        raise ValueError(
            f"cache: a {type(cache).__name__} whose layer {layer_idx} keeps {before} of its "
            f"{cache.get_seq_length(layer_idx)} positions (a sliding window); tdiag.hf needs every position"
        )
    _check_mask(mask, hidden_states.shape[-2], before + hidden_states.shape[-2], window)
    if before:
        decoder.restore(kept[:, 0])
    output = decoder.extend(hidden_states)
    rows = decoder.packed(before)[:, None]
    added, _ = cache.update(rows, rows[..., :0], layer_idx)
    if added.shape[-2] != before + hidden_states.shape[-2]:
        raise ValueError(
            f"cache: a {type(cache).__name__} that does not keep every position (static or sliding "
            "window); tdiag.hf needs transformers' default DynamicCache"
        )
    return output


def _prefix(cache: Any, hidden_states: torch.Tensor, layer_idx: int) -> torch.Tensor:
    """The layer's inputs at every position so far: the new ones appended to those the cache
    keeps (stored as its keys and values of one head)."""
    before = cache.get_seq_length(layer_idx)
    entry = hidden_states[:, None]
    kept, _ = cache.update(entry, entry, layer_idx)
    if kept.shape[-2] != before + hidden_states.shape[-2]:
        raise ValueError(
            f"cache: a {type(cache).__name__} that does not keep every position (static or sliding "
            "window); tdiag.hf needs transformers' default DynamicCache"
        )
    return kept[:, 0]


def _check_mask(mask: torch.Tensor | None, queries: int, keys: int, window: int | None) -> None:
    """A mask HF builds is accepted only when it is the design's own (no padding): causal, and
    within the layer's sliding window where it has one; the design computes that mask itself."""
    if mask is None:
        return
    visible = mask if mask.dtype == torch.bool else mask == 0
    offset = keys - queries
    own = torch.ones(queries, keys, dtype=torch.bool, device=mask.device).tril(offset)
    if window is not None:
        own = own.triu(offset - window + 1)
    if visible.shape[-2:] != own.shape or not bool((visible == own).all()):
        kind = "causal mask" if window is None else f"causal mask within its window of {window}"
        raise ValueError(
            f"attention_mask: tdiag.hf runs a design with its {kind} only; a batch with padding "
            "(a mask that hides more than that) or another window is not supported"
        )


def _sized(design: str | Path | Design, config: Any) -> Design:
    if isinstance(design, Design):
        return design
    probe = load(design)
    sizes = {"F": config.hidden_size}
    if "H" in probe.graph.sizes and not probe.graph.sizes["H"].is_free:
        sizes["H"] = config.num_attention_heads
    return load(design, **{k: v for k, v in sizes.items() if k in probe.graph.sizes})


def _check_width(block: torch.nn.Module, width: int, name: str) -> None:
    parameter = next(iter(block.parameters()), None)
    probe = torch.zeros(1, 1, width, dtype=parameter.dtype if parameter is not None else None)
    try:
        with torch.no_grad():
            out = block(probe)
    except (ValueError, TypeError, RuntimeError) as error:
        raise ValueError(f"design {name}: does not take the model's hidden states of width {width}: {error}") from None
    if not isinstance(out, torch.Tensor) or out.shape != probe.shape:
        shape = tuple(getattr(out, "shape", ()))
        raise ValueError(f"design {name}: gives {shape} for input (1, 1, {width}); expected one output of that width")


def _whole(value: float, name: str) -> int:
    if float(value) != int(value):
        raise ValueError(f"model: {name} = {value} is not a whole number (a design's size)")
    return int(value)
