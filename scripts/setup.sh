#!/usr/bin/env bash
# One-time, idempotent set-up: system packages, then a .venv with the project (editable) and every extra (the test
# extra pulls in camera, tools and batch), at the versions requirements.lock pins.
set -euo pipefail
cd "$(dirname "$0")/.."

need=()
command -v python3 >/dev/null || need+=(python3)        # a minimal image may have none
command -v clang >/dev/null || need+=(clang)            # tinygrad's CPU backend compiles with clang
python3 -c 'import ensurepip' 2>/dev/null || need+=(python3-venv)
ldconfig -p 2>/dev/null | grep -q 'libatomic\.so\.1' || need+=(libatomic1)   # msgq's shm transport: compare-and-swap
[ -x /usr/bin/chromium ] || need+=(chromium)            # the web viewer's test (tests/test_view.py) drives Debian's chromium
if [ ${#need[@]} -gt 0 ]; then
  if [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null; then
    echo "setup: installing system packages: ${need[*]}"
    apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need[@]}" >/dev/null
  else
    echo "setup: missing system packages: ${need[*]}" >&2
    echo "setup: run: sudo apt-get install -y ${need[*]}   then run make again" >&2
    exit 1
  fi
fi

python3 -c 'import sys; sys.exit(sys.version_info < (3, 11))' || {
  echo "setup: Python 3.11 or newer is needed (python3 is $(python3 -V 2>&1)): Debian 12, Ubuntu 24.04 or later" >&2; exit 1; }

stamp=.venv/.installed
if [ -f "$stamp" ] && [ "$stamp" -nt pyproject.toml ] && [ "$stamp" -nt requirements.lock ]; then exit 0; fi
[ -x .venv/bin/python ] || python3 -m venv .venv
.venv/bin/python -m pip install -q --upgrade pip
.venv/bin/python -m pip install -q -c requirements.lock -e '.[test]'
touch "$stamp"
echo "setup: done (.venv)"
