#!/usr/bin/env bash
# Set up .venv for mk on a fresh Debian machine with Python 3.11.
#   bash ci/setup.sh          runtime only (the notebooks)
#   bash ci/setup.sh dev      runtime + tests (torch CPU build, transformers, libtpu)
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
[ -x .venv/bin/python ] || "$PY" -m venv .venv
if [ "${1:-}" = dev ]; then req=requirements-dev.txt; else req=requirements.txt; fi
# Static figure export (PNG/SVG) needs a Chromium; install Debian's when we can, beside the Python packages' install
# (both mostly wait on downloads), its progress and debconf notes in a log shown only if it fails.
chromium_pid=
if ! command -v chromium >/dev/null 2>&1 && [ "$(id -u)" = 0 ] && command -v apt-get >/dev/null 2>&1; then
  chromium_log=$(mktemp)
  (apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq chromium) >"$chromium_log" 2>&1 &
  chromium_pid=$!
fi
# uv installs the same pins as pip, in parallel and from its cache: the whole set in ~15 s rather than ~110 s
# with pip. It reads no pip configuration, so a wheel folder the machine gives pip (PIP_FIND_LINKS, e.g. a
# CPU build of torch) is passed on.
# -qq: errors only, as a machine's pip configuration may name index folders it lacks, each a warning line.
.venv/bin/python -m pip install -qq --disable-pip-version-check uv==0.13.9
links=()
for d in ${PIP_FIND_LINKS:-}; do links+=(--find-links "$d"); done
uv() { .venv/bin/python -m uv pip install -q --python .venv/bin/python "${links[@]}" "$@"; }
uv -r "$req"
# mk itself, editable, so `import mk` works from any directory (its dependencies are the pins above)
uv --no-deps -e .
if [ -n "$chromium_pid" ]; then
  wait "$chromium_pid" \
    || { cat "$chromium_log" >&2; echo "setup: could not install chromium; figures will be written as HTML only" >&2; }
  rm -f "$chromium_log"
fi
echo "setup: .venv ready ($req)"
