#!/usr/bin/env bash
# After all 24 records exist: copy them and the CPU sampler's log into main's data/trl_study, run the report,
# print the audit and cost tables for section 12. Main's code (reporting only); the runs came from 5d4a762.
set -e
SRC=/work/study37wt; DST=/work/main/data/trl_study
n=$(ls $SRC/data/trl_study/rho0.2_batch.runs/*.json | wc -l)
[ "$n" = 24 ] || { echo "only $n of 24 records"; exit 1; }
mkdir -p $DST/rho0.2_batch.runs
cp $SRC/data/trl_study/rho0.2_batch.runs/*.json $DST/rho0.2_batch.runs/
cp $SRC/ops/cpu_samples.log $SRC/ops/cpu_parents.json $DST/
cd /work/main && . .venv/bin/activate
export OMP_NUM_THREADS=1
gmts rl-report data/trl_study --update docs/rl.md README.md
python benchmarks/trl_study_summary.py audit data/trl_study/audit > /tmp/audit_table.md
python benchmarks/trl_study_summary.py cost data/trl_study > /tmp/cost_table.md
cat /tmp/audit_table.md /tmp/cost_table.md
