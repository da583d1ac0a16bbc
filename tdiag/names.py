"""Names the generated PyTorch module uses for itself: Python keywords, the modules and helpers it
imports or defines, the locals of `forward`, the builtins it calls, and the attributes of
torch.nn.Module (parameters, constants and buffers become attributes). `reserved_because` says,
per role, why a name is refused, or None; graph/builder.py reports it at the name, so a design that
checks also compiles. The plan renames forward's locals away from these (plan/base.py RESERVED)
and codegen.source is the one door into the generated text. Kept free of torch, so `tdiag check`
never imports it; tests/test_robustness.py compares MODULE_METHODS with torch's own list."""

from __future__ import annotations

import keyword
import sys

GENERATED = {
    "B": "the batch size",
    "batch_shape": "the input's batch shape",
    "self": "the module itself",
    "cache": "the decoding cache argument",
    "torch": "the torch module",
    "nn": "torch.nn",
    "math": "the math module",
    "hashlib": "the hashlib module",
    "_seed": "a helper function",
    "_generator": "a helper function",
    "_normal": "a helper function",
    "_uniform": "a helper function",
    "_fill": "a helper function",
    "_identity": "a helper function",
    "_call_mask": "a helper function",
}
# builtins the generated code calls; a local of forward with such a name would hide it
BUILTINS = ("ValueError", "abs", "bool", "float", "int", "isinstance", "len", "max", "min", "range", "round")
BUILTINS += ("sum", "super", "tuple")

MODULE_ATTRIBUTES = frozenset(
    """T_destination _backward_hooks _backward_pre_hooks _buffers _compiled_call_impl _forward_hooks
    _forward_hooks_always_called _forward_hooks_with_kwargs _forward_pre_hooks _forward_pre_hooks_with_kwargs
    _is_full_backward_hook _load_state_dict_post_hooks _load_state_dict_pre_hooks _modules
    _non_persistent_buffers_set _parameters _state_dict_hooks _state_dict_pre_hooks _version call_super_init
    dump_patches training tdiag_source tdiag_plan tdiag_graph tdiag_dtype tdiag_sizes""".split()
)
MODULE_METHODS = frozenset(
    """_apply _call_impl _get_backward_hooks _get_backward_pre_hooks _get_name _load_from_state_dict
    _maybe_warn_non_full_backward_hook _named_members _register_load_state_dict_pre_hook _register_state_dict_hook
    _replicate_for_data_parallel _save_to_state_dict _slow_forward _wrapped_call_impl add_module apply bfloat16
    buffers children compile cpu cuda double eval extra_repr float forward get_buffer get_extra_state
    get_parameter get_submodule half ipu load_state_dict modules mtia named_buffers named_children named_modules
    named_parameters parameters register_backward_hook register_buffer register_forward_hook
    register_forward_pre_hook register_full_backward_hook register_full_backward_pre_hook
    register_load_state_dict_post_hook register_load_state_dict_pre_hook register_module register_parameter
    register_state_dict_post_hook register_state_dict_pre_hook requires_grad_ reset_parameters set_extra_state
    set_submodule share_memory state_dict to to_empty train type xpu zero_grad
    _tdiag_given _tdiag_noise _tdiag_update_buffers new_cache _tdiag_plain _tdiag_causal _tdiag_masked
    _tdiag_causal_masked _tdiag_masked_heads _tdiag_causal_masked_heads _tdiag_planner""".split()
)
TDIAG_PREFIXES = ("tdiag_", "_tdiag_")  # generated attributes: tdiag_design, _tdiag_table_<var>, ...
ATTRIBUTE_KINDS = ("param", "const", "buffer")  # stored on the module as self.NAME
LOCAL_KINDS = ("input", "mask", "random", "result")  # forward's locals, renamed by the plan where taken


def reserved_because(name: str, role: str) -> str | None:
    """Why `name` cannot name a size, a tensor of kind `role` or a statement's result, or None.

    Per role, what a user expects: a param, const or buffer keeps its name as the module's
    attribute (its state_dict key), so one that would shadow torch.nn.Module is refused; a size
    keeps its name as forward's local and as the keyword of `module(N=...)`, so one the generated
    code uses is refused; an input, mask, noise or result is only a local of forward, so the plan
    gives it a fresh name where the generated code uses its own (`B`, `torch`, `batch_shape`) and
    it compiles. Keywords and double-underscore names are refused everywhere."""
    if keyword.iskeyword(name):
        return f"'{name}' is a Python keyword"
    if name.startswith("__"):
        return f"'{name}' is a Python special or private name"
    if role in ATTRIBUTE_KINDS:
        prefix = next((p for p in TDIAG_PREFIXES if name.startswith(p)), None)
        if prefix is not None:
            return (
                f"'{name}' begins with '{prefix}', kept for what tdiag adds to a module (its tables, its"
                f" design record, its plans), and a {role} becomes an attribute of the module"
            )
        if name in MODULE_METHODS:
            return f"'{name}' is a method of torch.nn.Module, and a {role} becomes an attribute of the module"
        if name in MODULE_ATTRIBUTES:
            return f"'{name}' is an attribute of torch.nn.Module, and a {role} becomes one too"
        if name in _added_module_attributes():
            return (
                f"'{name}' is an attribute of torch.nn.Module here (added by a library), and a {role} becomes one too"
            )
        return None
    if role in LOCAL_KINDS:
        return None
    if name in GENERATED:
        return f"'{name}' is reserved for {GENERATED[name]} in generated code"
    if name in BUILTINS:
        return f"'{name}' is a Python builtin that generated code calls"
    return None


def _added_module_attributes() -> set[str]:
    """torch.nn.Module's attributes in this process beyond the ones listed above, where torch is
    loaded already: libraries add methods to it (transformers adds `smart_apply`), and a
    stored tensor of that name would shadow one. Never imports torch."""
    torch = sys.modules.get("torch")
    module = getattr(getattr(torch, "nn", None), "Module", None)
    return set(dir(module)) - MODULE_METHODS - MODULE_ATTRIBUTES if module is not None else set()
