"""The generated module's call-time masks (call_plans.py): `forward` takes `attn_mask`,
`key_padding_mask` and `is_causal` beside the design's own inputs and masks, checks them (each
mistake a TypeError or ValueError naming the argument), merges the two masks into one over
(*batch, queries, keys) (or (*batch, heads, queries, keys), a mask per head), and runs one of the
bodies, each the text codegen prints for its plan, as a method (METHODS). The bodies read the same
parameters and buffers. docs/module.md has the table of conventions."""

from __future__ import annotations

import difflib

from ..plan import Plan
from ..plan.call_variants import CallPlans
from .forward import decodes, forward_method
from .stored import dtype_reference, reference_tensor
from .text import quoted, size_code, source

METHODS = (
    "_tdiag_plain",
    "_tdiag_causal",
    "_tdiag_masked",
    "_tdiag_causal_masked",
    "_tdiag_masked_heads",
    "_tdiag_causal_masked_heads",
    "_tdiag_unmasked",
    "_tdiag_causal_unmasked",
)

CALL_HELPERS = {
    "_call_mask": '''

def _call_mask(attn_mask, key_padding_mask, queries, keys, batch_shape, dtype, bias, refusal, heads, why=""):
    """attn_mask and key_padding_mask as one mask over (*batch, queries, keys), or (*batch, heads,
    queries, keys) for a mask per head, as scaled_dot_product_attention and nn.MultiheadAttention
    take them: attn_mask bool (True = attend) or float (added to the scores after the scale), its
    leading axes the inputs' batch axes, or those and a heads axis ((B, 1, N, M), or (B, H, N, M)
    where the design takes a mask per head: `heads` is its number of heads, else None and `why`;
    with one batch axis B, nn.MultiheadAttention's (B·H, queries, keys), read as (B, H, ...));
    key_padding_mask (*batch, keys), bool (True = ignore) or float (added). Two masks intersect
    (bool) or add (float). With `bias` (every masked node a softmax box) the mask comes back as
    float scores, a hidden entry the dtype's lowest number; without, a float mask is refused for
    `refusal`. Sizes are compared with != (not `in`): under torch.compile, after a call at
    another length, a size is symbolic, and Dynamo's `in` on a tuple does not compare it by value."""
    masks, per_head = [], False
    for name, mask, rank, what in (
        ("attn_mask", attn_mask, 2, f"(queries, keys) = ({queries}, {keys})"),
        ("key_padding_mask", key_padding_mask, 1, f"(keys,) = ({keys},)"),
    ):
        if mask is None:
            continue
        if not isinstance(mask, torch.Tensor):
            raise TypeError(f"{name} must be a torch.Tensor, got {type(mask).__name__}")
        if mask.dtype != torch.bool and not mask.is_floating_point():
            raise TypeError(f"{name} must be a bool or floating-point tensor, got {mask.dtype}")
        if not bias and mask.dtype != torch.bool:
            raise TypeError(f"{name} is {mask.dtype}: {refusal}")
        trailing = (queries, keys)[2 - rank :]
        if mask.dim() < rank or any(s != 1 and s != t for s, t in zip(mask.shape[-rank:], trailing)):
            raise ValueError(f"{name} must end in {what} (or 1 where it broadcasts), got shape {tuple(mask.shape)}")
        lead = mask.shape[: mask.dim() - rank]
        if rank == 2 and len(lead) == len(batch_shape) == 1 and lead[0] != 1 and lead[0] != batch_shape[0]:
            if heads is not None and lead[0] == batch_shape[0] * heads:  # nn.MultiheadAttention's (B·H, N, M)
                mask = mask.reshape(batch_shape[0], heads, *mask.shape[-2:])
                lead = mask.shape[:-2]
            elif heads is None:
                raise ValueError(
                    f"{name} of shape {tuple(mask.shape)}: leading axes {tuple(lead)} do not broadcast with the"
                    f" inputs' batch axes {tuple(batch_shape)}; as nn.MultiheadAttention's (batch * heads, queries,"
                    f" keys) it would be a mask per head, and this design takes one mask for all heads: {why}"
                )
            else:
                raise ValueError(
                    f"{name} of shape {tuple(mask.shape)}: leading axes {tuple(lead)} do not broadcast with the"
                    f" inputs' batch axes {tuple(batch_shape)}, nor are they nn.MultiheadAttention's (batch * heads)"
                    f" = {batch_shape[0]} * {heads}; give (batch, queries, keys), (batch, heads, queries, keys) or"
                    " (batch * heads, queries, keys)"
                )
        if rank == 2 and len(lead) == len(batch_shape) + 1:
            if lead[-1] != 1 and heads is None:
                raise ValueError(
                    f"{name} has a heads axis of size {lead[-1]} (shape {tuple(mask.shape)}): this design takes one"
                    f" mask for all heads: {why}; give"
                    " (batch, 1, queries, keys) or (batch, queries, keys)"
                )
            if lead[-1] != 1 and lead[-1] != heads:
                raise ValueError(
                    f"{name} has a heads axis of size {lead[-1]} (shape {tuple(mask.shape)}), but the design has"
                    f" {heads} heads; give 1 or {heads}"
                )
            per_head = lead[-1] != 1
            mask = mask if per_head else mask.squeeze(-3)
            lead = lead[:-1]
        try:
            torch.broadcast_shapes(lead, batch_shape)
        except RuntimeError:
            raise ValueError(
                f"{name} of shape {tuple(mask.shape)}: leading axes {tuple(lead)} do not broadcast with"
                f" the inputs' batch axes {tuple(batch_shape)}"
            ) from None
        if len(lead) > len(batch_shape):
            raise ValueError(
                f"{name} of shape {tuple(mask.shape)} has more leading axes than the inputs' batch axes"
                f" {tuple(batch_shape)}"
            )
        if rank == 1:
            mask = (~mask if mask.dtype == torch.bool else mask).unsqueeze(-2)
            mask = mask.unsqueeze(-3) if per_head else mask
        masks.append(mask)
    if bias:
        lowest = torch.finfo(dtype).min
        for k, m in enumerate(masks):
            if m.dtype == torch.bool:
                masks[k] = torch.zeros(m.shape, dtype=dtype, device=m.device).masked_fill(~m, lowest)
            else:
                masks[k] = m.to(dtype)
        mask = masks[0] if len(masks) == 1 else (masks[0] + masks[1]).clamp(min=lowest)
    else:
        mask = masks[0] if len(masks) == 1 else masks[0] & masks[1]
    return mask.expand(*mask.shape[:-2], queries, keys)
'''
}


