# Sourced by ci/test.sh and ci/main.sh after set-up. Bytecode cached (under .venv, out of the tree) even where the
# machine turns caching off: every test's, notebook's and kernel's process imports JAX (and torch, transformers),
# 2-5 s a process when compiled afresh.
unset PYTHONDONTWRITEBYTECODE
export PYTHONPYCACHEPREFIX="$PWD/.venv/pycache"
