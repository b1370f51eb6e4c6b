"""Exact or sketch: which gradient-norm method costs less for answers of given lengths.

Both methods run the model over the whole sequence (prompt and answer). The exact engine's work grows with the
number of answer tokens T (one cotangent per token, over the P + T positions); the sketch's with the number of
directions K (one forward-mode pass per direction, every token at once). Measured on SmolLM2-135M-Instruct at a
224-token prompt (docs/benchmarks.md, "Exact or sketch"), the CPU ratio exact / sketch is close to

    ratio = EXACT_PER_SKETCH * T / K      (EXACT_PER_SKETCH ~ 0.35)

(T = 35, K = 16: exact 59 s, sketch 90 s for one group of 4, ratio 0.66; T = 228, K = 16: ratio 5.3, K = 32: 2.8).
So the sketch pays only past ``T ~ 3 K`` tokens per answer; below that exact is cheaper and exact.
"""

from __future__ import annotations

from collections.abc import Sequence

#: exact / sketch CPU ratio per (answer token / direction), measured (module docstring)
EXACT_PER_SKETCH = 0.35
#: the sketch is chosen only where it saves at least this factor (it is an estimate; exact is exact)
MIN_SAVING = 1.5


def exact_over_sketch(answer_lengths: Sequence[int], probes: int) -> float:
    """The predicted CPU ratio exact / sketch for answers of ``answer_lengths`` tokens with ``probes`` directions
    (mean over the answers)."""
    if not answer_lengths:
        return 0.0
    mean_t = sum(int(t) for t in answer_lengths) / len(answer_lengths)
    return EXACT_PER_SKETCH * mean_t / max(int(probes), 1)


def choose_method(answer_lengths: Sequence[int], probes: int) -> tuple[str, str]:
    """``(method, reason)``: ``"sketch"`` where it is predicted to cost at most ``1 / MIN_SAVING`` of exact,
    else ``"exact"``; the reason says the lengths and the predicted ratio."""
    r = exact_over_sketch(answer_lengths, probes)
    n = len(answer_lengths)
    mean_t = sum(answer_lengths) / n if n else 0.0
    method = "sketch" if r >= MIN_SAVING else "exact"
    why = (f"{n} answers of {mean_t:.0f} tokens on average: exact is predicted to cost {r:.2f}x the sketch with "
           f"K = {probes} (exact / sketch ~ {EXACT_PER_SKETCH} x T / K); "
           + (f"the sketch saves at least {MIN_SAVING}x" if method == "sketch"
              else f"the sketch would save less than {MIN_SAVING}x, so exact"))
    return method, why
