"""inspect's module lookup for frames of code without a file, answered without a scan.

TVMScript's decorators (``T.prim_func``, ``I.ir_module``, ``R.function``) take ``inspect.stack()``
as they run: a ``FrameInfo`` of every frame on the stack, whose module ``inspect.getmodule`` looks
up by the frame's file name.  A frame of code that has no file (``<frozen importlib._bootstrap>``
while a module imports, ``<frozen runpy>`` under ``python -m``, ``<string>``, ``<stdin>``,
``<ast>``) is in none of its caches, so each lookup copies and walks all of ``sys.modules`` before
answering None.  Importing ``tvm.s_tir.tensor_intrin`` (572 kernels; dlight's matmul rule imports
it at the first compile of a model) took 33 s so on a 2-core machine, 42 s with torch loaded.
``install`` enters those names in inspect's cache under a module name no module has: the lookup
answers the same None at once, so every ``FrameInfo`` is the same as before.
"""
from __future__ import annotations

import inspect
import sys

PSEUDO_FILES = ("<frozen importlib._bootstrap>", "<frozen importlib._bootstrap_external>", "<frozen runpy>",
                "<string>", "<stdin>", "<ast>")
NO_MODULE = "<code without a file>"  # the module name they map to: none in sys.modules has it


def install() -> bool:
    """Map ``PSEUDO_FILES`` to no module in inspect's file cache, where no loaded module claims
    one of them as its file; False where this Python's inspect keeps no such cache."""
    cache = getattr(inspect, "modulesbyfile", None)
    if not isinstance(cache, dict) or NO_MODULE in sys.modules:
        return False
    claimed = {getattr(m, "__file__", None) for m in list(sys.modules.values())}
    for name in PSEUDO_FILES:
        if name not in claimed:
            cache.setdefault(name, NO_MODULE)
    return True