def _body(plan: Plan, method: str, *, cache: bool | None = None) -> list[str]:
    """The plan's forward, printed as the method `method`. Only the plain body decodes with a cache
    (forward hands it over): a variant's body is printed without the cache argument and its entry
    (and the plain one too with `cache=False`, to compare it with the variants)."""
    lines = forward_method(plan)
    head = "    def forward("
    assert lines[0].startswith(head)
    lines = [f"    def {method}(" + lines[0][len(head) :], *lines[1:]]
    if not (method == METHODS[0] if cache is None else cache) and decodes(plan):
        signature = lines[0].replace(", *, cache=None)", ")").replace(", cache=None)", ")")
        entry = ["        if cache is not None:", lines[2]]
        assert signature != lines[0] and lines[1:3] == entry and lines[2].lstrip().startswith("return _extend(cache, ")
        lines = [signature, *lines[3:]]
    return lines


def _sizes(plan: Plan) -> list[str]:
    """Lines that check the inputs as the bodies do and bind the run-time sizes from their shapes,
    so that the mask's expected shape can be named before any body runs."""
    graph = plan.graph
    lines: list[str] = []
    bound: set[str] = set()
    like, like_name = reference_tensor(plan)
    for t in graph.inputs:
        var = source(plan.names[t.name], "name")
        rank = len(t.axes)
        lines.append(f"_input({var}, {quoted(f'input {t.name}')}, {like}, {like_name})")
        lines.append(f"if {var}.dim() < {rank}:")
        needs = source(f"input {t.name} needs {rank} trailing axes ({' '.join(t.legs)}), got shape ", "fstring")
        lines.append(f'    raise ValueError(f"{needs}{{tuple({var}.shape)}}")')
        for k, axis in enumerate(t.axes):
            size = axis.size
            if size.is_Symbol and graph.sizes[str(size)].is_free and str(size) not in bound:
                lines.append(f"{source(str(size), 'name')} = {var}.shape[{k - rank}]")
                bound.add(str(size))
    return lines


