"""A running process builds its kernels from the code it imported: the files of the modules that
hold TVMScript are pinned at import, so an edit or upgrade on disk under a running tuner changes
neither the kernels it builds nor breaks them (TVMScript re-reads the file at every decoration)."""
from __future__ import annotations

import importlib.util
import os
import sys

import tvm_ext.lowering
import tvm_ext.schedules
from tvm_ext.core.source_pin import is_pinned, pin_source

KERNEL = '''
def build():
    from tvm.script import tirx as T

    @T.prim_func
    def fill(a: T.Buffer((4,), "float32")):
        for i in range(4):
            a[i] = T.float32({value})

    return fill
'''


def _import(path: str, name: str):  # type: ignore[no-untyped-def]
    spec = importlib.util.spec_from_file_location(name, path)
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module
    spec.loader.exec_module(module)
    return module


def _edit(path: str) -> None:
    """Another value, two lines further down (the function's first line no longer matches)."""
    with open(path, "w") as f:
        f.write("# edited\n# under the running process\n" + KERNEL.format(value=7))


def test_a_pinned_module_builds_what_it_imported_after_its_file_changes(tmp_path):
    pinned_path, loose_path = str(tmp_path / "pinned_kernel.py"), str(tmp_path / "loose_kernel.py")
    for path in (pinned_path, loose_path):
        with open(path, "w") as f:
            f.write(KERNEL.format(value=3))
    pinned, loose = _import(pinned_path, "pinned_kernel"), _import(loose_path, "loose_kernel")
    pin_source(pinned_path)
    before = {"pinned": pinned.build().script(), "loose": loose.build().script()}
    assert "T.float32(3.0)" in before["pinned"]
    _edit(pinned_path)
    _edit(loose_path)
    assert pinned.build().script() == before["pinned"]
    # the same module unpinned: TVMScript reads the edited file (another kernel, or no function at
    # the line the imported code names): what the pin prevents
    try:
        changed = loose.build().script() != before["loose"]
    except Exception:  # noqa: BLE001 - a parse of the wrong lines is the other way it goes wrong
        changed = True
    assert changed


def test_every_module_holding_tvmscript_is_pinned_once_its_package_is_imported():
    roots = [os.path.dirname(tvm_ext.schedules.__file__), os.path.dirname(tvm_ext.lowering.__file__)]
    holding = []
    for root in roots:
        for folder, _, names in os.walk(root):
            for name in names:
                path = os.path.join(folder, name)
                if name.endswith(".py") and "tirx as T" in open(path).read():
                    holding.append(path)
    assert len(holding) >= 20  # the GEMM, reduction and GRU kernels, and the step loop
    assert [p for p in holding if not is_pinned(p)] == []
