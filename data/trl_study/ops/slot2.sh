#!/usr/bin/env bash
# slot 2 this session: re-train all-s1000 (checked against its record), audit it
. /work/study37wt/ops/env.sh
echo "$(date -u +%FT%TZ) retrain all-s1000" >> ops/slot2.log
python ops/retrain.py all-s1000 >> ops/slot2.log 2>&1
echo "$(date -u +%FT%TZ) retrain exit $?" >> ops/slot2.log
bash ops/audit.sh all-s1000
