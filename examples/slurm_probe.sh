#!/usr/bin/env bash
# Probe a checkpoint on every GPU of several nodes under SLURM (see docs/scaling.md).
#
#   sbatch examples/slurm_probe.sh /shared/ckpt/step-100 /shared/rollouts.jsonl /shared/runs/step-100
#
# One SLURM task per node; torchrun starts one rank per GPU inside it. The run directory
# must be on a filesystem all nodes share. A killed or requeued job resumes where it
# stopped: the same command skips every answer already recorded (do not add --overwrite).
#
#SBATCH --job-name=gmts-probe
#SBATCH --nodes=4
#SBATCH --ntasks-per-node=1
#SBATCH --gpus-per-node=8
#SBATCH --cpus-per-task=32
#SBATCH --time=24:00:00
#SBATCH --requeue
#SBATCH --output=gmts-probe-%j.log

set -euo pipefail

MODEL=${1:?usage: sbatch slurm_probe.sh MODEL ROLLOUTS OUT [extra gmts probe flags]}
ROLLOUTS=${2:?rollouts file}
OUT=${3:?run directory (on a shared filesystem)}
shift 3

GPUS_PER_NODE=${SLURM_GPUS_ON_NODE:-8}
MASTER_HOST=$(scontrol show hostnames "$SLURM_JOB_NODELIST" | head -n 1)
MASTER_PORT=${MASTER_PORT:-29500}
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-4}

# activate the environment gmts_analysis is installed in, e.g.:
# source /path/to/venv/bin/activate

srun --kill-on-bad-exit=1 bash -c "
  torchrun \
    --nnodes $SLURM_JOB_NUM_NODES \
    --nproc-per-node $GPUS_PER_NODE \
    --node-rank \$SLURM_NODEID \
    --rdzv-id $SLURM_JOB_ID \
    --rdzv-backend c10d \
    --rdzv-endpoint $MASTER_HOST:$MASTER_PORT \
    -m gmts_analysis probe \
      --model '$MODEL' --rollouts '$ROLLOUTS' --out '$OUT' --device cuda $*
"
