#!/usr/bin/env bash
# Evaluate each pilot checkpoint as soon as it exists (held-out pass@1, 200 problems); resumable.
set -u
cd /work/study37/pilot
while true; do
  left=0
  for lr in ${WATCH_LRS:-1e-5 2e-5}; do
    for s in 10 20 30 40; do
      [ -f lr$lr/evals/step-$(printf %05d $s).json ] && continue
      left=1
      if [ -f lr$lr/checkpoint-$s/trainer_state.json ]; then
        [ -f lr$lr/evals/step-00000.json ] || { mkdir -p lr$lr/evals; cp lr1e-5/evals/step-00000.* lr$lr/evals/ 2>/dev/null; }
        LRS=$lr STEPS=$s ./eval_pilot.sh /work/eval37 >> eval_watch.log 2>&1
      fi
    done
  done
  [ $left = 0 ] && break
  sleep 60
done
