#!/usr/bin/env bash
# Held-out pass@1 of the pilot's checkpoints (200 pilot held-out problems, one answer each, seed 9001, T 0.7,
# 256 tokens); each evaluation cached in RUN/evals/. Resumable: run again.
set -u
cd /work/study37/pilot
export PYTHONPATH=$1 GMTS_CACHE=/work/study37/cache OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
for lr in ${LRS:-1e-5 4e-5}; do
  /work/main/.venv/bin/python $1/benchmarks/trl_study.py eval lr$lr --prompts lr$lr/problems_heldout.jsonl \
    --steps ${STEPS:-0} --seed 9001 --temperature 0.7 --max-new-tokens 256 --threads 1
done
