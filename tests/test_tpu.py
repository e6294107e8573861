"""mk.tpu's one use of JAX internals, pinned: the Pallas TPU interpreter's race record.

mk.tpu.races_detected reads private JAX state (``interpret_pallas_call.races``). These tests fail loudly
when a JAX upgrade moves or reshapes it: a kernel that races must be reported, one that does not must
not, and a missing or reshaped record must raise a RuntimeError naming the JAX version."""

import jax
import jax.numpy as jnp
import pytest
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from mk import tpu


def _copy_kernel(wait_before_read: bool):
    def kernel(x_hbm, o_ref, buf, sem):
        c = pltpu.make_async_copy(x_hbm, buf, sem.at[0])
        c.start()
        if wait_before_read:
            c.wait()
            o_ref[...] = buf[...]
        else:
            o_ref[...] = buf[...]  # reads the buffer the DMA is still writing: a race
            c.wait()

    return kernel


def _run(wait_before_read: bool) -> jax.Array:
    x = jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128)
    return pl.pallas_call(
        _copy_kernel(wait_before_read),
        out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
        in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)],
        scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA((1,))],
        interpret=pltpu.InterpretParams(detect_races=True),
    )(x).block_until_ready()


@pytest.fixture(autouse=True)
def fresh_interpreter():
    tpu.reset_interpreter()
    yield
    tpu.reset_interpreter()


def test_no_race_reported_before_any_kernel():
    assert tpu.races_detected() is False


def test_a_read_before_the_dma_wait_is_a_race():
    _run(wait_before_read=False)
    assert tpu.races_detected() is True


def test_a_read_after_the_dma_wait_is_no_race():
    out = _run(wait_before_read=True)
    assert tpu.races_detected() is False
    assert jnp.array_equal(out, jnp.arange(8 * 128, dtype=jnp.float32).reshape(8, 128))


def test_reset_clears_a_race():
    _run(wait_before_read=False)
    assert tpu.races_detected() is True
    tpu.reset_interpreter()
    assert tpu.races_detected() is False
    _run(wait_before_read=True)
    assert tpu.races_detected() is False


def test_a_moved_or_reshaped_record_is_a_clear_error(monkeypatch):
    from jax._src.pallas.mosaic.interpret import interpret_pallas_call as ipc

    monkeypatch.setattr(ipc, "races", object())  # reshaped: no races_found
    with pytest.raises(RuntimeError, match=rf"JAX {jax.__version__}.*changed shape"):
        tpu.races_detected()
    monkeypatch.delattr(ipc, "races")  # moved
    with pytest.raises(RuntimeError, match=rf"JAX {jax.__version__} has no .*interpret_pallas_call\.races"):
        tpu.races_detected()


def test_a_dma_never_waited_on_is_reported_and_fails_its_test(capfd):
    """In mk's interpret mode (DMAs run when started) the interpreter prints a semaphore a kernel leaves nonzero at
    its exit (a chip's core halts on it); mk.tpu.semaphores_left reads the line, and tests/conftest.py fails any test
    whose output holds one. In the interpreter's default mode the DMA never runs and nothing is said."""

    def kernel(x_hbm, o_ref, buf, sem):
        pltpu.make_async_copy(x_hbm, buf, sem.at[0]).start()  # never waited on
        o_ref[...] = jnp.zeros_like(o_ref)

    x = jnp.ones((8, 128), jnp.float32)

    def run(params):
        pl.pallas_call(
            kernel,
            out_shape=jax.ShapeDtypeStruct((8, 128), jnp.float32),
            in_specs=[pl.BlockSpec(memory_space=pltpu.HBM)],
            scratch_shapes=[pltpu.VMEM((8, 128), jnp.float32), pltpu.SemaphoreType.DMA((1,))],
            interpret=params,
        )(x).block_until_ready()
        jax.effects_barrier()
        return tpu.semaphores_left(capfd.readouterr().out)  # read, so this test's own output no longer holds it

    left = run(tpu.interpret_params())
    assert len(left) == 1 and "at kernel exit: 4096" in left[0], left  # the copy's bytes
    assert run(pltpu.InterpretParams()) == []
    _run(wait_before_read=True)
    jax.effects_barrier()
    assert tpu.semaphores_left(capfd.readouterr().out) == []
