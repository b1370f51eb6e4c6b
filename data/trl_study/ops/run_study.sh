#!/usr/bin/env bash
# One study process (plan section 11): process 1 = seeds 1000-1003, process 2 = seeds 1004-1007, one run at a
# time, and no run started after DEADLINE minus 55 minutes (a run takes 45-50 min at one thread beside another
# process, and a run cut by the end of a session is lost with the machine's checkpoints).
#   run_study.sh P DEADLINE_EPOCH [RUNS]      RUNS: a comma list overriding the process's list
. /work/study37wt/ops/env.sh
P=$1; DEADLINE=$2
if [ "$P" = 1 ]; then S="1000 1001 1002 1003"; else S="1004 1005 1006 1007"; fi
RUNS=""
for s in $S; do for a in all entropy gmts; do RUNS="$RUNS $a-s$s"; done; done
[ -n "$3" ] && RUNS=${3//,/ }
# the base model's evaluation (step 0, shared by every run) is kept with the worktree: not redone per machine
mkdir -p /work/study37/runs
for f in base_eval.json base_eval.answers.jsonl base_eval.answers.key.json; do
  [ -f /work/study37/runs/$f ] || cp ops/$f /work/study37/runs/$f
done
echo "$(date -u +%FT%TZ) start process $P (commit $(git rev-parse --short HEAD)), deadline $(date -u -d @$DEADLINE +%TZ)" >> ops/study_$P.log
for r in $RUNS; do
  [ -f data/trl_study/rho0.2_batch.runs/$r.json ] && continue
  if [ $(( $(date +%s) + 55*60 )) -gt "$DEADLINE" ]; then
    echo "$(date -u +%FT%TZ) $r not started: less than 55 min before the deadline" >> ops/study_$P.log; break
  fi
  python benchmarks/trl_study.py run data/trl_study/plan.json --runs-root /work/study37/runs --threads 1 \
      --only "$r" >> ops/study_$P.log 2>&1
  echo "$(date -u +%FT%TZ) $r: driver exit $?" >> ops/study_$P.log
done
