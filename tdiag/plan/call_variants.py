"""CallPlans, the record of the plans a compiled module chooses among when it is called
(`attn_mask`, `key_padding_mask`, `is_causal`): made by tdiag/call_plans.py from the design's
call-time variants, printed by codegen_calls.py and held by module.py. A record of plans only, so
the backends and the runtime read it without importing the facade that makes it."""

from __future__ import annotations

from dataclasses import dataclass

from .program import Plan


@dataclass(frozen=True)
class CallPlans:
    """The plans behind one module's call-time arguments; the plans are None until planned (a
    module plans them the first time a call asks for one, module.py)."""

    query: str  # the query leg (n), whose size is the mask's second-to-last axis
    key: str  # the key leg (m), whose size is its last axis
    already_causal: bool  # the design is causal as built: is_causal changes nothing, the plain plan serves
    bias: bool  # True: every masked node is a softmax box, a mask reaches it as float scores
    refusal: str  # why a float mask is refused (empty where `bias`)
    name: str  # the call mask's tensor name in the masked plans (a float input where `bias`, else a mask)
    causal: Plan | None = None  # the plan with causal(query, key)
    masked: Plan | None = None  # the plan with the call mask
    causal_masked: Plan | None = None  # both
    # the sizes of the head legs of the nodes the mask reaches, where a mask per head is taken
    # (every node with head legs of the same sizes; graph/call_masks.py node_heads)
    heads: tuple | None = None
    heads_refusal: str = ""  # why a mask per head is refused (empty where `heads`)
    masked_heads: Plan | None = None  # the plan with a mask per head
    causal_masked_heads: Plan | None = None  # and causal
    # the plans without the design's own masks (graph/absent_masks.py), run when none is given;
    # the plain one is planned with the module (it serves the plain call), the causal one later
    unmasked: Plan | None = None
    causal_unmasked: Plan | None = None

    @property
    def planned(self) -> bool:
        return self.masked is not None
