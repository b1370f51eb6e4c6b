"""Run records of TRL training runs, in the format ``gmts rl-report`` reads (docs/studies/referee.md section 7).

A toy run of ``gmts rl`` writes its record itself (:mod:`gmts_analysis.rl.experiment`). A TRL run leaves its
per-step metrics in ``trainer_state.json``; :func:`trl_run_record` turns them, and the held-out evaluations of
its checkpoints, into the same record, so that one tool reports the toy and the real studies:

- ``config``: the plan's fields (``selection``, ``seed``, ``steps``, ``domains`` = ``["word"]``, ``rho``, ``scope``,
  ``group_size``, ``dynamic_sampling`` false, ``lr``, ...) and ``trainer: "trl"``; ``selection_cutoff``
  (``top_k`` | ``quantile``, :class:`~gmts_analysis.integrations.trl.config.SelectiveGRPOConfig`) when the run
  logged which cut-off its selection used (``gmts/selection/cutoff_quantile`` or the diagnostics'
  ``gmts/cutoff_quantile``; runs from before that field record none, as before);
- ``steps``: one entry per optimizer step from TRL's ``log_history``: ``reward_mean`` (TRL ``reward``),
  ``frac_groups_zero_std`` (``frac_reward_zero_std``), ``frac_tokens_zero_adv`` and ``frac_selected_zero_adv``
  (the drop-in's ``gmts/...`` metrics: the mechanism's zero-advantage shares and the selection's waste),
  ``loss``, ``grad_norm``, ``entropy_mean``, ``response_len_mean``, ``clipped_ratio``, ``frac_selected``,
  ``overlap_entropy``, ``step_s``;
- ``evals``: ``[{step, pass1: {word: p}, pass1_mean, n, ci_low, ci_high, se}]`` on the held-out problems
  (``n_unscorable`` where the verifier could not score some answers: pass@1 is over the others; a step with
  none scored is refused, not recorded), with
  the answers' ``boxed_share``, ``truncated_share``, ``modal_answer``, ``modal_answer_share`` (one final answer
  given to many problems: a constant-answer collapse), ``modal_solution_share`` and ``mean_answer_tokens``;
- ``final_pass1``: ``{word: p}`` of the last evaluation, ``final_eval_prompts`` (its problems) and
  ``final_eval_answers`` (its answers: problems x answers per problem);
- ``timing_s``: ``train`` (TRL's ``train_runtime``, summed over resumed segments when given), ``eval``, ``total``.
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Any

from gmts_analysis.errors import GmtsError
from gmts_analysis.readers.trl_output import read_trl_output, trainer_log
from gmts_analysis.rl.config import record_versions

#: TRL log_history keys -> run record step keys
STEP_KEYS = {
    "reward": "reward_mean", "frac_reward_zero_std": "frac_groups_zero_std",
    "gmts/frac_tokens_zero_adv": "frac_tokens_zero_adv",
    "gmts/selection/frac_selected_zero_adv": "frac_selected_zero_adv", "loss": "loss", "grad_norm": "grad_norm",
    "entropy": "entropy_mean", "completions/mean_length": "response_len_mean",
    "completions/clipped_ratio": "clipped_ratio", "gmts/selection/frac_selected": "frac_selected",
    "gmts/selection/overlap_entropy": "overlap_entropy", "step_time": "step_s", "learning_rate": "learning_rate",
}
DOMAIN = "word"


def _num(v: Any) -> float | None:
    try:
        x = float(v)
    except (TypeError, ValueError):
        return None
    return x if math.isfinite(x) else None


def trl_steps(log_history: list[dict]) -> list[dict]:
    """The per-step entries of a TRL ``log_history`` (those with a ``reward``), as run record steps."""
    out = []
    for h in log_history:
        if "reward" not in h or "step" not in h:
            continue
        e: dict[str, Any] = {"step": int(h["step"])}
        for k, name in STEP_KEYS.items():
            if k in h and _num(h[k]) is not None:
                e[name] = _num(h[k])
        out.append(e)
    return out


#: logged flags saying the quantile cut-off ran (1) or the exact top_k (0): the drop-in's and the diagnostics'
CUTOFF_KEYS = ("gmts/selection/cutoff_quantile", "gmts/cutoff_quantile")


def logged_cutoff(log_history: list[dict], where: str = "the run") -> str | None:
    """``"quantile"`` or ``"top_k"``: the selection cut-off a TRL run logged (:data:`CUTOFF_KEYS`), ``None``
    when it logged none (the keep-all arm, or a run from before the flag). A run that logged both is refused."""
    seen = {_num(h[k]) for h in log_history for k in CUTOFF_KEYS if k in h}
    if not seen:
        return None
    if seen == {1.0}:
        return "quantile"
    if seen == {0.0}:
        return "top_k"
    raise GmtsError(f"{where}: its log says both selection cut-offs ran ({', '.join(CUTOFF_KEYS)}: {sorted(seen)})")


def record_config(config: dict, log_history: list[dict], where: str = "the run") -> dict:
    """The record's ``config``: the plan's fields, ``domains``, ``trainer: "trl"`` and the ``selection_cutoff``
    the run logged (:func:`logged_cutoff`; one the plan states must agree with it)."""
    out = {**config, "domains": [DOMAIN], "trainer": "trl"}
    cutoff = logged_cutoff(log_history, where)
    if cutoff is not None:
        if config.get("selection_cutoff", cutoff) != cutoff:
            raise GmtsError(f"{where}: the plan says selection_cutoff={config['selection_cutoff']!r}, "
                            f"the run logged {cutoff!r}")
        out["selection_cutoff"] = cutoff
    return out


def eval_entry(step: int, ev: dict) -> dict:
    """An ``evals`` entry from :func:`gmts_analysis.run.heldout.evaluate_pass1`'s result. pass@1 is over the
    answers the verifier scored: where some were not, ``n_unscorable`` says how many of ``n`` (absent: none);
    where none were, the step is refused (:class:`GmtsError` naming it): a record's pass@1 is a number, which
    ``gmts rl-report`` checks, never a null or a 0.0 standing in for "not scored"."""
    if ev.get("pass1") is None:
        raise GmtsError(f"step {step}: no held-out pass@1 to record ({ev.get('pass1_refused') or 'none given'}); "
                        "give the held-out problems a solution the verifier can score (the answer as text or a "
                        "number, e.g. \"12\"), then evaluate the step again")
    unscorable = {"n_unscorable": ev["n_unscorable"]} if ev.get("n_unscorable") else {}
    return {"step": int(step), "pass1": {DOMAIN: ev["pass1"]}, "pass1_mean": ev["pass1"], "n": ev["n_answers"],
            **unscorable,
            "n_prompts": ev.get("n_prompts", ev["n_answers"]),
            "ci_low": ev["ci_low"], "ci_high": ev["ci_high"], "se": ev["se"],
            "boxed_share": ev.get("boxed_share"), "truncated_share": ev.get("truncated_share"),
            "modal_answer": ev.get("modal_answer"), "modal_answer_share": ev.get("modal_answer_share"),
            "modal_solution_share": ev.get("modal_solution_share"), "mean_answer_tokens": ev.get("mean_answer_tokens")}


def trl_run_record(output_dir: str | Path, config: dict, evals: dict[int, dict], timing: dict | None = None) -> dict:
    """The run record (module docstring) of the TRL output directory ``output_dir``: its steps from the newest
    checkpoint's ``trainer_state.json``, ``evals`` ``{step: evaluate_pass1 result}`` (the last is the final
    pass@1), ``config`` the plan's fields of this run."""
    out = read_trl_output(output_dir, base=None)
    newest = out.checkpoints[-1][1]
    log = trainer_log(newest)
    steps = trl_steps(log)
    if not evals:
        raise GmtsError(f"{output_dir}: no held-out evaluation to record")
    if config.get("steps") is not None and steps and steps[-1]["step"] != int(config["steps"]):
        raise GmtsError(f"{output_dir}: trained {steps[-1]['step']} steps, the plan says {config['steps']}")
    ev = [eval_entry(s, evals[s]) for s in sorted(evals)]
    final = ev[-1]
    return {
        "config": record_config(config, log, str(output_dir)),
        "steps": steps,
        "evals": ev,
        "final_pass1": dict(final["pass1"]),
        "final_eval_prompts": final["n_prompts"], "final_eval_answers": final["n"],
        "timing_s": dict(timing or {}),
        "versions": _versions(),
    }


def _versions() -> dict[str, str]:
    out = record_versions()
    try:
        import trl

        out["trl"] = trl.__version__
    except ImportError:  # pragma: no cover
        pass
    return out