def _batch_shape(plan: Plan) -> list[str]:
    """Lines binding `batch_shape`: the inputs' batch axes broadcast together, as the bodies do."""
    lines = []
    for k, t in enumerate(plan.graph.inputs):
        var = source(plan.names[t.name], "name")
        rank = len(t.axes)
        if k == 0:
            lines.append(f"batch_shape = {var}.shape[: {var}.dim() - {rank}]")
        else:
            lines.append(f"batch_shape = _batch(batch_shape, {var}, {rank}, {quoted(f'input {t.name}')})")
    return lines


def _chosen(causal: str, plain: str, arguments: str, merged: dict[str, str] | None = None) -> str:
    """The call of the causal body when is_causal, else of the plain one (one call where they are
    one body, or one body that reads is_causal where the causal mask is used)."""
    if causal == plain:
        return f"self.{plain}({arguments})"
    if (merged or {}).get(causal) == plain:
        return f"self.{plain}({arguments}, is_causal=is_causal)"
    return f"self.{causal}({arguments}) if is_causal else self.{plain}({arguments})"


def _cache_lines(given: str) -> list[str]:
    """With a decoding cache (tdiag/decode.py), the plain body decodes; masks cannot come with it."""
    return [
        "        if cache is not None:",
        "            if attn_mask is not None or key_padding_mask is not None:",
        '                raise ValueError("attn_mask and key_padding_mask cannot be given with a cache:'
        ' decoding attends every cached position")',
        f"            return self._tdiag_plain({given}, cache=cache)",
    ]


def _unmasked_lines(
    calls: CallPlans, inputs: list[str], masks: list[str], shared: dict[str, str], merged: dict[str, str]
) -> list[str]:
    """With none of the design's own masks and no call mask, the body planned without the masks
    (graph/absent_masks.py): the same values, without an all-True mask to build and apply."""
    none = " and ".join(f"{m} is None" for m in [*masks, "attn_mask", "key_padding_mask"])
    causal = shared["_tdiag_unmasked" if calls.already_causal else "_tdiag_causal_unmasked"]
    return [
        f"        if {none}:",
        f"            return {_chosen(causal, shared['_tdiag_unmasked'], ', '.join(inputs), merged)}",
    ]


