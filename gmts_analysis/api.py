"""The Python API (docs/definitions.md section 10): one call, one result object.

    import gmts_analysis as gmts
    run = gmts.probe("tiny", "rollouts.jsonl", grad_norm="exact")   # or a loaded model + tokenizer=
    run.tokens, run.answers, run.stats, run.manifest                 # tables and dicts, in memory
    run.figure("within_vs_cross"); run.report()                      # drawn in memory
    run.save("runs/mine")                                            # a complete run directory
    gmts.load_run("runs/mine")                                       # the same object back

``options`` are the ``gmts probe`` flags in snake_case (:class:`gmts_analysis.options.config.ProbeOptions`);
of the job settings, :func:`probe` takes those that mean something in one process
(:data:`PROBE_SETTINGS`: ``quiet``, ``offline``, ``out`` to save as well); resuming a killed
job is the CLI's (``gmts probe``, ``gmts run``).
:func:`probe` prepares its inputs, runs the kernel and computes the statistics as ``gmts probe`` does
(:mod:`gmts_analysis.probing.inputs`, :mod:`gmts_analysis.probing.kernel`, :mod:`gmts_analysis.run.finalize`),
in one process, without files.
"""

from __future__ import annotations

import dataclasses
import os
from pathlib import Path
from typing import TYPE_CHECKING, Any, Sequence

from gmts_analysis.analysis.runs import RunTables, read_run
from gmts_analysis.errors import GmtsError
from gmts_analysis.options import ALIAS_BY_NAME, TRL_NAMES
from gmts_analysis.options.config import ProbeConfig, ProbeOptions, options_from_kwargs
from gmts_analysis.probing.inputs import prepare_inputs
from gmts_analysis.sampling.domains import ALL_DOMAINS, DEFAULT_DOMAINS, WORD_DOMAIN, sample_rows, sampling_options  # noqa: F401 - the sampling worlds' names
from gmts_analysis.util.io import atomic_write_text
from gmts_analysis.util.progress import bars_off
from gmts_analysis.util.threads import api_threads

if TYPE_CHECKING:
    from matplotlib.figure import Figure

    from gmts_analysis.views.notebook_view import TokenView

#: ``gmts probe`` job settings that :func:`probe` also takes (see its docstring)
PROBE_SETTINGS = ("quiet", "offline", "out", "overwrite", "figures", "strict", "answers_per_chunk")


