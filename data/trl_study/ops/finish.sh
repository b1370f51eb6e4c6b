#!/usr/bin/env bash
# the rest of this session: the gmts audit (slot1b, paused) goes on once the CI ends; the entropy audit starts
# (step 0 shared) once the all-s1000 audit ends. Two heavy processes at most.
cd /work/study37wt
until grep -q CI_EXIT /tmp/ciX.log; do sleep 15; done
kill -CONT 4804; echo "$(date -u +%FT%TZ) CI ended; slot1b (gmts audit) resumed" >> ops/slot1.log
until grep -qE "Z exit [0-9]+$" ops/audit_all-s1000.log; do sleep 15; done
bash ops/share_step0.sh all-s1000 entropy-s1000 && bash ops/audit.sh entropy-s1000
