"""The decode megakernel (Pallas TPU): one ``pallas_call`` per step that follows the step plan.

Importing this package registers the ``megakernel`` engine with mk.generate.
"""

from ..generate import register_engine
from .kernel import MegakernelEngine, build_call, make_step, pack

register_engine("megakernel", make_step)

__all__ = ["MegakernelEngine", "build_call", "make_step", "pack"]
