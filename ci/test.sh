#!/usr/bin/env bash
# Set up with the test dependencies, lint, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh dev
# Lint and format first (pyflakes, pycodestyle, import order; rules in pyproject.toml): a finding fails the run.
.venv/bin/ruff check mk tests ci notebooks
.venv/bin/ruff format --check mk tests ci
export JAX_PLATFORMS=cpu
exec .venv/bin/python -m pytest -q "$@"
