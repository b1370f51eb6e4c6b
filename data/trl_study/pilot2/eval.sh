#!/usr/bin/env bash
# Held-out pass@1 of pilot 2's checkpoints: its 100 pilot held-out problems (seed 9002, level 1, matched examples),
# one answer each, sampling seed 9003, T 0.7, 256 tokens; cached in RUN/evals/. Resumable: run again.
# usage: eval.sh WORKTREE LR STEPS   (step 0 = the base model, evaluated once, under lr1e-5)
set -u
cd /work/study37/pilot2
export PYTHONPATH=$1 GMTS_CACHE=/work/study37/cache OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
lr=$2
if [ ! -f lr$lr/evals/step-00000.json ] && [ -f lr1e-5/evals/step-00000.json ]; then mkdir -p lr$lr/evals; cp lr1e-5/evals/step-00000.* lr$lr/evals/; fi
/work/main/.venv/bin/python $1/benchmarks/trl_study.py eval lr$lr --prompts lr$lr/problems_heldout.jsonl \
    --steps $3 --seed 9003 --temperature 0.7 --max-new-tokens 256 --threads 1
