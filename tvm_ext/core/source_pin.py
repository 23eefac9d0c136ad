"""The source text of the modules that hold TVMScript, fixed when they are imported.

TVMScript parses a ``T.prim_func`` or ``T.macro`` from its module's source file each time the
decorator runs (in the templates: at every build), through ``linecache``, which re-reads a file
whose size or modification time changed.  A package upgraded or a checkout edited under a running
tuner would then build kernels from the new text under the old template hash (``modules_hash``,
taken once a process), or fail to find a macro whose lines moved.  A pinned file's lines stay in
``linecache`` as they were read at import (an entry without a modification time is never
checked), so every build of the process, and the hash, use the code it imported.
"""
from __future__ import annotations

import linecache
import os


def pin_source(path: str) -> None:
    """Keep ``path``'s current lines in ``linecache`` for the rest of the process."""
    linecache.checkcache(path)  # an entry read before the file last changed is dropped first
    lines = linecache.getlines(path)
    if lines:
        linecache.cache[path] = (sum(map(len, lines)), None, lines, path)


def pin_package_sources(package_file: str) -> None:
    """Pin every ``.py`` file under the folder of a package's ``__init__.py`` (``__file__``):
    called as the package is imported, before any module of it, so the text pinned is the text
    its modules are then compiled from."""
    root = os.path.dirname(os.path.abspath(package_file))
    for folder, _, names in os.walk(root):
        for name in sorted(names):
            if name.endswith(".py"):
                pin_source(os.path.join(folder, name))


def is_pinned(path: str) -> bool:
    """Whether ``path``'s lines are pinned (kept whatever happens to the file)."""
    entry = linecache.cache.get(path)
    return entry is not None and len(entry) == 4 and entry[1] is None
