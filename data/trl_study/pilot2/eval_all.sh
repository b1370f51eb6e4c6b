#!/usr/bin/env bash
# evaluate pilot 2's checkpoints 10, 20, 30 of both learning rates as they appear (one process); resumable
cd /work/study37/pilot2
while true; do
  left=0
  for s in 10 20 30; do for lr in 2e-5 1e-5; do
    [ -f lr$lr/evals/step-$(printf %05d $s).json ] && continue
    left=1
    [ -f lr$lr/checkpoint-$s/trainer_state.json ] && ./eval.sh /work/eval37b $lr $s >> eval_all.log 2>&1
  done; done
  [ $left = 0 ] && break
  sleep 30
done
