"""TVMScript's macro calls, without reading the source line of every frame on the stack.

A ``T.macro`` called while a kernel parses finds the parser by walking its caller frames to the
first whose globals hold it.  TVM 0.27 walks them with ``inspect.getouterframes``, which builds
a ``FrameInfo`` of every frame first (its module found through ``sys.modules``, its source line
read) before looking at one: most of a wgmma kernel's parse, at every build and at every model
task a kernel is matched to.  ``install`` replaces that lookup with the same walk over
``f_back``: the same frames in the same order, the same parser found or the same error.
"""
from __future__ import annotations

import sys
from typing import Any

replaced: Any = None  # TVM's own lookup, once ``install`` replaced it


def _find_parser_def(self: Any) -> Any:
    from tvm.script.parser.core.parser import ScriptMacro

    frame = sys._getframe(1)  # the caller's frame on (this function's globals are tvm_ext's)
    while frame is not None:
        parser = frame.f_globals.get(ScriptMacro.parser_object_name)
        if parser is not None:
            return parser
        frame = frame.f_back
    raise RuntimeError(f"{ScriptMacro.parser_object_name} not available")



def install() -> bool:
    """Use the frame walk for TVMScript's macros in this process; False where this TVM's
    ``ScriptMacro`` has no ``_find_parser_def`` to replace (its own lookup is kept)."""
    from tvm.script.parser.core.parser import ScriptMacro

    current = getattr(ScriptMacro, "_find_parser_def", None)
    if current is None:
        return False
    if current is not _find_parser_def:
        global replaced
        replaced = current
        ScriptMacro._find_parser_def = _find_parser_def
    return True


def installed() -> bool:
    from tvm.script.parser.core.parser import ScriptMacro

    return getattr(ScriptMacro, "_find_parser_def", None) is _find_parser_def
