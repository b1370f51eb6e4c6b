"""Per-token gradient norms ``||d logprob_t / d theta||_2`` of a causal LM.

``grad_norms(model, input_ids, prompt_len)`` is the one entry point; the methods are entries of
:data:`gmts_analysis.engine.methods.GRAD_METHODS` (:mod:`~gmts_analysis.engine.methods`), the shared pieces
live in :mod:`~gmts_analysis.engine.base`, and this package re-exports them. Methods:

- ``exact`` (default): batched activation VJPs + ghost norms + causal truncation
  (:mod:`gmts_analysis.engine.exact`); exact to float32 rounding (float64 for float64 models).
- ``sketch``: closed-form head part + Gaussian forward-mode sketch of the rest, with a 95%
  interval per token (:mod:`gmts_analysis.engine.sketch`).
- ``loop``: one forward, ``autograd.grad`` per token (:mod:`gmts_analysis.engine.reference`).

The model is left as it was found: attention implementation restored, hooks removed,
``requires_grad`` flags restored, no ``.grad`` written.

Every method also returns the per-token closed forms of the forward it ran
(:class:`gmts_analysis.core.tokens.TokenQuantities`: log-prob, probability, entropy, logit- and
head-gradient norms), so a caller needs no forward of its own; :func:`forward_quantities`
gives them alone (one no-grad forward) when no gradient norm is wanted.
"""

from __future__ import annotations

from gmts_analysis.engine.base import GradNorms, forward_quantities, frozen_for_transforms, group_of  # noqa: F401
from gmts_analysis.engine.methods import (  # noqa: F401 - re-exported
    GRAD_METHODS,
    GROUPINGS,
    METHODS,
    GradMethod,
    expected_loop_slowdown,
    grad_norms,
    register_method,
)

__all__ = ["GROUPINGS", "METHODS", "GradNorms", "expected_loop_slowdown", "forward_quantities", "frozen_for_transforms", "grad_norms"]
