"""TVMScript macros find their parser by a plain frame walk (``tvm_ext.core.script_macro``): the
same kernels as TVM's own lookup, without building every outer frame's info."""
from __future__ import annotations

import inspect
import sys

import pytest
import tvm
from tvm.script import tirx as T
from tvm.script.parser.core.parser import ScriptMacro

import schedules  # noqa: F401 - installs the walk, as every template's import does
from tvm_ext.core import script_macro


@T.macro
def _scaled_store(buf, i, factor):
    buf[i] = buf[i] * T.float32(factor)


def _store_twice(buf, i):  # a macro reached through Python frames of the kernel's own
    _scaled_store(buf, i, 2.0)
    _scaled_store(buf, i, 3.0)


def _kernel():
    @T.prim_func(private=True)
    def scale(a: T.Buffer((8,), "float32")):
        for i in range(8):
            _store_twice(a, i)
            _scaled_store(a, i, 0.5)

    return scale


def test_templates_install_the_frame_walk():
    assert script_macro.installed() and ScriptMacro._find_parser_def is script_macro._find_parser_def
    assert script_macro.replaced is not None and script_macro.replaced.__module__ == ScriptMacro.__module__


def test_a_kernel_with_macros_parses_as_with_tvms_own_lookup_without_building_frame_infos(monkeypatch):
    """The walk visits the frames TVM's ``getouterframes`` would, in its order: the kernel is the
    same; and a macro call never asks ``inspect`` for the frames' infos (each reading its source
    line; the ``T.prim_func`` decorator's one ``inspect.stack`` is TVM's and stays)."""
    original = inspect.getouterframes
    callers: list[str] = []

    def recorded(*args, **kwargs):
        callers.append(sys._getframe(1).f_code.co_name)
        return original(*args, **kwargs)

    monkeypatch.setattr(inspect, "getouterframes", recorded)
    walked = _kernel()
    assert "_find_parser_def" not in callers and callers, callers
    with monkeypatch.context() as patch:
        patch.setattr(ScriptMacro, "_find_parser_def", script_macro.replaced)
        callers.clear()
        tvms = _kernel()
    assert callers.count("_find_parser_def") == 3  # TVM's lookup: one a macro call
    tvm.ir.assert_structural_equal(walked, tvms)
    assert walked.script() == tvms.script()
    assert walked.script().count("T.float32(2.0)") == 1 and "T.float32(0.5)" in walked.script()


def test_a_macro_called_outside_a_parse_fails_as_with_tvms_own_lookup(monkeypatch):
    buf = tvm.tirx.decl_buffer((8,), "float32")
    with pytest.raises(RuntimeError, match="__current_script_parser__ not available"):
        _scaled_store(buf, 0, 2.0)
    monkeypatch.setattr(ScriptMacro, "_find_parser_def", script_macro.replaced)
    with pytest.raises(RuntimeError, match="__current_script_parser__ not available"):
        _scaled_store(buf, 0, 2.0)
