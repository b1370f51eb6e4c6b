"""Per-answer facts of a reward's trustworthiness, recorded beside the reward when a verifier scores it.

Each scored answer gets five fields (carried into ``answers.parquet``; :mod:`gmts_analysis.analysis.reward_audit`
summarises them as ``stats.json``'s ``reward_audit``):

- ``verifier``: the verifier's name (``math``, ``math_boxed``, a toy domain's, ``module:function``);
- ``boxed``: the response holds a complete ``\\boxed{...}`` (None when it has no text);
- ``fallback``: the verifier scored it from text outside a ``\\boxed{}`` (``math``: no box, and an expression
  was taken from elsewhere in the text); False for a boxed-only verifier; None where the verifier's rule is
  not known (a toy or user verifier);
- ``copies_example``: the response contains (whitespace aside) a whole assistant turn of its own prompt, a
  worked example copied verbatim ("Multiplication: 3 * 2 = 6. 6 + 1 = 7. \\boxed{7}" copies
  "3 * 2 = 6. 6 + 1 = 7. \\boxed{7}"); None when the prompt is not a message list;
- ``final_answer``: the answer the verifier scored, as text (``math_boxed``: the content of the last
  ``\\boxed{}``; ``math``: what math-verify extracted, the fallback's expression included); None where there
  is none or the verifier's rule is not known. Many answers giving one final answer whatever the question
  is a constant-answer collapse (``reward_audit``'s ``modal_answer_share``).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from gmts_analysis.readers.texts import last_boxed, response_text  # noqa: F401 - re-exported
from gmts_analysis.readers.verifiers import math_answer

#: verifiers whose answer comes from a ``\boxed{}`` only (no fallback)
BOXED_ONLY = ("math_boxed",)
#: verifiers that fall back to the text when there is no ``\boxed{}``
WITH_FALLBACK = ("math",)
AUDIT_FIELDS = ("verifier", "boxed", "fallback", "copies_example", "final_answer")


def _squash(text: str) -> str:
    return " ".join(text.split())


def copies_example(prompt: Any, response: Any) -> bool | None:
    """Whether ``response`` contains a whole assistant turn of the message-list ``prompt`` (None: not a message
    list)."""
    if not (isinstance(prompt, (list, tuple)) and prompt and all(isinstance(m, dict) for m in prompt)):
        return None
    text = response_text(response)
    if text is None:
        return None
    examples = {_squash(m.get("content") or "") for m in prompt if m.get("role") == "assistant"}
    answer = _squash(text)
    return any(ex and ex in answer for ex in examples)


def _scored_answer(verifier: Any, text: str | None) -> str | None:
    """The final answer ``verifier`` (a name) scores in ``text``; None: none, or a verifier of unknown rule."""
    if text is None:
        return None
    if verifier in BOXED_ONLY:
        box = last_boxed(text)
        return None if box is None else box.strip()
    if verifier in WITH_FALLBACK:
        return math_answer(text)
    return None


def final_answer(verifier: Any, response: Any) -> str | None:
    """The ``final_answer`` field of a ``response`` scored by ``verifier`` (a name; module docstring)."""
    return _scored_answer(verifier, response_text(response))


def _fallback_used(verifier: str, text: str | None, boxed: bool | None, answer: str | None) -> bool | None:
    if verifier in BOXED_ONLY:
        return False
    if verifier not in WITH_FALLBACK or text is None:
        return None
    return not boxed and answer is not None  # no box, and the fallback found an answer


def audit_fields(verifier: str, prompts: Sequence[Any], completions: Sequence[Any]) -> list[dict]:
    """The five audit fields of each (prompt, completion) scored by ``verifier`` (a name as given)."""
    out = []
    for p, c in zip(prompts, completions):
        text = response_text(c)
        boxed = None if text is None else last_boxed(text) is not None
        answer = _scored_answer(verifier, text)
        out.append({"verifier": verifier, "boxed": boxed, "fallback": _fallback_used(verifier, text, boxed, answer),
                    "copies_example": copies_example(p, c), "final_answer": answer})
    return out
