#!/usr/bin/env bash
# Set up with the test dependencies, lint, then run the whole test suite.
set -euo pipefail
cd "$(dirname "$0")/.."
bash ci/setup.sh dev
# Lint and format first (pyflakes, pycodestyle, import order; rules in pyproject.toml): a finding fails the run.
.venv/bin/ruff check mk tests ci notebooks
.venv/bin/ruff format --check mk tests ci
export JAX_PLATFORMS=cpu
# Three workers on two cores: the tests wait for subprocesses, wall-clock budgets and the interpreter's device
# threads, which leaves a core idle with one worker per core; a worker that runs dry takes tests queued on another
# (the notebook run and the interpret-mode kernels are minutes each). The slowest tests are listed at the end.
exec .venv/bin/python -m pytest -q -n "${MK_TEST_WORKERS:-3}" --dist worksteal --durations=25 "$@"
