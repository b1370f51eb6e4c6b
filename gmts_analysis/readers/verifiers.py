"""Verifiers: ``--verifier NAME|module:function``, reward functions shaped and called as TRL 1.16 calls them.

A verifier is a TRL reward function: called with keywords
``f(prompts=[...], completions=[...], completion_ids=[[...], ...], **columns)`` where every other
column of the rollouts (or prompts file) is passed as a list with one value per row (TRL's
``_calculate_rewards`` passes the dataset's columns the same way), returning one float per row,
or ``None`` for a row it cannot score ("skipped"; TRL turns it into NaN, leaves the row out of
its group's mean and std and gives it advantage 0). Prompts and completions are text, or lists
of ``{"role", "content"}`` messages for chat data (TRL's conversational format).

Names: ``math`` (GSM8K / MATH answers, with the optional ``math-verify`` package:
``pip install 'gmts_analysis[math]'``: a ``\\boxed{}`` answer first, else the *last* expression of the
text, the fallback), ``math_boxed`` (the same equivalence check on the last ``\\boxed{}`` only: an
answer without one scores 0; the word problems' default), ``domain`` (each row's toy domain), ``arithmetic``,
``program``, ``logic`` (the toy domains), or ``module:function`` / ``path/to/file.py:function``
for any TRL reward function (for example ``trl.rewards:accuracy_reward``).
"""

from __future__ import annotations

import importlib
import importlib.util
import math
import threading
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.texts import last_boxed
from gmts_analysis.toy.verifiers import REWARD_FUNCTIONS, toy_reward

RewardFunction = Callable[..., list]
BUILTIN = ("math", "math_boxed", "domain", "arithmetic", "program", "logic")


def _text(x: Any) -> str:
    """Plain text of a prompt or completion: a string, or the last message's content."""
    if isinstance(x, str):
        return x
    if isinstance(x, (list, tuple)) and x and isinstance(x[-1], dict):
        c = x[-1].get("content", "")
        return c if isinstance(c, str) else ""
    return "" if x is None else str(x)


def reference_text(sol: Any) -> str:
    """The reference answer: GSM8K's ``... #### 72`` keeps what follows ``####`` ("" for None or NaN)."""
    s = "" if sol is None or (isinstance(sol, float) and math.isnan(sol)) else str(sol)
    return s.rsplit("####", 1)[1].strip() if "####" in s else s


def _math_verify() -> tuple[Any, ...]:
    """``(NormalizationConfig, ExprExtractionConfig, LatexExtractionConfig, parse, verify)`` of the optional
    math-verify package, or a one-line error naming the extra that installs it."""
    try:
        from latex2sympy2_extended import NormalizationConfig
        from math_verify import ExprExtractionConfig, LatexExtractionConfig, parse, verify
    except ImportError:
        raise GmtsError("--verifier math needs the math-verify package: pip install 'gmts_analysis[math]' "
                        "(or pip install 'math-verify>=0.5')") from None
    return NormalizationConfig, ExprExtractionConfig, LatexExtractionConfig, parse, verify


def _references(prompts: Sequence[Any], completions: Sequence[Any], solution: Sequence[Any] | None,
                answer: Sequence[Any] | None, name: str) -> Sequence[Any]:
    refs = solution if solution is not None else answer
    if refs is None:
        raise GmtsError(f"--verifier {name} needs a 'solution' (or GSM8K 'answer') column with the reference answers")
    if not (len(refs) == len(completions) == len(prompts)):
        raise GmtsError(f"--verifier {name}: {len(prompts)} prompts, {len(completions)} completions, "
                        f"{len(refs)} reference answers")
    return refs


