#!/usr/bin/env bash
# step 0 of every arm's audit is the same work (the base model, the same 8 prompts, the same seed): copy the
# finished step 0 of audit $1 into audit $2 (which then finds it complete and goes on at step 5)
set -e
A=/work/study37wt/ops/series/$1; B=/work/study37wt/ops/series/$2
test -f $A/step-00000/stats.json
mkdir -p $B/samples $B/tokens
cp -a $A/step-00000 $B/; cp -a $A/samples/step-00000.* $B/samples/
cp -a $A/tokens/answers.jsonl $A/tokens/step-00000 $B/tokens/
echo "$(date -u +%FT%TZ) step 0 of $1 copied into $2" >> /work/study37wt/ops/share.log
