"""``gmts bench``: tokens/s and peak memory of the per-token gradient-norm methods.

In one run (ratios are what to read on a shared machine): the naive loop (forward and
backward per token), the shared-forward loop, the exact engine and the forward-mode sketch
at several K, on the `small` shipped policy (or a random model of its shape until it
exists) and on a random model of Qwen2.5-0.5B's shape with fewer layers. Answers are
sampled from each model. Prints a markdown table and writes JSON (and the table) to
--out. Naive and loop are timed on a subset of tokens at large T (they cost the same per
token); the table says so.
"""

from __future__ import annotations

from dataclasses import dataclass

from gmts_analysis.options import checks
from gmts_analysis.options.command import Command
from gmts_analysis.options.config import QUIET_HELP
from gmts_analysis.options.fields import opt

EXAMPLES = """examples:
  gmts bench --quick --threads 1
  gmts bench --models small --lengths 64,256 --probes 16,32 --out /tmp/bench"""


@dataclass
class BenchOptions:
    """The flags of ``gmts bench``."""

    models: str = opt("small,qwen0.5b", "comma-separated: small, qwen0.5b (default both)", group="inputs")
    lengths: str = opt(None, "response lengths T (default 64,256,1024; --quick: 64,256)", group="gradient engine",
                       metavar="T[,T...]", check=checks.int_list)
    probes: str = opt("16,32,64", "sketch K values (default 16,32,64)", group="gradient engine", metavar="K",
                      check=checks.int_list)
    quick: bool = opt(False, "short run: T=64,256, 0.5B shape with 1 layer, 4 naive tokens", group="gradient engine")
    layers: int = opt(None, "decoder layers of the 0.5B-shaped model (default 2; --quick 1)", group="gradient engine",
                      metavar="LAYERS", check=checks.int_at_least(1))
    prompt_len: int = opt(32, "prompt tokens before each answer (default 32)", group="gradient engine",
                          metavar="TOKENS", check=checks.int_at_least(1))
    naive_tokens: int = opt(None, "tokens timed for naive/loop when T > 64 (default 8; --quick 4)",
                            group="gradient engine", metavar="TOKENS", check=checks.int_at_least(2))
    naive_full_max: int = opt(64, "time naive/loop on every token up to this T, above it on --naive-tokens tokens "
                              "(default 64)", group="gradient engine", metavar="TOKENS",
                              check=checks.int_at_least(0))  # 0: no full naive reference
    device: str = opt("auto", "auto, cpu, cuda or cuda:N; auto = cuda if available, else cpu", group="gradient engine",
                      metavar="DEVICE", check=checks.device)
    dtype: str = opt("float32", "float32, float64, bfloat16, float16", group="gradient engine", check=checks.dtype)
    max_memory: int = opt(None, "transient memory budget in MiB for the engines", group="gradient engine",
                          metavar="MiB", check=checks.int_at_least(1))
    threads: int = opt(None, "torch CPU threads (default: torch's choice)", metavar="THREADS",
                       check=checks.int_at_least(1))
    seed: int = opt(0, "seed of the random models and the sampled answers", metavar="INT", check=checks.seed)
    out: str = opt("benchmarks/results", "directory for the JSON and markdown results", group="output",
                   metavar="DIR", check=checks.output_path)
    quiet: bool = opt(False, QUIET_HELP, short="-q")


COMMAND = Command("bench", job="gmts_analysis.commands.bench_job:bench", settings=(BenchOptions,), help="benchmark the gradient-norm engines",
                  description=__doc__.split("\n\n", 1)[1], epilog=EXAMPLES)
register = COMMAND.register
