#!/usr/bin/env bash
# The main job: set up, then run every notebook through papermill (the longest first) on the CPU defaults,
# writing executed copies to build/notebooks/ and figures to figures/.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh
source ci/env.sh  # bytecode cached
exec .venv/bin/python ci/run_notebooks.py "$@"
