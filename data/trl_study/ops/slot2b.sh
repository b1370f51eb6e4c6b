#!/usr/bin/env bash
# slot 2 this session, after the all-s1000 audit: re-train entropy-s1000 (checked against its record) and audit it
cd /work/study37wt
while pgrep -f "ops/slot2.sh" >/dev/null; do sleep 20; done
. ops/env.sh
echo "$(date -u +%FT%TZ) retrain entropy-s1000" >> ops/slot2.log
python ops/retrain.py entropy-s1000 >> ops/slot2.log 2>&1
echo "$(date -u +%FT%TZ) retrain exit $?" >> ops/slot2.log
bash ops/share_step0.sh all-s1000 entropy-s1000
bash ops/audit.sh entropy-s1000
