#!/usr/bin/env bash
# Issue 37, session of 2026-12-06 09:51: process 1 runs out of runs (seeds 1000-1003) about 50 minutes before
# process 2 (seed 1007's three runs). When process 1 is done, stop process 2's loops (run_study.sh 2 and
# run_until.sh 2; the driver it is running goes on to its end, alone) and run seed 1007's unrecorded runs that no
# driver is running on process 1 instead, with the same deadline rule (run_study.sh's override list).
#   rebalance.sh DEADLINE_EPOCH
. /work/study37wt/ops/env.sh
D=$1
while pgrep -f "run_study.sh 1" >/dev/null || pgrep -f "run_until.sh 1" >/dev/null; do sleep 20; done
L=""
pkill -KILL -f "run_until.sh 2"; pkill -KILL -f "run_study.sh 2"
for r in all-s1007 entropy-s1007 gmts-s1007; do
  [ -f data/trl_study/rho0.2_batch.runs/$r.json ] && continue
  pgrep -f -- "--only $r" >/dev/null && continue
  L="$L${L:+,}$r"
done
echo "$(date -u +%FT%TZ) rebalance: process 1 done; process 2's loops stopped (its running driver goes on); process 1 takes: ${L:-nothing}" >> ops/study_1.log
echo "$(date -u +%FT%TZ) rebalance: loops stopped, running driver goes on; process 1 takes: ${L:-nothing}" >> ops/study_2.log
[ -n "$L" ] && exec ops/run_study.sh 1 "$D" "$L"
