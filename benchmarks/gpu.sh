#!/usr/bin/env bash
# One GPU: exact and sketch per-token gradient norms on a Qwen2.5-1.5B-shaped model (all 28
# layers, random weights from the config, no download) at T=1024, in bfloat16 and float32, then
# on the SmolLM2-135M shape (30 layers) at T=64, 128 and 256 (prompt 64) in float32; tokens/s
# and peak memory as JSON. Bounded: 90 s per Qwen case (4 cases), 470 s; 20 s per SmolLM2 case
# (2 per T), 100 s per T: under 13 minutes in all (--smollm2: the SmolLM2 part alone, 5 minutes).
#
#   benchmarks/gpu.sh [OUT.json]          # needs a CUDA device
#   benchmarks/gpu.sh --smollm2 [OUT.json] # only the SmolLM2-135M shape
#   benchmarks/gpu.sh --dry-run [OUT.json] # the same script on a tiny shape on CPU (< 1 min)
set -euo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
stamp="$(date -u +%Y%m%d-%H%M%S)"
if [[ "${1:-}" == "--dry-run" ]]; then
  out="${2:-benchmarks/results/gpu-dryrun-$stamp.json}"
  timeout 300 "$PY" benchmarks/gpu_bench.py --device cpu --threads 1 --shape tiny --T 48 --calib 16 \
    --dtypes bfloat16,float32 --case-budget-s 30 --out "$out"
  echo "gpu.sh: dry run wrote $out"
  exit 0
fi
if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
  echo "gpu.sh: no CUDA device (torch.cuda.is_available() is False); nothing was run. On CPU: benchmarks/gpu.sh --dry-run" >&2
  exit 2
fi
only_smol=0
if [[ "${1:-}" == "--smollm2" ]]; then only_smol=1; shift; fi
out="${1:-benchmarks/results/gpu-$stamp.json}"
mkdir -p "$(dirname "$out")"
[[ $only_smol == 1 ]] || timeout 470 "$PY" benchmarks/gpu_bench.py --device cuda --shape qwen1.5b --T 1024 --P 32 \
  --dtypes bfloat16,float32 --methods exact,sketch --probes 32 --case-budget-s 90 --out "$out"
[[ $only_smol == 1 ]] || echo "gpu.sh: wrote $out"
for T in 64 128 256; do
  smol="${out%.json}-smollm2-T$T.json"
  timeout 100 "$PY" benchmarks/gpu_bench.py --device cuda --shape smollm2 --T "$T" --P 64 \
    --dtypes float32 --methods exact,sketch --probes 32 --case-budget-s 20 --calib 32 --out "$smol"
  echo "gpu.sh: wrote $smol"
done
