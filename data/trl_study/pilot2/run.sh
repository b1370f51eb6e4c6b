#!/usr/bin/env bash
# Pilot 2 of #37, on the task the pilot 1 pointed to: level-1 (one-step) word problems with matched one-step worked
# examples. Arm all, training seed 900, problem seed 901 (120 problems), pilot held-out seed 9002 (100 problems), both
# leaving out the study's held-out set; lr $1, 30 steps, a checkpoint every 10, 1 thread. Resumable: run again.
set -u
cd /work/study37/pilot2
export PYTHONPATH=/work/pilot37b GMTS_CACHE=/work/study37/cache OMP_NUM_THREADS=1 TOKENIZERS_PARALLELISM=false
lr=$1; out=lr$lr
/work/main/.venv/bin/python /work/pilot37b/examples/trl_grpo_word_problems.py --output_dir $out --seed 900 \
    --problem_seed 901 --eval_seed 9002 --eval_problems 100 --train_problems 120 --difficulty 1 --examples matched \
    --exclude_problems /work/study37/design/study_heldout_d1.jsonl \
    --token_selection all --per_device_train_batch_size 16 --num_generations 4 --max_completion_length 160 \
    --temperature 0.7 --learning_rate $lr --lr_scheduler_type constant --max_steps 30 --save_steps 10 \
    --logging_steps 1 --rollouts_dir $out/rollouts --log_completions --threads 1 --report_to none --use_cpu \
    --disable_tqdm true >> $out.log 2>&1