def call_forward(plan: Plan, calls: CallPlans) -> tuple[list[str], list[Plan]]:
    """`forward` choosing among the bodies, then the bodies; and the plans printed."""
    graph = plan.graph
    inputs = [source(plan.names[t.name], "name") for t in graph.inputs]
    masks = [source(plan.names[t.name], "name") for t in graph.tensors_of_kind("mask")]
    signature = ", ".join(
        ["self", *(f"{v}: torch.Tensor" for v in inputs), "*"]
        + [f"{m}: torch.Tensor | None = None" for m in masks]
        + ["attn_mask: torch.Tensor | None = None", "key_padding_mask: torch.Tensor | None = None"]
        + ["is_causal: bool = False"]
        + (["cache=None"] if decodes(plan) else [])
    )
    returns = "torch.Tensor" if len(graph.outputs) == 1 else "tuple[torch.Tensor, ...]"
    given = ", ".join([*inputs, *(f"{m}={m}" for m in masks)])
    plans = variant_plans(plan, calls)
    bodies, shared = _shared_bodies(plans)
    merged = _merge_causal(bodies, plans)
    causal = shared["_tdiag_plain" if calls.already_causal else "_tdiag_causal"]
    causal_masked = shared["_tdiag_masked" if calls.already_causal else "_tdiag_causal_masked"]
    mask_var = source(calls.name, "name")
    if calls.masked is not None:  # the plan names its mask as the design does; a float one is its last input
        assert calls.masked.names[calls.name] == mask_var
        assert not calls.bias or calls.masked.graph.inputs[-1].name == calls.name
    local = "mask_"
    while local in {*inputs, *masks, *graph.sizes}:
        local += "_"
    call = (
        f"{given}, {mask_var}={local}"
        if not calls.bias
        else f"{', '.join(inputs)}, {local}" + "".join(f", {m}={m}" for m in masks)
    )
    heads = " * ".join(size_code(graph, size) for size in calls.heads) if calls.heads is not None else "None"
    queries = size_code(graph, graph.legs[calls.query].size)
    keys = size_code(graph, graph.legs[calls.key].size)
    doc = [
        "The design's forward. The masks as scaled_dot_product_attention and nn.MultiheadAttention",
        "        take them (tdiag's docs/module.md): attn_mask bool (True = attend) or float (added to the",
        "        scores after the scale), (*batch, queries, keys) or (*batch, 1 or heads, queries, keys);",
        "        key_padding_mask (*batch, keys), True = ignore, or float added; is_causal hides the keys",
        "        after each query.",
    ]
    lines = [
        f"    def forward({signature}) -> {returns}:",
        f'        """{source(doc[0], "text")}',
        *(source(line, "text") for line in doc[1:]),
        '        """',
        "        if not isinstance(is_causal, bool):",
        '            raise TypeError(f"is_causal must be a bool, got {type(is_causal).__name__}")',
        *(_cache_lines(given) if decodes(plan) else []),
        *(_unmasked_lines(calls, inputs, masks, shared, merged) if calls.unmasked is not None else []),
        "        if attn_mask is None and key_padding_mask is None:",
        f"            return {_chosen(causal, '_tdiag_plain', given, merged)}",
    ]
    lines += ["        " + line for line in [*_sizes(plan), *_batch_shape(plan)]]
    refusal = quoted(calls.refusal)
    lines.append(
        f"        {local} = _call_mask(attn_mask, key_padding_mask, {queries}, {keys}, batch_shape,"
        f" {dtype_reference(plan)}.dtype, {calls.bias}, {refusal}, {heads}"
        + (f", {quoted(calls.heads_refusal)})" if calls.heads is None else ")")
    )
    if calls.heads is not None:
        per_head = shared["_tdiag_masked_heads" if calls.already_causal else "_tdiag_causal_masked_heads"]
        split = ", ".join(size_code(graph, size) for size in calls.heads)
        lines += [
            f"        if {local}.dim() == len(batch_shape) + 3:  # a mask per head, over the nodes' head legs",
            f"            {local} = {local}.reshape(*{local}.shape[:-3], {split}, *{local}.shape[-2:])",
            f"            return {_chosen(per_head, shared['_tdiag_masked_heads'], call, merged)}",
        ]
    lines.append(f"        return {_chosen(causal_masked, shared['_tdiag_masked'], call, merged)}")
    for body in bodies.values():
        lines += ["", *body]
    aliases = [(method, name) for method, name in shared.items() if name != method and method in _planned(plans)]
    if aliases:
        lines += ["", *(f"    {method} = {name}  # the same steps as {name}" for method, name in aliases)]
    for causal, plain in merged.items():
        lines += [
            "",
            f"    def {causal}(self, *args, **kwargs):",
            f"        return self.{plain}(*args, **kwargs, is_causal=True)",
        ]
    return lines, [p for p in plans if p is not None]


def variant_plans(plan: Plan, calls: CallPlans) -> list[Plan | None]:
    """The plans of the bodies, in the order of METHODS (None where a variant is not planned)."""
    return [
        plan,
        calls.causal,
        calls.masked,
        calls.causal_masked,
        calls.masked_heads,
        calls.causal_masked_heads,
        calls.unmasked,
        calls.causal_unmasked,
    ]


def _planned(plans: list[Plan | None]) -> set[str]:
    return {method for method, body in zip(METHODS, plans, strict=True) if body is not None}


