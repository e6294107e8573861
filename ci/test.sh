#!/usr/bin/env bash
# Set up with the test dependencies, lint, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh dev
# Lint and format first (pyflakes, pycodestyle, import order; rules in pyproject.toml): a finding fails the run.
.venv/bin/ruff check mk tests ci notebooks
.venv/bin/ruff format --check mk tests ci
export JAX_PLATFORMS=cpu
source ci/env.sh  # bytecode cached
# Two workers (one per core here), a worker that runs dry taking tests queued on the other (the notebook run and
# the interpret-mode kernels are minutes each); the slowest tests are listed at the end, so the next cut is measured.
exec .venv/bin/python -m pytest -q -n "${MK_TEST_WORKERS:-2}" --dist worksteal --durations=25 "$@"
