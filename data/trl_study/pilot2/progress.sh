#!/usr/bin/env bash
# one line per step: lr, step, reward, frac_reward_zero_std, mean length, step_time
cd /work/study37/pilot2
for lr in ${1:-1e-5 2e-5}; do
  grep -a "'reward':" lr$lr.log | /work/main/.venv/bin/python -c "
import sys,ast
for i,l in enumerate(sys.stdin):
    d=ast.literal_eval(l.strip()[l.index('{'):])
    print('$lr', i+1, d['reward'], d['frac_reward_zero_std'], d['completions/mean_length'], d.get('step_time'))"
done
