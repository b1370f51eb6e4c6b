#!/usr/bin/env bash
# every 30 s: EPOCH PID SELF_CPU_S CHILDREN_CPU_S KIND WHAT PPID, for the study's python processes (1 thread each)
# (lines before 2026-12-06 01:57 UTC have no PPID; ops/cpu_parents.json gives it for their training processes)
T=$(getconf CLK_TCK)
while true; do
  now=$(date +%s)
  for p in $(pgrep -f "python"); do
    cmd=$(tr '\0' ' ' < /proc/$p/cmdline 2>/dev/null) || continue
    case "$cmd" in
      *trl_grpo_word_problems.py*) kind=train; what=$(echo "$cmd" | grep -o -- '--output_dir [^ ]*' | awk '{print $2}');;
      *"gmts_analysis series"*|*"gmts series"*) kind=series; what=$(echo "$cmd" | grep -o -- '--out [^ ]*' | awk '{print $2}');;
      *trl_study.py*) kind=driver; what=$(echo "$cmd" | grep -o -- '--only [^ ]*' | awk '{print $2}');;
      *) continue;;
    esac
    read -r pp u s cu cs < <(awk '{print $4, $14, $15, $16, $17}' /proc/$p/stat 2>/dev/null) || continue
    echo "$now $p $(( (u+s)/T )) $(( (cu+cs)/T )) $kind $what $pp"
  done >> /work/study37wt/ops/cpu_samples.log
  sleep 30
done