def math_boxed_reward(prompts: Sequence[Any], completions: Sequence[Any], solution: Sequence[Any] | None = None,
                      answer: Sequence[Any] | None = None, **kwargs: Any) -> list[float | None]:
    """1.0 where the completion's last ``\\boxed{}`` holds the reference answer, 0.0 where it holds another
    or the completion has none, None where the reference cannot be parsed. No fallback: a number written
    elsewhere in the text is never taken for the answer (the ``math`` verifier's fallback scores an unboxed,
    often truncated answer by its last number). The equivalence check is ``math_verify``'s."""
    def boxed_only(text: str, parse: Any, cfg: list, ptime: Any) -> Any:
        box = last_boxed(text)
        return parse(f"$\\boxed{{{box}}}$", extraction_config=cfg, parsing_timeout=ptime) if box else None

    return _score_math("math_boxed", prompts, completions, solution, answer, boxed_only)


def _score_math(name: str, prompts: Sequence[Any], completions: Sequence[Any], solution: Sequence[Any] | None,
                answer: Sequence[Any] | None, predict: Callable) -> list[float | None]:
    """The math verifiers' loop: the reference parsed once per row, the completion's answer by ``predict``
    (``(text, parse, extraction config, timeout) -> parsed or None``), math-verify's equivalence check."""
    _, _, _, parse, verify = _math_verify()
    refs = _references(prompts, completions, solution, answer, name)
    ptime, vtime = _timeouts()
    cfg = _prediction_config()
    out: list[float | None] = []
    for comp, ref in zip(completions, refs):
        gold = parse(reference_text(ref), parsing_timeout=ptime)
        if not gold:
            out.append(None)
            continue
        pred = predict(_text(comp), parse, cfg, ptime)
        out.append(float(verify(gold, pred, timeout_seconds=vtime)) if pred else 0.0)
    return out


def _prediction_config() -> list:
    """math-verify's extraction of a completion's answer: LaTeX (a ``\\boxed{}`` first), then any expression."""
    norm_cfg, expr_cfg, latex_cfg, _, _ = _math_verify()
    return [latex_cfg(normalization_config=norm_cfg(units=True), boxed_match_priority=0), expr_cfg()]


def _timeouts() -> tuple[int | None, int | None]:
    """math_verify's parse and verify timeouts: they use signal.alarm, so only on the main thread."""
    main = threading.current_thread() is threading.main_thread()
    return (10, 5) if main else (None, None)


def math_reward(prompts: Sequence[Any], completions: Sequence[Any], solution: Sequence[Any] | None = None,
                answer: Sequence[Any] | None = None, **kwargs: Any) -> list[float | None]:
    """1.0 where the completion's final answer equals the reference, 0.0 where not, None where the
    reference cannot be parsed (skipped, as TRL's ``accuracy_reward``).

    The reference comes from the ``solution`` column (MATH style, LaTeX such as ``\\frac{1}{3}``) or,
    without it, ``answer`` (GSM8K style, ``... #### 72``). Parsing and the equivalence check are
    ``math_verify``'s: the completion's answer is taken from a ``\\boxed{}`` first, then (the fallback)
    from the last LaTeX or plain expression of the text (``The answer is 72``; ``... 7 - 2 = 5`` gives 5).
    """
    return _score_math("math", prompts, completions, solution, answer, _first_match)


def _first_match(text: str, parse: Any, cfg: list, ptime: Any) -> Any:
    """The ``math`` verifier's reading of a completion: math-verify's first match (a ``\\boxed{}`` first, then
    the fallback), ``[expression, extracted text]`` or ``[]``."""
    return parse(text, extraction_config=cfg, extraction_mode="first_match", parsing_timeout=ptime)


def math_answer(text: str) -> str | None:
    """The final answer the ``math`` verifier scores in ``text`` (the text math-verify extracted: a
    ``\\boxed{}``'s, else the fallback's expression), None where it finds none (the answer scores 0)."""
    _, _, _, parse, _ = _math_verify()
    pred = _first_match(text, parse, _prediction_config(), _timeouts()[0])
    if not pred:
        return None
    return pred[-1] if isinstance(pred[-1], str) else str(pred[0])


def fallback_extracts(text: str) -> bool:
    """Whether the ``math`` verifier's fallback takes an answer from ``text`` (no ``\\boxed{}`` needed)."""
    return math_answer(text) is not None


