#!/usr/bin/env bash
# The CPU figures of docs/PERFORMANCE.md on this machine in one go: the set-up (as make does: clang, the venv), then
# bench/runtime.py's real-size part (its CPU and ISA, ours against onnxruntime on 1, 2, 4 and 8 threads as the free
# cores allow, per-kernel and per-thread profiles); what it prints goes to cpu-check.log too. Extra arguments go to it.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
.venv/bin/python bench/runtime.py --parts realsize "$@" 2>&1 | tee cpu-check.log
