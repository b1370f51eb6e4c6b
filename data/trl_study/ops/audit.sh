#!/usr/bin/env bash
# the plan's audit across checkpoints (section 11): seed 1000 of an arm at steps 0, 5, 10, 20, 8 held-out x 4
# answers, --grad-norm auto, token view of 4 answers. Resumable. Usage: audit.sh all-s1000
. /work/study37wt/ops/env.sh
R=$1
echo "$(date -u +%FT%TZ) start audit $R (commit $(git rev-parse --short HEAD))" >> ops/audit_$R.log
python -m gmts_analysis series /work/study37/runs/rho0.2_batch/$R --base smollm2 \
    --prompts data/trl_study/heldout.jsonl --num-prompts 8 --num-generations 4 --token-answers 4 \
    --steps 0,5,10,20 --seed 20261206 --grad-norm auto --threads 1 --out /work/study37wt/ops/series/$R \
    >> ops/audit_$R.log 2>&1
echo "$(date -u +%FT%TZ) exit $?" >> ops/audit_$R.log
