"""No libtpu start-up noise on a machine without a TPU: importing mk describes the host to libtpu
(mk.tpu.quiet_libtpu), so neither the command line, JAX's backend initialisation nor an AOT topology
prints libtpu's "could not determine TPU accelerator type" or ``E0000 ... INVALID_ARGUMENT`` lines."""

import importlib.util
import os
import subprocess
import sys

import pytest

from mk import tpu

NOISE = (
    "E0000",
    "INVALID_ARGUMENT",
    "TPU accelerator type",
    "worker hostname",
    "Logging before InitGoogle",
    "IProgress not found",
)

pytestmark = pytest.mark.skipif(tpu.tpu_chips_present(), reason="a TPU is attached: libtpu has real metadata")


def _run(*args: str) -> subprocess.CompletedProcess:
    # A fresh process, as a user starts one: without the host description this test process's own
    # `import mk` put in the environment, and with JAX free to try the TPU backend (ci/test.sh sets
    # JAX_PLATFORMS=cpu). Several processes may load libtpu at once (parallel tests).
    env = {k: v for k, v in os.environ.items() if k not in tpu._LIBTPU_HOST_VARS and k != "JAX_PLATFORMS"}
    env["ALLOW_MULTIPLE_LIBTPU_LOAD"] = "1"
    return subprocess.run([sys.executable, *args], capture_output=True, text=True, timeout=300, env=env)


def _noise(stderr: str) -> list[str]:
    return [line for line in stderr.splitlines() if any(n in line for n in NOISE)]


def test_cli_sol_prints_no_libtpu_noise():
    r = _run("-m", "mk", "sol", "--model", "gemma4-26b-a4b", "--chip", "tpu-v5e-8", "--context", "1024")
    assert r.returncode == 0, r.stderr
    assert _noise(r.stderr) == [], r.stderr


@pytest.mark.skipif(importlib.util.find_spec("libtpu") is None, reason="needs libtpu (the noise is its own)")
def test_backend_start_and_aot_topology_print_no_libtpu_noise():
    work = "import jax; jax.devices(); from mk.tpu import topology; topology('tpu-v5e')"
    bare = _run("-c", "import jax; jax.devices()")  # the same start without mk: libtpu's noise is there
    if not _noise(bare.stderr):
        pytest.skip("this libtpu starts quietly on its own; mk.tpu.quiet_libtpu may no longer be needed")
    r = _run("-c", f"import mk; {work}")
    assert r.returncode == 0, r.stderr
    assert _noise(r.stderr) == [], r.stderr
