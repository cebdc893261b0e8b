#!/usr/bin/env bash
# The fault battery's long runs against the real camerad, modeld and dmonitoringd: 10 minutes by default, then a table
# of fault, count injected, outputs lost, fds and RSS before and after, and a verdict per fault (exit 1 if one
# fails). Options: scripts/soak.sh --help
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
exec .venv/bin/python scripts/soak.py "$@"
