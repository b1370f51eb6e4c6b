"""``gmts series OUTPUT_DIR``: audit a TRL training run across its checkpoints.

Reads a TRL output directory as TRL leaves it (``checkpoint-N`` folders by step, the base model as step 0, the
loss from the trainer's own arguments, read without unpickling anything: nothing in a run folder runs code),
samples each checkpoint's answers to a fixed set of held-out prompts (the same seed at every checkpoint), probes
them (``step-NNNNN/``: run directories without figures; ``gmts figures`` draws one), probes one fixed set of
answers with every checkpoint for the token view (``tokens/``), optionally each checkpoint on the batch it
generated in training (``--own-batches``), and writes ``compare/`` (``gmts compare`` of the series),
``series.json`` (pass@1 with its 95% CI, unscorable answers counted, the method that ran and why, seconds) and
figures of the trends. It says its estimated cost first. ``--out`` must be a new folder or a series of gmts
outside the run. Killed, the same command resumes.
"""

from __future__ import annotations

import argparse
from dataclasses import dataclass

from gmts_analysis.options import checks
from gmts_analysis.options.config import ExamplesHelpFormatter, RunControl, add_options
from gmts_analysis.options.fields import opt

EXAMPLES = """examples:
  gmts series runs/grpo-gmts --out runs/grpo-gmts-audit
  gmts series runs/grpo-gmts --base smollm2 --prompts heldout.jsonl --num-prompts 8 --steps 0,20,40
  gmts series runs/grpo-gmts --own-batches --grad-norm exact --threads 2"""


@dataclass
class SeriesOptions:
    """The flags of ``gmts series`` (the TRL output directory is positional)."""

    out: str = opt(None, "output directory (default: runs/series-YYYYmmdd-HHMMSS)", group="output", metavar="DIR",
                   check=checks.output_path)
    base: str = opt(None, "the base model, step 0 (default: the model the example script recorded; without "
                    "one the series starts at the first checkpoint)", group="inputs", metavar="MODEL",
                    check=checks.model)
    prompts: str = opt(None, "held-out prompts, JSONL with 'prompt' and 'solution' (default: the output "
                       "directory's problems_heldout.jsonl, written by examples/trl_grpo_word_problems.py)",
                       group="inputs", metavar="FILE", check=checks.input_file)
    num_prompts: int = opt(16, "held-out prompts used (the first N)", group="inputs", metavar="PROMPTS",
                           check=checks.int_at_least(1))
    num_generations: int = opt(4, "answers per prompt at every checkpoint", group="inputs", metavar="G",
                               check=checks.int_at_least(2, "a group needs a baseline"))
    temperature: float = opt(None, "sampling temperature (default: the trainer's)", group="RL objective",
                             metavar="TAU", check=checks.positive_finite)
    max_completion_length: int = opt(None, "generation budget (default: the trainer's)", group="inputs",
                                     metavar="TOKENS", check=checks.int_at_least(1))
    verifier: str = opt("math_boxed", "reward of the held-out answers", group="inputs", metavar="NAME",
                        check=checks.verifier)
    grad_norm: str = opt("auto", "exact | sketch | auto: the cheaper of the two for the answers' lengths (said "
                         "per checkpoint)", choices=("auto", "exact", "sketch"), group="gradient engine")
    probes: int = opt(16, "sketch directions K", group="gradient engine", metavar="K", check=checks.probes)
    exact_subset: int = opt(4, "where the sketch runs, also probe this many answers exactly and record the "
                            "agreement (0: none)", group="gradient engine", metavar="ANSWERS",
                            check=checks.int_at_least(0))
    own_batches: bool = opt(False, "also probe each checkpoint on the training batch it generated (the trainer's "
                            "rollouts_dir)", group="inputs")
    token_answers: int = opt(8, "answers of the first checkpoint probed by every checkpoint, for the token view "
                             "(0: none)", group="inputs", metavar="ANSWERS", check=checks.int_at_least(0))
    steps: str = opt(None, "only these steps: '0,20,40' or ranges '0-40'", group="inputs", metavar="STEPS",
                     check=checks.step_spec)
    seed: int = opt(0, "sampling seed (the same at every checkpoint) and the sketch's", group="run control",
                    metavar="INT", check=checks.seed)
    no_figures: bool = opt(False, "skip figures", group="output")
    overwrite: bool = opt(False, "redo the runs of an existing series of gmts (default: resume it, reusing its "
                          "finished samples and runs); someone else's folder is refused whatever this says",
                          group="output")
    truncate: bool = opt(False, "cut answers that do not fit the model's context instead of failing",
                         group="inputs")
    fidelity: str = opt("auto", "update fidelity of each checkpoint's probe (needs its gradients in memory): auto = "
                        "on under 100k tokens when they fit", choices=("auto", "on", "off"), group="output")


def register(subparsers: argparse._SubParsersAction) -> None:
    p = subparsers.add_parser(
        "series", help="audit a TRL training run across its checkpoints (sample, probe, compare, token view)",
        description=__doc__.split("\n\n", 1)[1], epilog=EXAMPLES, formatter_class=ExamplesHelpFormatter,
    )
    p.add_argument("output_dir", metavar="OUTPUT_DIR", help="a TRL output directory with checkpoint-N folders")
    add_options(p, SeriesOptions, RunControl, skip=("offline",))
    p.set_defaults(func=run)


def run(args: argparse.Namespace) -> int:
    import logging

    from gmts_analysis.run.trl_series import SeriesSettings, audit_series

    if args.out is None:
        from gmts_analysis.options.config import default_out

        args.out = default_out("series")
    if args.threads:
        import torch

        torch.set_num_threads(int(args.threads))
    s = SeriesSettings(output_dir=args.output_dir, out=args.out, base=args.base, prompts=args.prompts,
                       num_prompts=args.num_prompts, num_generations=args.num_generations,
                       temperature=args.temperature, max_completion_length=args.max_completion_length,
                       verifier=args.verifier, grad_norm=args.grad_norm, probes=args.probes,
                       exact_subset=args.exact_subset, own_batches=args.own_batches,
                       token_answers=args.token_answers, steps=args.steps, seed=args.seed, threads=args.threads,
                       quiet=args.quiet, figures=not args.no_figures, overwrite=args.overwrite,
                       truncate=args.truncate, fidelity=args.fidelity)
    out = audit_series(s)
    logging.getLogger("gmts").info("series audit written to %s (series.json, compare/, tokens/)", out)
    return 0
