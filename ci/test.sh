#!/usr/bin/env bash
# Set up with the test dependencies, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh dev
export JAX_PLATFORMS=cpu
exec .venv/bin/python -m pytest -q "$@"
