#!/usr/bin/env bash
# One GPU, in parts, cheapest first; each part under its own timeout, its status recorded, the
# next part run whatever happened; a table of the parts at the end (also OUT-parts.tsv).
#
#   smoke      the benchmark on a tiny shape (both dtypes, exact and sketch): the stack works   <=  90 s
#   probe      gmts probe --device cuda --strict on the shipped example (192 answers, small policy)  <= 300 s
#   tests      tests/test_gpu_cuda.py (skipped with a note when pytest is not installed)        <= 300 s
#   smollm2    SmolLM2-135M shape, float32, prompt 64, T = 64, 128, 256: 3 parts               <= 3 x 100 s
#   qwen       Qwen2.5-1.5B shape (28 layers, random weights, no download), T = 1024, prompt 32,
#              bfloat16 and float32                                                             <= 470 s
#
# Exact and sketch (K = 32) norms, tokens/s and peak memory as JSON (benchmarks/gpu_bench.py: one
# untimed warm-up call per method on each model before the timed cases). At most about 25 minutes.
# Needs only the README's install (pip install torch && pip install -e .); the tests part also
# needs pytest (the dev extra). Exit status: 0 when no part failed or timed out, 1 otherwise,
# 2 without a CUDA device (nothing run).
#
#   benchmarks/gpu.sh [OUT.json]                   # every part; OUT.json: the Qwen part's JSON
#   benchmarks/gpu.sh --parts smoke,probe [OUT.json]
#   benchmarks/gpu.sh --smollm2 [OUT.json]         # smoke and the SmolLM2 parts only
#   benchmarks/gpu.sh --dry-run [OUT.json]         # the same parts on CPU at toy sizes (about 2 minutes)
set -uo pipefail
cd "$(dirname "$0")/.."
PY="${PYTHON:-python}"
stamp="$(date -u +%Y%m%d-%H%M%S)"
dry=0
parts="smoke,probe,tests,smollm2,qwen"
while [[ $# -gt 0 ]]; do
  case "$1" in
    --dry-run) dry=1; shift ;;
    --smollm2) parts="smoke,smollm2"; shift ;;
    --parts) parts="$2"; shift 2 ;;
    *) break ;;
  esac
done
if [[ $dry == 1 ]]; then
  out="${1:-benchmarks/results/gpu-dryrun-$stamp.json}"
  dev=cpu
else
  if ! "$PY" -c "import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)"; then
    echo "gpu.sh: no CUDA device (torch.cuda.is_available() is False); nothing was run. On CPU: benchmarks/gpu.sh --dry-run" >&2
    exit 2
  fi
  out="${1:-benchmarks/results/gpu-$stamp.json}"
  dev=cuda
fi
mkdir -p "$(dirname "$out")"
base="${out%.json}"
table="$base-parts.tsv"
printf 'part\tstatus\tseconds\tlimit_s\toutput\tlog\n' >"$table"
failed=0

wanted() { [[ ",$parts," == *",$1,"* ]]; }

# part NAME LIMIT_S OUTPUT CMD...: run CMD under `timeout LIMIT_S`, its output in BASE-NAME.log
part() {
  local name="$1" limit="$2" output="$3"
  shift 3
  local log="$base-$name.log" t0=$SECONDS rc status
  echo "gpu.sh: [$name] up to ${limit} s: $*" >&2
  timeout --kill-after=15 "$limit" "$@" >"$log" 2>&1
  rc=$?
  case $rc in
    0) status=passed ;;
    124 | 137) status="timeout"; failed=1 ;;
    *) status="failed (rc $rc)"; failed=1 ;;
  esac
  echo "gpu.sh: [$name] $status after $((SECONDS - t0)) s (log: $log)" >&2
  printf '%s\t%s\t%s\t%s\t%s\t%s\n' "$name" "$status" "$((SECONDS - t0))" "$limit" "$output" "$log" >>"$table"
}

skip() {  # skip NAME REASON
  echo "gpu.sh: [$1] skipped: $2" >&2
  printf '%s\t%s\t0\t-\t-\t-\n' "$1" "skipped: $2" >>"$table"
}

bench() {  # bench NAME LIMIT_S OUT ARGS...: benchmarks/gpu_bench.py on this run's device
  local name="$1" limit="$2" json="$3"
  shift 3
  part "$name" "$limit" "$json" "$PY" benchmarks/gpu_bench.py --device "$dev" --out "$json" "$@"
}

if [[ $dry == 1 ]]; then  # CPU, toy sizes: the parts' plumbing, not their numbers
  T_SMOL=(24 48) SHAPE_SMOL=tiny SHAPE_QWEN=tiny T_QWEN=48 EXTRA=(--threads 1) EXAMPLE_ROWS=16
else
  T_SMOL=(64 128 256) SHAPE_SMOL=smollm2 SHAPE_QWEN=qwen1.5b T_QWEN=1024 EXTRA=() EXAMPLE_ROWS=0
fi

if wanted smoke; then
  bench smoke 90 "$base-smoke.json" --shape tiny --T 48 --P 8 --calib 16 --dtypes bfloat16,float32 \
    --methods exact,sketch --probes 8 --case-budget-s 20 "${EXTRA[@]}"
fi

if wanted probe; then
  example="$("$PY" -c "from gmts_analysis.util.resources import example_run_dir; print(example_run_dir() / 'rollouts.jsonl')")"
  run_dir="$base-probe-run"
  if [[ $EXAMPLE_ROWS -gt 0 ]]; then  # the dry run: the first rows only
    head -n "$EXAMPLE_ROWS" "$example" >"$base-probe-rollouts.jsonl"
    example="$base-probe-rollouts.jsonl"
  fi
  part probe 300 "$run_dir" "$PY" -m gmts_analysis probe --model small --rollouts "$example" --out "$run_dir" \
    --device "$dev" --strict --no-figures --fidelity off --quiet --overwrite "${EXTRA[@]}"
fi

if wanted tests; then
  if "$PY" -c "import pytest" 2>/dev/null; then
    part tests 300 "-" "$PY" -m pytest -q -rs tests/test_gpu_cuda.py
  else
    skip tests "pytest not installed (pip install -e '.[dev]')"
  fi
fi

if wanted smollm2; then
  for T in "${T_SMOL[@]}"; do
    bench "smollm2-T$T" 100 "$base-smollm2-T$T.json" --shape "$SHAPE_SMOL" --T "$T" --P 64 --dtypes float32 \
      --methods exact,sketch --probes 32 --case-budget-s 20 --calib 32 "${EXTRA[@]}"
  done
fi

if wanted qwen; then
  bench qwen 470 "$out" --shape "$SHAPE_QWEN" --T "$T_QWEN" --P 32 --dtypes bfloat16,float32 \
    --methods exact,sketch --probes 32 --case-budget-s 90 "${EXTRA[@]}"
fi

echo "gpu.sh: parts ($table):" >&2
column -t -s $'\t' "$table" >&2 2>/dev/null || cat "$table" >&2
exit $failed