class Run(RunTables):
    """A probe's result: ``tokens``, ``answers``, ``stats``, ``manifest`` (and ``grad_groups``).

    Built by :func:`probe` (in memory, ``path`` None) or :func:`load_run` (from a directory).

    Attributes:
        tokens: one row per response token (pandas DataFrame; columns in docs/definitions.md section 2):
            ``entropy`` (nats), ``logprob``, ``prob``, ``grad_norm_logp`` (exact norm of d logprob / d theta
            over all parameters), ``omega``, ``grad_norm`` = ``|omega| * grad_norm_logp``, ``gmts``, the scores.
        answers: one row per answer (DataFrame): ``reward``, ``advantage``, length, texts.
        stats: the ``stats.json`` dict (correlations with 95% bootstrap CIs, selections, paired differences).
        manifest: the ``manifest.json`` dict (configuration, model, versions, device, timings, seed).
        path: the run directory (``None`` until saved).
    """

    def save(self, path: str | os.PathLike, *, figures: bool = True, overwrite: bool = False) -> Path:
        """Write a complete run directory, atomically (docs/definitions.md section 8).

        Args:
            path: the directory to write; a non-empty one is refused unless ``overwrite``.
            figures: also write ``figures/`` (PNG and PDF) and ``report.html``.
            overwrite: replace the files of an existing run directory.

        Returns:
            The directory written (also stored as ``run.path``).
        """
        from gmts_analysis.run.finalize import write_run_dir  # deferred: torch, pandas

        out = write_run_dir(self, path, figures=figures, overwrite=overwrite)
        self.path = out
        return out

    def rescore(self, *, verifier: str | None = None, rewards: str | os.PathLike | None = None,
                mask_truncated_completions: bool = False, seed: int = 0, n_boot: int | None = None) -> "Run":
        """A new run with other rewards, without probing again (no model): from ``verifier`` (a name:
        ``math_boxed``, ``math``, a toy domain, ``module:function``) or the file ``rewards`` (JSONL or CSV of
        ``answer_id``, ``reward``), and/or the truncated answers masked. Advantages, omega, ``grad_norm``, the
        scores and every statistic are recomputed; ``stats["meta"]["rescored_from"]`` names the source.
        The same as ``gmts stats RUN --verifier/--rewards/--mask-truncated-completions --out NEW``.

        Args:
            verifier: a verifier name (``math_boxed``, ``math``, a toy domain) or ``module:function``.
            rewards: a JSONL or CSV file of ``answer_id``, ``reward`` (one reward per answer).
            mask_truncated_completions: give the answers cut at the completion budget a zero loss weight.
            seed: the bootstrap's seed.
            n_boot: bootstrap resamples of the groups (default: the run's).

        Returns:
            A new, unsaved :class:`Run`; this one is unchanged.
        """
        from gmts_analysis.run.rescore import rescore  # deferred: pandas

        new = rescore(self, verifier=verifier, rewards=rewards, mask_truncated_completions=mask_truncated_completions,
                      seed=seed, n_boot=n_boot)
        return Run(tokens=new.tokens, answers=new.answers, stats=new.stats, manifest=new.manifest,
                   grad_groups=new.grad_groups)

    def figure(self, name: str) -> "Figure | None":
        """One figure, drawn in memory.

        Args:
            name: a figure's name (:func:`figure_names`, e.g. ``within_vs_cross``, ``mass_capture``).

        Returns:
            A matplotlib ``Figure``, or ``None`` when the run lacks its data (e.g. no gradient norms).
        """
        from gmts_analysis.views.figures import FIGURES  # deferred: matplotlib, pandas

        if name not in FIGURES:
            raise GmtsError(f"unknown figure '{name}' (choose from {', '.join(FIGURES)})")
        return FIGURES[name](self)

    def figures(self, to: str | os.PathLike | None = None) -> list[Path]:
        """Write every figure as PNG and PDF.

        Args:
            to: the directory (default: ``<path>/figures`` of a saved run; an unsaved run needs one).

        Returns:
            The files written.
        """
        from gmts_analysis.views.figures import render_all  # deferred: matplotlib, pandas

        if to is None and self.path is None:
            raise GmtsError("Run.figures: give a directory (this run is not saved; or call run.save(path))")
        return render_all(self, to)

    def report(self, path: str | os.PathLike | None = None) -> str | Path:
        """The self-contained HTML report (token-level audit, figures inlined).

        Args:
            path: where to write it; ``None`` returns the HTML instead.

        Returns:
            The HTML text, or the path written.
        """
        from gmts_analysis.views.report import render_report  # deferred: pandas

        html = render_report(self)
        if path is None:
            return html
        return atomic_write_text(path, html)

    def show(self, n: int = 5, **kw: Any) -> "TokenView":
        """An inline token heatmap (renders in a notebook cell) of the answers where entropy and GMTS rank
        tokens most differently, with the report's hover values.

        Args:
            n: how many answers.
            **kw: those of :func:`gmts_analysis.views.notebook_view.render_tokens_html` (``rho``, the keep
                fraction in (0, 1], defaults to the run's).

        Returns:
            A ``TokenView`` (its ``html``; displays itself in Jupyter).
        """
        from gmts_analysis.views.notebook_view import show  # deferred: pandas

        return show(self, n, **kw)

    def _repr_html_(self) -> str:
        """Jupyter's rich display of a run: its size and the inline heatmap of the top 3 answers."""
        import html

        head = f"<div><b>{html.escape(repr(self))}</b></div>"  # repr escapes control and bidi characters
        return head + (self.show(3).html if len(self.tokens) else "")


def figure_names() -> list[str]:
    """Names accepted by :meth:`Run.figure`.

    Returns:
        The figure names, in the order the report draws them (one per entry of
        :data:`gmts_analysis.views.figures.FIGURE_ENTRIES`).
    """
    from gmts_analysis.views.figures import FIGURES  # deferred: matplotlib, pandas

    return list(FIGURES)


def load_run(path: str | os.PathLike) -> Run:
    """Read a run directory written by ``gmts probe``, ``gmts run`` or :meth:`Run.save`.

    Args:
        path: the run directory (``tokens.parquet``, ``answers.parquet``, ``stats.json``, ``manifest.json``).

    Returns:
        The :class:`Run`, with ``path`` set. Nothing in the directory runs code (no pickles are read).
    """
    t = read_run(path)
    return Run(**{f.name: getattr(t, f.name) for f in dataclasses.fields(RunTables)})


# ------------------------------------------------------------------------------------ probe


