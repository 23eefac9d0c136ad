"""The GRU's host plan: the calls of one forward pass (every launch of every step of every
layer, scalars and buffer names), compiling every kernel function into one module, and
the builder and runner hooks that build and measure the whole pass.

The per-step loop is host code that only enqueues compiled kernels: the step index and
layer are scalar kernel arguments, the hidden state ping-pongs between two buffers, and
nothing per element happens in Python.  On CUDA the fused step kernel can also run every
step from one call (knob ``step_loop``, ``tvm_ext.lowering.step_loop``): a loop in TVM's host
function, or a persistent kernel whose blocks meet at a grid barrier between steps (its
state ping-pongs inside one buffer, ``hs``, indexed by the step's parity).
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from tvm_ext.measure.program import FailureFlag, RunPlan
from tvm_ext.measure.program import (Artifact, CompiledProgram, TensorSpec, bind_launches, compile_functions,
                                     function_calls, plain_json)
from tvm_ext.hardware import sm_90a
from tvm_ext.lowering.launch_early import mark_launch_early
from tvm_ext.lowering.step_loop import with_min_blocks_per_sm
from tvm_ext.core.space import Config
from tvm_ext.target import TargetInfo

from .compute import function_stages
from .step_variant import input_buffer


PREPARED = "gru_split_w"  # what the functions (and kernels) of ``prepare_calls`` are named by: ``run_plan``


@dataclass(frozen=True)
class Call:
    """One host call of the plan: a kernel function and its arguments in parameter order."""

    func: str
    args: tuple[str | int, ...]  # plan buffer names, or scalar ints (step, layer)


def prepare_calls(template: Any, config: Config) -> tuple[Call, ...]:
    """The calls that prepare what the weights give, once as they are loaded rather than in
    every pass: each layer's W_ih split into its float16 or TF32 parts (``in_split``), into
    that layer's own part buffer, and what the step kernel asks of W_hh
    (``StepVariant.prepare_calls``)."""
    step = template.step_variant(config)
    calls = [Call(func, args) for layer in range(template.layers) for func, args in step.prepare_calls(layer)]
    if not config.in_split or step.fuses_input:
        return tuple(calls)
    return tuple(Call(f"{PREPARED}{template.input_gemm_kind(layer)}", (f"w_ih{layer}", f"ws{layer}"))
                 for layer in range(template.layers)) + tuple(calls)


def plan_calls(template: Any, config: Config) -> tuple[Call, ...]:
    """Every call of one forward pass, in order: per layer init, S1 (none where the step kernel
    runs it, ``StepVariant.fuses_input``), then T steps (the step kernel's calls are its
    variant's, ``StepVariant.step_calls``); W_ih's parts come from ``prepare_calls``."""
    calls = []
    step = template.step_variant(config)
    counted = ("gi_ready",) if template.counted_gemm_tile(config) is not None else ()  # ``step_overlap``
    for layer in range(template.layers):
        x = input_buffer(layer)
        out = "out" if layer == template.layers - 1 else f"y{layer % 2}"
        kind = template.input_gemm_kind(layer)  # the input GEMM of this depth
        gemm_x = f"gru_gemm_x{kind}"
        calls.append(Call("gru_init", step.state_args(layer)))
        if step.fuses_input:  # the step kernel runs x·W_ihᵀ + b_ih itself
            pass
        elif config.in_split:  # float16 parts of x (W_ih's prepared), then the GEMM of depth 3K (``split.py``)
            calls.append(Call(f"gru_split_x{kind}", (x, f"xs{kind}")))
            calls.append(Call(gemm_x, (f"xs{kind}", f"ws{layer}", f"b_ih{layer}", "gi", *counted)))
        else:
            calls.append(Call(gemm_x, (x, f"w_ih{layer}", f"b_ih{layer}", "gi", *counted)))
        if template.variable_lengths:  # rows past their length hold their state (``lengths.py``)
            calls.append(Call("gru_hold", ("lengths", "gi")))
        calls.extend(Call(func, args) for func, args in step.step_calls(layer, out))
    if template.variable_lengths:
        calls.append(Call("gru_zero_out", ("lengths", "out")))
    return tuple(calls)


def compile_gru(template: Any, config: Config, target: TargetInfo) -> "CompiledGru":
    """Schedule and compile every kernel function into one module (one source)."""
    import tvm

    scheds = template.kernels(config, target)
    funcs = {name: sch.mod["main"].with_attr("global_symbol", name) for name, sch in scheds.items()}
    modules = {name: sch.mod for name, sch in scheds.items()}
    trace = {name: plain_json(sch.trace.as_json()) for name, sch in scheds.items()}
    looped = template.step_variant(config).looped_steps(scheds.get("gru_step"), target)
    if looped is not None:  # every step from one call (``tvm_ext.lowering.step_loop``)
        funcs["gru_steps"] = looped
        modules["gru_steps"] = tvm.IRModule({"main": funcs["gru_steps"]})
        trace["gru_steps"] = trace.pop("gru_step")
        for table in (funcs, modules):
            del table["gru_step"]
    per_sm = template.step_variant(config).lowered_blocks_per_sm(target)
    for name, func in template.lowered_kernels(config).items():  # written as loops: no schedule trace
        func = with_min_blocks_per_sm(func, per_sm) if name == "gru_steps" else func
        funcs[name] = func.with_attr("global_symbol", name)
        modules[name] = tvm.IRModule({"main": funcs[name]})
        trace[name] = {"lowered": name}
    # wgmma is an arch-specific instruction: the module is built for sm_90a
    wgmma = template.input_on_wgmma(config) or config.hid_wgmma or template.step_variant(config).uses_wgmma
    arch = sm_90a(target) if wgmma else target
    if template.counted_gemm_tile(config) is not None:  # the step kernel launched while the input GEMM runs
        funcs["gru_steps"] = mark_launch_early(funcs["gru_steps"])
    executable, launches = compile_functions(funcs, target, template.pass_config(config, target), arch)
    plan, prepare = plan_calls(template, config), prepare_calls(template, config)
    check_plan(template.for_config(config).buffers(), prepare + plan, funcs)
    # CUDA may split the kernels over several device modules (the persistent step loop's is its own)
    source = "\n".join(m.inspect_source() for m in executable.mod.imports[:1 if target.kind != "cuda" else None])
    return CompiledGru(executable, source, launches, plan, trace, modules, prepare)


def check_plan(specs: Mapping[str, TensorSpec], plan: Sequence[Call], funcs: Mapping[str, Any]) -> None:
    """Every buffer a call passes has the shape and dtype its kernel declares (TVM's
    runtime checks them on CUDA; OpenCL would silently misread)."""
    for call in plan:
        params = funcs[call.func].params
        if len(params) != len(call.args):
            raise RuntimeError(f"{call.func} takes {len(params)} arguments, the plan passes {len(call.args)}")
        for param, arg in zip(params, call.args):
            if not isinstance(arg, str):
                continue
            if tuple(int(x) for x in param.shape) != specs[arg].shape:
                raise RuntimeError(f"{call.func}: buffer {arg} {specs[arg].shape} passed as {param.name} "
                                   f"{tuple(int(x) for x in param.shape)}")
            if str(param.dtype) != specs[arg].dtype:
                raise RuntimeError(f"{call.func}: buffer {arg} ({specs[arg].dtype}) passed as {param.name} "
                                   f"({param.dtype})")


@dataclass(frozen=True)
class CompiledGru:
    """One compiled module holding every kernel of the plan, and the plan itself: ``calls``
    each pass, after ``prepare`` once as the weights are loaded."""

    executable: Any  # tvm.runtime.Executable
    source: str  # OpenCL C or CUDA source of all kernels
    launches: dict[str, Any]  # function -> (its device kernel launches, its parameter names)
    calls: tuple[Call, ...]
    trace: Any  # function -> schedule trace (plain JSON)
    modules: dict[str, Any]  # function -> its scheduled IRModule (TVMScript of generated programs)
    prepare: tuple[Call, ...] = ()  # ``prepare_calls``

    def kernel_launches(self) -> tuple[Any, ...]:
        """``prepare`` then the plan as device kernel launches, arguments bound to plan buffers
        and scalars (a host loop's index, ``loop:<var>``, stays: such a kernel runs from its
        function only)."""
        return bind_launches(self.launches, [(c.func, c.args) for c in self.prepare + self.calls])

    def function_calls(self) -> tuple[Any, ...]:
        """``prepare`` then the plan for TVM's runtime (CUDA): one entry per call, named by function."""
        return function_calls(self.launches, [(c.func, c.args) for c in self.prepare + self.calls])

    def prepared_steps(self, kind: str) -> int:
        """How many of the first steps (``kernel_launches`` on OpenCL, ``function_calls`` on
        CUDA) are ``prepare``'s: an executor's ``prepared``."""
        calls = [(c.func, c.args) for c in self.prepare]
        return len(function_calls(self.launches, calls) if kind == "cuda" else bind_launches(self.launches, calls))

    def program(self, kind: str, params: tuple[str, ...]) -> CompiledProgram:
        """The compiled plan as the builder's program: OpenCL runs the device kernel launches,
        CUDA calls the module's functions."""
        return CompiledProgram(kind, self.executable, self.source, self.kernel_launches(), self.function_calls(),
                               params, self.modules, self.trace)


BARRIER_TIMEOUT = ("persistent GRU step kernel: a grid barrier timed out (not every block was resident "
                   "on the GPU); use step_loop 0 or 1")


def barrier_timed_out(persistent: bool, executor: Any) -> bool:
    """Whether a persistent step kernel raised its barrier's timed-out flag (its results are
    then wrong: blocks went on without their neighbours' state)."""
    return persistent and bool(executor.read("bar")[1])


def build_program(template: Any, config: Config, target: TargetInfo) -> CompiledProgram:
    """The whole forward pass as one program (see ``CompiledGru``), its buffers ``buffers()``."""
    return compile_gru(template, config, target).program(target.kind, tuple(template.for_config(config).buffers()))


def run_plan(artifact: Artifact) -> RunPlan:
    """How the tuner times a forward pass: the host clock around back-to-back passes (what a
    caller of ``GRU`` waits), one input set, the persistent kernel's barrier flag checked,
    and seconds per stage (``stage_secs``: each launch, or each call on CUDA, counts toward
    its function's stages, the fused step kernel toward both "hidden_gemm" and "cell")."""
    steps = artifact.calls if artifact.kind == "cuda" else artifact.launches
    persistent = any("bar" in step.args for step in steps)
    flag = FailureFlag("bar", 1, BARRIER_TIMEOUT) if persistent else None
    prepared = next((i for i, step in enumerate(steps) if not step.name.startswith(PREPARED)), len(steps))
    return RunPlan(timer="host", rotate_inputs=False, failure_flag=flag,
                   stages=tuple(function_stages(step.name) for step in steps[prepared:]), prepare_steps=prepared)
