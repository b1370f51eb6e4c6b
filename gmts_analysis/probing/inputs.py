"""A probe's inputs, prepared once for the Python API (:func:`gmts_analysis.api.probe`) and the job
(:mod:`gmts_analysis.run.sharding.run`, ``gmts probe``/``gmts run``/``gmts merge``).

:func:`prepare_inputs` turns a model (a name or a loaded causal LM) and rollouts (a path, a DataFrame
or row dicts) into what the kernel needs: the model and tokenizer, the answers read with the options'
reader settings and checked against the model's vocabulary and context, the unterminated marks of
``--mask-truncated-completions``, the per-answer advantages and aggregation weights, and the
manifest's notes of the input (:meth:`ProbeInputs.manifest_notes`).

It takes the probe's settings as the callers made them at their entry, checked and split into parts
(:meth:`gmts_analysis.probing.settings.ProbeSettings.of`, before any model is loaded), and reads only their
parts; the pre-flight checks (:mod:`gmts_analysis.probing.preflight`) come after.
"""

from __future__ import annotations

import dataclasses
import logging
import os
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from gmts_analysis.errors import GmtsError
from gmts_analysis.probing.validate import check_answers
from gmts_analysis.readers import models
from gmts_analysis.readers.models import context_length
from gmts_analysis.readers.rollouts import ReaderOptions, read_rollouts, read_rollouts_rows, validate_against_model
from gmts_analysis.readers.sources import input_sha256
from gmts_analysis.readers.verifiers import resolve_verifier

if TYPE_CHECKING:
    import torch

    from gmts_analysis.probing.kernel import AnswerCoefficients
    from gmts_analysis.probing.settings import ProbeSettings
    from gmts_analysis.readers.rollouts import Answer


@dataclass
class ProbeInputs:
    """Everything a probe reads, prepared (:func:`prepare_inputs`)."""

    model: Any  #: the causal LM, as loaded (or as given: never moved or cast)
    tokenizer: Any  #: its tokenizer, or None (ids-only rollouts)
    model_path: str  #: the resolved path or hub id; ``<in-memory model>`` when a loaded model names none
    settings: "ProbeSettings"  #: the probe's settings; for a loaded model with its ``device`` and ``dtype`` filled in
    answers: list["Answer"]  #: in input order (a :class:`~gmts_analysis.readers.rollouts.Rollouts` list)
    coefs: list["AnswerCoefficients"]  #: advantage and loss weight of each answer, from the whole batch
    n_cut: int  #: answers ``--truncate`` cut to the model's context
    source: dict  #: the manifest's ``rollouts`` note (path, sha256, format, read report; or the in-memory kind)
    load_s: float  #: seconds spent loading the model (0 for a loaded model)

    def truncation_counts(self) -> dict[str, int | None]:
        """The manifest's two truncation counts (:func:`truncation_counts`)."""
        return truncation_counts(self.settings.kernel.mask_truncated_completions, self.answers, self.n_cut)


def truncation_counts(masked: bool, answers: Sequence[Any], n_cut: int) -> dict[str, int | None]:
    """The manifest's two truncation counts, which are different things:

    ``n_cut_by_truncate``: answers that ``--truncate`` cut to fit the model's context (0 without it);
    ``n_unterminated``: answers whose response does not end with a stop token (EOS or pad), TRL's
    "truncated completions" (they hit the trainer's length limit); counted with
    ``--mask-truncated-completions`` (``masked``; it gives them loss weight 0), else None (not checked).
    """
    n_open = None
    if masked:
        n_open = sum(bool(a.extra.get("unterminated")) for a in answers)
    return {"n_cut_by_truncate": int(n_cut), "n_unterminated": n_open}


def _dtype_name(model: "torch.nn.Module") -> str:
    """The ``--dtype`` name of a loaded model's parameters (refused when the probe has none for it)."""
    dt = next(model.parameters()).dtype
    names = {v: k for k, v in models.DTYPES.items()}
    if dt not in names:
        raise GmtsError(f"model dtype {dt} is not supported (use one of {', '.join(models.DTYPE_NAMES)})")
    return names[dt]


