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

from gmts_analysis.options.command import Command, Positional
from gmts_analysis.options.config import RunControl
from gmts_analysis.run.series_types import SeriesSettings

EXAMPLES = """examples:
  gmts series runs/grpo-gmts --out runs/grpo-gmts-audit
  gmts series runs/grpo-gmts --base smollm2 --prompts heldout.jsonl --num-prompts 8 --steps 0,20,40
  gmts series runs/grpo-gmts --own-batches --grad-norm exact --threads 2"""


COMMAND = Command(
    "series", job="gmts_analysis.commands.series_job:series", settings=(SeriesSettings, RunControl), skip=("offline",),
    positionals=(Positional("output_dir", "OUTPUT_DIR", "a TRL output directory with checkpoint-N folders"),),
    help="audit a TRL training run across its checkpoints (sample, probe, compare, token view)",
    description=__doc__.split("\n\n", 1)[1], epilog=EXAMPLES,
)
register = COMMAND.register
