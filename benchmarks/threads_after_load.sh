#!/usr/bin/env bash
# The default thread count right after a load (issue #38): optionally pause other work (PAUSE_PATTERN, a pgrep
# -f pattern: SIGSTOP, SIGCONT on exit) so the cores are idle; a 2-process burner for 60 s; right after it the old
# rule (cores - 1-min load average) and the new one; a small exact job at the default and at 1 thread; then busy.
set -u
cd "$(dirname "$0")/.."; [ -f .venv/bin/activate ] && . .venv/bin/activate
unset OMP_NUM_THREADS GMTS_THREADS
PIDS=$(if [ -n "${PAUSE_PATTERN:-}" ]; then pgrep -f "$PAUSE_PATTERN" | tr "\n" " "; fi)
[ -n "$PIDS" ] && kill -STOP $PIDS
[ -n "$PIDS" ] && trap "kill -CONT $PIDS" EXIT
sleep 20
rules() { python - <<'PY'
import os
from gmts_analysis.util import threads as t
cores = t.available_cores(); la = os.getloadavg()[0]
old = max(1, min(cores, int((cores - la) + 0.5)))
busy = t.busy_cores_now()
print(f"load1 {la:.2f} old {old} busy_now {busy:.2f} new {t.threads_for(cores, busy)}")
PY
}
echo "idle, before: $(rules)"
burn() { for i in 1 2; do timeout $1 python -c "while True: pass" & done; }
burn 60; sleep 61
echo "right after the 60 s load: $(rules)"
JOB="gmts run --model small --domains arithmetic --num-prompts 2 --num-generations 4 --device cpu --no-figures -q"
for rep in 1 2; do
  for th in default 1; do
    rm -rf /tmp/thr-$th-$rep
    extra=""; [ $th = 1 ] && extra="--threads 1"
    s=$(date +%s.%N); $JOB --out /tmp/thr-$th-$rep $extra; e=$(date +%s.%N)
    python - /tmp/thr-$th-$rep $s $e <<'PY'
import json,sys
m=json.load(open(sys.argv[1]+"/manifest.json")); c=m.get("config",{})
print(f"threads={m.get('torch_threads', c.get('threads'))} wall={float(sys.argv[3])-float(sys.argv[2]):.1f} probe_s={m.get('timings',{}).get('probe_s')}")
PY
  done
done
burn 30; sleep 10
echo "busy (burner on both cores, 10 s in): $(rules)"
wait