def probe(model: Any, rollouts: Any, *, tokenizer: Any = None, progress: bool = True,
          threads: int | str | None = "auto",
          **options: Any) -> Run:
    """Probe ``model`` on ``rollouts``: per-token entropy, log-probs, exact per-token gradient norms, scores and
    statistics, in one process; nothing is written unless ``out=`` is given.

    Of the job settings of ``gmts probe`` (:data:`PROBE_SETTINGS`): ``quiet`` turns the bars
    off, ``offline`` forbids hub downloads, ``out`` also saves the run there (with
    ``figures`` and ``overwrite`` as :meth:`Run.save`); ``strict=True`` raises a :class:`GmtsError`
    for an answer the exact engine refuses instead of sending it to the per-token loop (an answer
    that fails raises at once either way; out of memory is first retried with half the batch, as
    ``gmts probe`` does); ``answers_per_chunk`` changes nothing here (nothing is
    recorded in chunks). TRL/verl names (``loss_type``, ``epsilon``, ``beta``, ``top_entropy_quantile``, ...)
    are accepted and recorded in ``manifest["aliases"]``; an error names an option as the keyword it is here
    (``max_completion_length=``), not as a flag.

    Args:
        model: a local directory, a hub id (see :func:`gmts_analysis.readers.models.load_model`), a ``.gguf``
            file, ``tiny``/``small``/``smollm2``, or a loaded causal LM (``torch.nn.Module``; pass
            ``tokenizer=`` for text rollouts; it stays on its device and dtype, in eval mode during the probe,
            its mode restored after).
        rollouts: a ``.jsonl``/``.parquet`` path, a DataFrame, or a list of row dicts, one per answer
            (docs/definitions.md section 7: ``prompt``/``prompt_ids``, ``response``/``response_ids``,
            ``reward``, optionally ``group_id``, ``old_logprobs``, ``ref_logprobs``).
        tokenizer: the tokenizer of a loaded ``model`` (a path or hub id model brings its own).
        progress: tqdm bars on stderr.
        threads: torch CPU threads: ``"auto"`` (default) picks them as the command line does
            (``GMTS_THREADS``, ``OMP_NUM_THREADS``, else the cores not already busy) for this call and
            restores torch's setting after; an int sets them (kept after); ``None`` leaves torch as it is.
        **options: the ``gmts probe`` flags in snake_case (:class:`gmts_analysis.options.config.ProbeOptions`),
            e.g. ``grad_norm="exact"|"sketch"`` (``probes=32``: the sketch's random probes),
            ``loss_agg="token-mean"``, ``advantage="group"``, ``temperature=1.0``, ``rho=0.2`` (the keep
            fraction of the selection statistics, in (0, 1]), ``device``, ``dtype``; an unknown name is refused
            with a :class:`GmtsError` naming it.

    Returns:
        The :class:`Run`: ``tokens`` (one row per response token), ``answers`` (one row per answer), ``stats``
        and ``manifest``.

    Raises:
        GmtsError: an unknown or invalid option, unreadable rollouts, a model that cannot be loaded (one line,
            naming the option as a keyword).
    """
    try:
        return _probe(model, rollouts, tokenizer, progress, threads, options)
    except GmtsError as e:
        raise type(e)(api_spelling(str(e))) from None


_WORDS = frozenset({"to", "or", "and", "for", "with", "is", "the", "a", "an", "on", "in", "of", "as", "when",
                    "must", "needs", "given", "instead", "alone", "too", "only", "also"})


def api_spelling(message: str) -> str:
    """``message`` with the ``--flags`` of probe options written as the API's keywords
    (``pass --max-completion-length`` -> ``pass max_completion_length=``, ``--kl-beta 0`` -> ``kl_beta=0``)."""
    import re

    fields = {f.name: f for f in dataclasses.fields(ProbeConfig)}
    names = set(fields) | set(PROBE_SETTINGS) | {"threads"}

    def sub(m: "re.Match[str]") -> str:
        name = m.group(1).replace("-", "_")
        if name not in names:
            return m.group(0)
        f = fields.get(name)
        if f is not None and f.type in (bool, "bool"):
            return f"{name}=True" + (m.group(2) or "")
        value, tail = m.group(3), ""
        if value is not None and len(value) > 1 and value[-1] in ":;,)":  # "--fidelity on:" -> "fidelity=on:"
            value, tail = value[:-1], value[-1]
        if value is None:  # "--num-generations: must be ..." names the option itself
            return name if m.string[m.end():m.end() + 1] == ":" else f"{name}="
        if re.fullmatch(r"[-+]?[0-9.eE]+|'[^']*'|[A-Za-z][\w.-]*", value) and (value not in _WORDS or tail):
            return f"{name}={value}{tail}"
        return f"{name}=" + m.group(2)

    return re.sub(r"(?<![\w-])--([a-z][a-z0-9_-]*)(\s(\S+))?", sub, message)


