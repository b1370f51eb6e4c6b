#!/usr/bin/env bash
# slot 1 this session: once gmts-s1000 is recorded, stop process 1 (it would go on to all-s1001, which cannot
# finish in this session) and audit gmts-s1000 while its checkpoints exist, with step 0 shared from all-s1000
cd /work/study37wt
until [ -f data/trl_study/rho0.2_batch.runs/gmts-s1000.json ]; do sleep 20; done
sleep 60   # the driver prunes the run's other checkpoints, then starts all-s1001
pkill -TERM -f "trl_study.py run .*--only all-s1000,entropy-s1000,gmts-s1000" ; sleep 20
rm -rf /work/study37/runs/rho0.2_batch/all-s1001
echo "$(date -u +%FT%TZ) process 1 stopped after gmts-s1000; all-s1001 removed (it starts next session)" >> ops/slot1.log
until [ -f ops/series/all-s1000/step-00000/stats.json ]; do sleep 20; done
bash ops/share_step0.sh all-s1000 gmts-s1000
bash ops/audit.sh gmts-s1000
