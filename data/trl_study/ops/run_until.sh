#!/usr/bin/env bash
# The study's runs after the 55-minute rule of run_study.sh stops it, when this machine is kept between sessions:
#   run_until.sh P STOP_EPOCH [WAIT_PID]
# waits for WAIT_PID (the process's run_study.sh) to end, then starts process P's next unrecorded runs, one at a
# time, while at least 15 minutes remain before STOP_EPOCH; at STOP_EPOCH the running driver is stopped with
# SIGTERM to the driver alone (its handler exits through subprocess.run, which kills the training script, and the
# training segment's wall time is still written to timing.json), and the run resumes from its newest checkpoint and
# cached evaluations in the next session (the driver's resume; lost only if the machine is). Not SIGINT: a script
# launched in the background by a non-interactive shell inherits SIGINT ignored, which nothing below can undo.
. /work/study37wt/ops/env.sh
P=$1; STOP=$2; W=$3
[ -n "$W" ] && while kill -0 "$W" 2>/dev/null; do sleep 20; done
if [ "$P" = 1 ]; then S="1000 1001 1002 1003"; else S="1004 1005 1006 1007"; fi
RUNS=""
for s in $S; do for a in all entropy gmts; do RUNS="$RUNS $a-s$s"; done; done
echo "$(date -u +%FT%TZ) run_until process $P (commit $(git rev-parse --short HEAD)), stop $(date -u -d @$STOP +%TZ)" >> ops/study_$P.log
for r in $RUNS; do
  [ -f data/trl_study/rho0.2_batch.runs/$r.json ] && continue
  if [ $(( $(date +%s) + 15*60 )) -gt "$STOP" ]; then
    echo "$(date -u +%FT%TZ) $r not started: less than 15 min before the stop" >> ops/study_$P.log; break
  fi
  python benchmarks/trl_study.py run data/trl_study/plan.json --runs-root /work/study37/runs --threads 1 \
      --only "$r" >> ops/study_$P.log 2>&1 &
  DRV=$!
  ( sleep $(( STOP - $(date +%s) )) 2>/dev/null
    if kill -0 $DRV 2>/dev/null; then
      echo "$(date -u +%FT%TZ) $r: stopped at the session's stop (SIGTERM to the driver); resumes next session" >> ops/study_$P.log
      kill -TERM $DRV
    fi ) &
  WD=$!
  wait $DRV; RC=$?
  kill $WD 2>/dev/null
  echo "$(date -u +%FT%TZ) $r: driver exit $RC" >> ops/study_$P.log
  [ $(date +%s) -ge "$STOP" ] && break
done
