"""``gmts rl``: RLVR on the toy domains with token selection (the arms of :mod:`gmts_analysis.core.scores`)."""

from __future__ import annotations

from gmts_analysis.options.command import Command
from gmts_analysis.rl.config import SELECTION_ARMS, RLOptions

EXAMPLES = """examples:
  gmts rl --model tiny --selection all gmts --seed 0 --max-steps 20 --out /tmp/rl.json
  gmts rl --num_generations 8 --max_completion_length 64 --top_entropy_quantile 0.2 --figures none
  gmts rl --selection entropy gmts --seed 0 1 --threads 1 -q"""


COMMAND = Command(
    "rl", job="gmts_analysis.commands.rl_job:rl", settings=(RLOptions,),
    help="train a toy policy with GRPO, updating only selected tokens; compare selections over seeds",
    description=lambda: "On-policy GRPO on the toy domains where only the top --rho tokens by a score enter the "
    f"loss ({' | '.join(SELECTION_ARMS)}; gmts_lgn = logit-gradient norm x |omega|). Runs every --selection x "
    "--seed, evaluates pass@1 at "
    "temperature 1.0 on held-out prompts every --eval-every steps, logs per-step diagnostics, "
    "writes the results JSON (--out) and learning-curve figures (--figures).", epilog=EXAMPLES,
)
register = COMMAND.register
