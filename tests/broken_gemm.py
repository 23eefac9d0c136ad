"""A GEMM template with a ``mode`` knob that makes real failures on purpose.

ok            -> the normal GEMM schedule
compile_error -> the schedule asks TVM for a block that does not exist (real TVM error)
trap          -> the kernel writes gigabytes past its output buffer (kills the run process)
wrong         -> the kernel computes A·B + K/2 (a real, wrong kernel)
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm_ext.schedules.gemm.simt import KNOBS, GemmTemplate
from tvm_ext.core.space import Config, Knob, Space
from tvm_ext.target import TargetInfo

MODES = ("ok", "compile_error", "trap", "wrong")


@dataclass(frozen=True)
class BrokenGemm(GemmTemplate):
    name = "broken_gemm"

    def space(self, target: TargetInfo) -> Space:
        base = super().space(target)
        strip = lambda c: Config(tuple(kv for kv in c.items if kv[0] != "mode"))  # noqa: E731
        return Space(KNOBS + (Knob("mode", MODES),),
                     tuple(lambda c, f=f: f(strip(c)) for f in base.constraints))

    def default_config(self, target: TargetInfo) -> Config:
        return Config(GemmTemplate(self.m, self.n, self.k).default_config(target).items + (("mode", "ok"),))

    def schedule(self, config: Config, target: TargetInfo) -> Any:
        from tvm import s_tir, te

        mode = config["mode"]
        plain = Config(tuple(kv for kv in config.items if kv[0] != "mode"))
        if mode == "trap":
            return s_tir.Schedule(_trap_func(self.m, self.n, self.k))
        sch = super().schedule(plain, target)
        if mode == "compile_error":
            sch.get_sblock("no_such_block")
        if mode == "wrong":
            a = te.placeholder((self.m, self.k), "float32", name="A")
            b = te.placeholder((self.k, self.n), "float32", name="B")
            r = te.reduce_axis((0, self.k), name="k")
            c = te.compute((self.m, self.n), lambda i, j: te.sum(a[i, r] * b[r, j] + 0.5, axis=r), name="C")
            sch = s_tir.Schedule(te.create_prim_func([a, b, c]))
            blk = sch.get_sblock("C")
            i, j, _ = sch.get_loops(blk)
            sch.bind(i, "blockIdx.x")
            sch.bind(j, "threadIdx.x")
        return sch


def _trap_func(m: int, n: int, k: int) -> Any:
    from tvm.script import tirx as T

    @T.prim_func(s_tir=True)
    def main(A: T.Buffer((m, k), "float32"), B: T.Buffer((k, n), "float32"),
             C: T.Buffer((1 << 30,), "float32")):
        for i in T.thread_binding(8, thread="threadIdx.x"):
            with T.sblock("C"):
                vi = T.axis.spatial(8, i)
                C[vi * 100000000 + 500000000] = A[0, 0]

    return main