def _shared_bodies(plans: list[Plan | None]) -> tuple[dict[str, list[str]], dict[str, str]]:
    """The bodies to print, one per distinct text: a variant whose plan prints the same steps as an
    earlier one (is_causal on a design whose sums are causal already, say) runs that body. Also,
    for every method, the method that holds its body (itself where it has one of its own); a
    variant not planned keeps its own name (module.py plans it on first use)."""
    bodies: dict[str, list[str]] = {}
    seen: dict[str, str] = {}
    shared = {method: method for method in METHODS}
    for method, plan in zip(METHODS, plans, strict=True):
        if plan is None:
            continue
        body = _body(plan, method)
        compared = _body(plan, method, cache=False)
        text = "\n".join([compared[0].replace(f"def {method}(", "def (", 1), *compared[1:]])
        if text in seen:
            shared[method] = seen[text]
            continue
        seen[text] = method
        bodies[method] = body
    return bodies, shared


CAUSAL_PAIRS = (
    ("_tdiag_plain", "_tdiag_causal"),
    ("_tdiag_masked", "_tdiag_causal_masked"),
    ("_tdiag_masked_heads", "_tdiag_causal_masked_heads"),
    ("_tdiag_unmasked", "_tdiag_causal_unmasked"),
)


def _merge_causal(bodies: dict[str, list[str]], plans: list[Plan | None]) -> dict[str, str]:
    """Where a causal body differs from its plain one in a few statements only (the causal mask
    built and applied, SDPA's is_causal=True), print one body that takes is_causal and runs those
    statements under `if is_causal:`. Returns each causal method merged into its plain one."""
    plan_of = dict(zip(METHODS, plans, strict=True))
    merged: dict[str, str] = {}
    for plain, causal in CAUSAL_PAIRS:
        if plain not in bodies or causal not in bodies:
            continue
        compared = _body(plan_of[plain], plain, cache=False)  # type: ignore[arg-type]
        if any("is_causal" in _variables(plan_of[name]) for name in (plain, causal)):  # type: ignore[arg-type]
            continue
        lines = _with_causal_branches(compared[1:], bodies[causal][1:])
        if lines is None:
            continue
        own = bodies[plain]
        entry = own[1 : len(own) - len(compared) + 1]  # the cache's entry, where the plain body decodes
        bodies[plain] = [_taking_is_causal(own[0]), *entry, *lines]
        del bodies[causal]
        merged[causal] = plain
    return merged


def _variables(plan: Plan) -> set[str]:
    """The body's variables: the design's inputs and masks, and every value its steps define."""
    steps = [*plan.steps, *plan.update_steps]
    return {*plan.names.values(), *(step.out.var for step in steps if step.out is not None), *plan.causal.values()}


def _taking_is_causal(signature: str) -> str:
    """A body's `def` line with a keyword is_causal (False: the plain plan) after its arguments."""
    head, returns = signature.rsplit(") -> ", 1)
    star = "" if ", *" in head else ", *"
    return f"{head}{star}, is_causal: bool = False) -> {returns}"


def _with_causal_branches(plain: list[str], causal: list[str]) -> list[str] | None:
    """The plain body's lines, the causal one's where they differ under `if is_causal:` (and the
    plain ones under `else:`); None where they differ in more than a few statements, or in a
    line that opens a block, whose body an `if` cannot take apart."""
    opcodes = difflib.SequenceMatcher(None, plain, causal, autojunk=False).get_opcodes()
    differing = sum(max(i2 - i1, j2 - j1) for tag, i1, i2, j1, j2 in opcodes if tag != "equal")
    if differing > max(4, len(plain) // 5):
        return None
    lines: list[str] = []
    for tag, i1, i2, j1, j2 in opcodes:
        ours, theirs = plain[i1:i2], causal[j1:j2]
        if tag == "equal":
            lines += ours
            continue
        indents = {len(line) - len(line.lstrip()) for line in [*ours, *theirs]}
        if len(indents) != 1 or any(line.rstrip().endswith(":") or not line.strip() for line in [*ours, *theirs]):
            return None
        indent = " " * indents.pop()
        if theirs:
            lines += [f"{indent}if is_causal:", *(f"    {line}" for line in theirs)]
        if ours:
            lines += [f"{indent}{'else' if theirs else 'if not is_causal'}:", *(f"    {line}" for line in ours)]
    return lines
