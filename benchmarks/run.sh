#!/usr/bin/env bash
# The documented benchmark run (see docs/benchmarks.md). One intra-op thread: on a shared
# 2-core machine two OpenMP threads were up to 30x slower than one for every method.
set -euo pipefail
cd "$(dirname "$0")/.."
python -m gmts_analysis bench --threads "${THREADS:-1}" --models small --lengths 64,256,1024 --probes 16,32,64 "$@"
python -m gmts_analysis bench --threads "${THREADS:-1}" --models qwen0.5b --layers 2 --lengths 64,256 --probes 16,32,64 --naive-tokens 4 "$@"