def resolve_model(model: Any, tokenizer: Any, settings: "ProbeSettings", given: dict | None = None,
                  offline: bool = False, device: str | None = None) -> tuple[Any, Any, str, "ProbeSettings"]:
    """``(model, tokenizer, model_path, settings)``: load a name on ``device`` (default ``settings.device``)
    in ``settings.dtype``, or take a loaded model as it is (its device and dtype; never moved or cast:
    the ``device``/``dtype`` options named in ``given``, the caller's keywords, must then agree).
    ``tokenizer``, when given, replaces the checkpoint's."""
    import torch

    given = given or {}
    if isinstance(model, (str, os.PathLike)):
        name = os.fspath(model)
        m, tok = models.load_model(name, settings.device if device is None else device, settings.dtype,
                                   offline=offline)
        # the manifest records the model as the user named it (a shipped name, a path as given, a hub id),
        # never the absolute path it resolved to on the machine that made the run
        return m, tokenizer if tokenizer is not None else tok, name, settings
    if not isinstance(model, torch.nn.Module) or not hasattr(model, "get_input_embeddings"):
        raise GmtsError(f"model: expected a path, a .gguf file, a hub id, tiny|small|smollm2 or a loaded causal LM, got {type(model).__name__}")
    dev = next(model.parameters()).device
    want = models.resolve_device(given["device"]) if given.get("device", "auto") != "auto" else dev
    if (want.type, want.index or 0) != (dev.type, dev.index or 0):
        raise GmtsError(f"option device={given['device']!r}: the model is on {dev} (move it yourself; the "
                        "probe never moves a loaded model)")
    dtype = _dtype_name(model)
    if "dtype" in given and given["dtype"] != dtype:
        raise GmtsError(f"option dtype={given['dtype']!r}: the model is in {dtype} (cast it yourself)")
    path = str(getattr(model, "name_or_path", "") or getattr(model.config, "_name_or_path", "") or "")
    if tokenizer is None and path and Path(path).exists():
        try:
            from transformers import AutoTokenizer

            tokenizer = AutoTokenizer.from_pretrained(path, local_files_only=True)
        except (OSError, ValueError, TypeError):
            tokenizer = None
    return model, tokenizer, path or "<in-memory model>", settings.on_model(str(dev), dtype)


def read_answers(rollouts: Any, tokenizer: Any, settings: "ProbeSettings", max_tokens: int | None = None,
                 rollouts_sha256: str | None = None) -> tuple[list, dict]:
    """``(answers, note)``: rollouts (a path, a DataFrame or a list of row dicts) as answers, read with
    ``settings.reader`` (``max_tokens``: the model's context) and ``settings.verifier``, and the manifest's note of the
    source. A path's note names it as given (``str(rollouts)``) with its sha256 (``rollouts_sha256``
    when the caller has it already, else computed here)."""
    reader = dataclasses.replace(settings.reader, max_tokens=max_tokens)
    verifier = resolve_verifier(settings.verifier)
    answers, note = _read(rollouts, tokenizer, verifier, reader, rollouts_sha256)
    check_sampling_temperature(answers, settings.kernel.temperature)
    return answers, note


def check_sampling_temperature(answers: Sequence, temperature: float) -> int:
    """Warn when answers record the temperature they were sampled at (``gmts sample`` writes it) and it is
    not the probe's: TRL computes the loss's log-probs from ``logits / temperature`` with the sampling
    temperature, so a probe at another one measures another policy. Returns the answers that differ."""
    import math

    seen = [a.extra.get("temperature") for a in answers]
    other = sorted({float(t) for t in seen if isinstance(t, (int, float)) and not isinstance(t, bool)
                    and math.isfinite(t) and abs(float(t) - temperature) > 1e-12})
    n = sum(1 for t in seen if isinstance(t, (int, float)) and not isinstance(t, bool)
            and abs(float(t) - temperature) > 1e-12)
    if n:
        logging.getLogger("gmts_analysis.probing").warning(
            "%d answer(s) were sampled at temperature %s (their 'temperature' field) but --temperature is %g: the "
            "probe takes log-probs of logits / %g, TRL those of logits / the sampling temperature; pass "
            "--temperature %g to probe the policy that sampled them", n, ", ".join(f"{t:g}" for t in other),
            temperature, temperature, other[0])
    return n


