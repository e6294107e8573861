#!/usr/bin/env bash
# The main job: set up, then run every notebook through papermill (the longest first) on the CPU defaults,
# writing executed copies to build/notebooks/ and figures to figures/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
# Bytecode cached (under .venv, out of the tree) even where the machine turns caching off: every test's,
# notebook's and kernel's process imports JAX (and torch, transformers), 2-5 s a process when compiled afresh.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$PWD/.venv/pycache"
exec .venv/bin/python ci/run_notebooks.py "$@"
