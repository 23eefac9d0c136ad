"""Frames of code without a file (``tvm_ext.core.frame_files``): inspect finds their module (none)
from its cache, without walking ``sys.modules``, and ``inspect.stack()`` is what it was."""
from __future__ import annotations

import inspect
import sys
import types

import tvm_ext  # noqa: F401 (installs the cache entries)
from tvm_ext.core import frame_files


class _CountingModule(types.ModuleType):
    """A module that counts how often its ``__file__`` is read (inspect's scan reads every one)."""

    reads = 0

    @property
    def __file__(self):  # noqa: D401
        type(self).reads += 1
        return "/nowhere/counting.py"


def _run_as(filename: str, source: str) -> dict:
    namespace: dict = {"inspect": inspect, "sys": sys}
    exec(compile(source, filename, "exec"), namespace)  # noqa: S102 (our own test source)
    return namespace


def _without_entries(monkeypatch) -> None:
    for name in frame_files.PSEUDO_FILES:
        monkeypatch.delitem(inspect.modulesbyfile, name, raising=False)


def test_a_frame_without_a_file_is_looked_up_without_walking_sys_modules(monkeypatch):
    monkeypatch.setitem(sys.modules, "tvm_ext_counting_module", _CountingModule("tvm_ext_counting_module"))
    frame = _run_as("<string>", "frame = sys._getframe()")["frame"]
    _CountingModule.reads = 0
    installed = (inspect.getmodule(frame, "<string>"), inspect.getsourcefile(frame))
    assert _CountingModule.reads == 0
    _without_entries(monkeypatch)
    assert (inspect.getmodule(frame, "<string>"), inspect.getsourcefile(frame)) == installed == (None, None)
    assert _CountingModule.reads > 0  # the scan the entries spare


FRAMES = "[(f.filename, f.lineno, f.function, f.code_context, f.index) for f in inspect.stack()]"


def test_the_stack_is_the_same_with_and_without_the_entries(monkeypatch, tmp_path):
    """Inside code without a file, and in a module's top level as it imports (the import
    system's frozen frames below it): every frame's file, line, function and source line."""
    grabs = {name: _run_as(name, f"def grab():\n    return {FRAMES}\n")["grab"]
             for name in ("<string>", "<ast>", "<stdin>")}
    (tmp_path / "tvm_ext_stack_probe.py").write_text(f"import inspect\nFRAMES = {FRAMES}\n")
    monkeypatch.syspath_prepend(str(tmp_path))

    def imported():
        sys.modules.pop("tvm_ext_stack_probe", None)
        return __import__("tvm_ext_stack_probe").FRAMES

    for grab in (*grabs.values(), imported):
        seen = []
        for entries in (True, False):
            with monkeypatch.context() as patch:
                if not entries:
                    _without_entries(patch)
                seen.append(grab())
        assert seen[0] == seen[1] and len(seen[0]) > 3
    assert any(f[0] == "<frozen importlib._bootstrap>" for f in seen[0])
    assert grabs["<ast>"]()[0][:3] == ("<ast>", 2, "grab")


def test_install_leaves_a_name_a_module_claims_as_its_file(monkeypatch):
    claimed = types.ModuleType("tvm_ext_claims_stdin")
    claimed.__file__ = "<stdin>"
    monkeypatch.setitem(sys.modules, "tvm_ext_claims_stdin", claimed)
    _without_entries(monkeypatch)
    assert frame_files.install()
    assert "<stdin>" not in inspect.modulesbyfile and inspect.modulesbyfile["<string>"] == frame_files.NO_MODULE
    assert frame_files.NO_MODULE not in sys.modules
