"""The decode megakernel (Pallas TPU): one ``pallas_call`` per step that follows the step plan.

Importing this package registers the ``megakernel`` engine (mk.engines).
"""

from ..engines import register_engine
from ..plan import BLOCK
from .engine import MegakernelEngine, make_step
from .kernel import build_call
from .pack import pack

# the kernel reads and writes the cache in aligned blocks of BLOCK positions
register_engine("megakernel", make_step, cache_multiple=BLOCK)

__all__ = ["MegakernelEngine", "build_call", "make_step", "pack"]