def _probe(model: Any, rollouts: Any, tokenizer: Any, progress: bool, threads: "int | str | None",
           options: dict[str, Any]) -> Run:
    options = dict(options)
    settings = {k: options.pop(k) for k in list(options) if k in PROBE_SETTINGS}
    progress = progress and not settings.get("quiet", False)
    names = {f.name for f in dataclasses.fields(ProbeOptions)}
    aliases = {k: ALIAS_BY_NAME[k].dest if k in ALIAS_BY_NAME else k for k in options
               if (k in ALIAS_BY_NAME and k not in names) or k in TRL_NAMES}
    opts = options_from_kwargs(options)
    with api_threads(threads), bars_off(not progress):
        return _probe_with(model, rollouts, tokenizer, progress, opts, options, settings, aliases)


def _probe_with(model: Any, rollouts: Any, tokenizer: Any, progress: bool, opts: ProbeOptions, options: dict[str, Any],
                settings: dict[str, Any], aliases: dict[str, str]) -> Run:
    from gmts_analysis.probing import kernel  # deferred: torch, pandas
    from gmts_analysis.probing.preflight import check_before_probe  # deferred: torch
    from gmts_analysis.probing.settings import ProbeSettings  # deferred: torch
    from gmts_analysis.run.finalize import result_tables  # deferred: torch, pandas
    from gmts_analysis.run.sharding.worker import probe_with_retry  # deferred: torch, pandas

    parts = ProbeSettings.of(opts, strict=bool(settings.get("strict", False)))  # checked once, split
    if isinstance(rollouts, (str, os.PathLike)):
        rollouts = Path(rollouts)  # the manifest names it as a path
    inputs = prepare_inputs(model, rollouts, parts, tokenizer=tokenizer, given=options,
                            offline=bool(settings.get("offline")))
    model, parts, answers = inputs.model, inputs.settings, inputs.answers
    record = dataclasses.replace(opts, device=parts.device, dtype=parts.dtype)  # a loaded model's own
    was_training = model.training
    model.eval()
    try:
        check_before_probe(parts.kernel.engine, model, answers, settings.get("out"))
        result = kernel.probe_answers(model, inputs.tokenizer, answers, parts.kernel, inputs.coefs,
                                      progress=progress, probe_one=probe_with_retry)
        tables = result_tables(record, parts, model, inputs.model_path, answers, result,
                               extra={"job": "gmts_analysis.probe", "rollouts": inputs.source, "aliases": aliases,
                                      **inputs.truncation_counts()})
    finally:
        model.train(was_training)
    run = Run(**{f.name: getattr(tables, f.name) for f in dataclasses.fields(RunTables)})
    if settings.get("out") is not None:
        run.save(settings["out"], figures=bool(settings.get("figures", True)),
                 overwrite=bool(settings.get("overwrite", False)))
    return run


# ----------------------------------------------------------------------------------- sample


def sample(model: Any = None, domains: str | Sequence[str] | None = None, *, tokenizer: Any = None,
           progress: bool = True, offline: bool = False, threads: int | str | None = "auto",
           **options: Any) -> list[dict]:
    """Sample ``num_generations`` answers to ``num_prompts`` held-out prompts of each domain, verified.

    Args:
        model: ``tiny``/``small`` (default ``small``), ``smollm2``, a directory, a GGUF file, a hub id (not
            downloaded when ``offline``), or a loaded model (with ``tokenizer=``).
        domains: names or one comma-separated string (default: the three toy domains ``arithmetic``,
            ``program``, ``logic``); ``word``: grade-school word problems asked through the chat template and
            scored by the ``math_boxed`` verifier (``verifier="math"`` adds its fallback;
            :mod:`gmts_analysis.sampling.wordproblems`; for real models).
        tokenizer: the tokenizer of a loaded ``model``.
        progress: tqdm bars on stderr.
        offline: never download a hub model.
        threads: as :func:`probe` (``"auto"``: the command line's choice for this call; an int: set and kept;
            ``None``: torch left alone).
        **options: the fields of :class:`gmts_analysis.options.config.SamplingOptions`, with the same defaults
            as ``gmts sample``: ``num_prompts`` 8, ``num_generations`` 8, ``temperature`` 1.0,
            ``max_completion_length`` the policy card's budget in tokens (96 without a card), ``seed`` 0,
            ``device`` auto; the older names ``group_size`` and ``max_new_tokens`` are accepted.

    Returns:
        Rollout rows (dicts; docs/definitions.md section 7), domain-major then prompt-major, ready for
        :func:`probe`; the same arguments give the same rows on one device.
    """
    opts = sampling_options(model, domains, options)
    with api_threads(threads), bars_off(not progress):
        return sample_rows(opts.model if model is None else model, opts, tokenizer=tokenizer, progress=progress,
                           offline=offline)