def _load_function(spec: str) -> RewardFunction:
    mod_name, _, fn_name = spec.rpartition(":")
    if not mod_name or not fn_name:
        raise GmtsError(f"--verifier {spec}: expected NAME or module:function")
    if mod_name.endswith(".py"):
        path = Path(mod_name)
        if not path.is_file():
            raise GmtsError(f"--verifier {spec}: no such file {path}")
        ispec = importlib.util.spec_from_file_location(f"gmts_user_verifier_{path.stem}", path)
        module = importlib.util.module_from_spec(ispec)
        try:
            ispec.loader.exec_module(module)
        except Exception as e:
            raise GmtsError(f"--verifier {spec}: {path} failed to import ({type(e).__name__}: {e})") from None
    else:
        try:
            module = importlib.import_module(mod_name)
        except Exception as e:
            raise GmtsError(f"--verifier {spec}: cannot import module '{mod_name}' ({type(e).__name__}: {e})") from None
    fn = getattr(module, fn_name, None)
    if fn is None:
        raise GmtsError(f"--verifier {spec}: module '{mod_name}' has no '{fn_name}'")
    if not callable(fn):
        raise GmtsError(f"--verifier {spec}: '{fn_name}' is not callable")
    return fn


def resolve_verifier(name: str | None) -> RewardFunction | None:
    """The reward function named by ``--verifier`` (None when no name is given); see the module docstring."""
    if not name:
        return None
    if ":" in name:
        return _load_function(name)
    if name == "math":
        return math_reward
    if name == "math_boxed":
        return math_boxed_reward
    if name == "domain":
        return toy_reward
    if name not in REWARD_FUNCTIONS:
        raise GmtsError(f"--verifier: unknown verifier '{name}' (choose from {', '.join(BUILTIN)}, "
                        "or module:function)")
    return REWARD_FUNCTIONS[name]


def verifier_name(verifier: RewardFunction) -> str:
    """The name a run records for ``verifier``: a built-in's ``--verifier`` name, else ``module:function``."""
    if verifier is math_reward:
        return "math"
    if verifier is math_boxed_reward:
        return "math_boxed"
    if verifier is toy_reward:
        return "domain"
    for name, fn in REWARD_FUNCTIONS.items():
        if fn is verifier:
            return name
    return f"{getattr(verifier, '__module__', '?')}:{getattr(verifier, '__qualname__', repr(verifier))}"


def score(verifier: RewardFunction, prompts: Sequence[Any], completions: Sequence[Any],
          completion_ids: Sequence[Sequence[int]], columns: dict[str, Sequence[Any]] | None = None) -> list[float]:
    """Call ``verifier`` as TRL does and return one float per row, NaN where it returned None (skipped).

    ``columns``: the other columns, one list per name, each as long as ``prompts``. When the prompts are
    lists of messages (conversational), each text completion is passed as ``[{"role": "assistant",
    "content": text}]``, as TRL 1.16 passes it. A wrong count,
    a non-number or an exception is a :class:`GmtsError` naming the verifier.
    """
    name = getattr(verifier, "__name__", "verifier")
    completions = list(completions)
    if prompts and isinstance(prompts[0], (list, tuple)):
        # conversational rows: TRL hands each completion over as one assistant message
        completions = [[{"role": "assistant", "content": c}] if isinstance(c, str) else c for c in completions]
    try:
        out = verifier(prompts=list(prompts), completions=completions, completion_ids=list(completion_ids),
                       **(columns or {}))
    except GmtsError:
        raise
    except Exception as e:
        raise GmtsError(f"--verifier {name}: the reward function failed ({type(e).__name__}: {str(e)[:160]})") from None
    out = list(out)
    if len(out) != len(prompts):
        raise GmtsError(f"--verifier {name}: returned {len(out)} rewards for {len(prompts)} completions")
    vals = []
    for i, v in enumerate(out):
        if v is None:
            vals.append(math.nan)
            continue
        try:
            vals.append(float(v))
        except (TypeError, ValueError):
            raise GmtsError(f"--verifier {name}: row {i}: reward {v!r} is not a number or None") from None
    return vals