def _read(rollouts: Any, tokenizer: Any, verifier: Any, reader: ReaderOptions,
          rollouts_sha256: str | None) -> tuple[list, dict]:
    if isinstance(rollouts, (str, os.PathLike)):
        p = Path(rollouts)
        answers = read_rollouts(p, tokenizer, reader.format, verifier, options=reader)
        sha = rollouts_sha256 if rollouts_sha256 is not None else input_sha256(p)
        return answers, {"path": os.fspath(rollouts), "sha256": sha, "format": reader.format,
                         "read": getattr(answers, "report", None)}
    if hasattr(rollouts, "to_dict") and hasattr(rollouts, "columns"):
        rows, kind = rollouts.to_dict(orient="records"), "DataFrame"
    elif isinstance(rollouts, Sequence) and not isinstance(rollouts, (str, bytes)):
        rows, kind = list(rollouts), "rows"
    else:
        raise GmtsError(f"rollouts: expected a path, a DataFrame or a list of row dicts, got {type(rollouts).__name__}")
    answers = read_rollouts_rows(rows, tokenizer, verifier, where=f"rollouts ({kind})", fmt=reader.format,
                                 options=reader)
    return answers, {"in_memory": kind, "n_rows": len(rows), "format": reader.format,
                     "read": getattr(answers, "report", None)}


def prepare_inputs(model: Any, rollouts: Any, settings: "ProbeSettings", *, tokenizer: Any = None,
                   given: dict | None = None, offline: bool = False, device: str | None = None,
                   rollouts_sha256: str | None = None, log: logging.Logger | None = None) -> ProbeInputs:
    """Load (or take) the model, read and check the answers, mark unterminated answers, and compute
    every answer's coefficients: the one preparation of ``gmts probe`` and ``gmts.probe``.

    model: a name (path, hub id, ``tiny``/``small``/``smollm2``) loaded on ``device`` (default
    ``settings.device``; never downloaded when ``offline``), or a loaded causal LM kept as it is
    (:func:`resolve_model`; ``given`` holds the caller's option keywords). rollouts: a path, a
    DataFrame or a list of row dicts (:func:`read_answers`). log: where the job reports the
    answers ``--truncate`` cut and those without a stop token (nothing is logged without it).
    Raises :class:`GmtsError` for a model or answers that cannot be probed.
    """
    from gmts_analysis.probing import kernel  # deferred: torch, pandas

    t0 = time.perf_counter()
    name = os.fspath(model) if isinstance(model, (str, os.PathLike)) else None
    model, tokenizer, model_path, settings = resolve_model(model, tokenizer, settings, given, offline, device)
    load_s = 0.0 if name is None else time.perf_counter() - t0
    context = context_length(model)
    answers, source = read_answers(rollouts, tokenizer, settings, context, rollouts_sha256)
    check_answers(answers, model_path if name is None else name)  # the model as the caller named it
    vocab = model.get_input_embeddings().weight.shape[0]
    n_cut = validate_against_model(answers, vocab, context, settings.reader.truncate)
    if n_cut and log is not None:
        log.warning("%d answer(s) truncated to the model's context", n_cut)
    if settings.kernel.mask_truncated_completions:  # the manifest counts them (truncation_counts)
        n_open = kernel.mark_unterminated(answers, tokenizer, model)
        if log is not None:
            log.info("--mask-truncated-completions: %d of %d answers end without a stop token (loss weight 0)",
                     n_open, len(answers))
    coefs = kernel.answer_coefficients(answers, settings.kernel)
    return ProbeInputs(model=model, tokenizer=tokenizer, model_path=model_path, settings=settings, answers=answers,
                       coefs=coefs, n_cut=n_cut, source=source, load_s=load_s)
