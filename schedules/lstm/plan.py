"""The LSTM's host plan: the calls of one forward pass, compiling every kernel function into
one module, and how the tuner times it.  The plan's containers are the GRU's (``Call``,
``CompiledGru``: a module, its launches and the calls), as is the step loop."""
from __future__ import annotations

from typing import Any

from tvm_ext.core.space import Config
from tvm_ext.hardware import sm_90a
from tvm_ext.lowering.step_loop import with_min_blocks_per_sm
from tvm_ext.measure.program import Artifact, FailureFlag, RunPlan, compile_functions, plain_json
from tvm_ext.schedules.gru.plan import Call, CompiledGru, check_plan
from tvm_ext.schedules.gru.step_variant import input_buffer
from tvm_ext.target import TargetInfo

from .cell_step import LstmCellStep

BARRIER_TIMEOUT = ("persistent LSTM step kernel: a grid barrier timed out (not every block was resident "
                   "on the GPU); use step_loop 0 or 1")
# Kernel function (name prefix) -> the stages its time counts toward
FUNCTION_STAGES = {"lstm_init": ("step",), "lstm_gemm_x": ("input_gemm",), "lstm_split": ("input_gemm",),
                   "lstm_step": ("step",), "lstm_final_c": ("step",), "lstm_gemm_h": ("step",),
                   "lstm_cell": ("step",), "lstm_hold": ("step",), "lstm_last_h": ("step",),
                   "lstm_h0_products": ("step",), "lstm_inject": ("step",)}  # and lstm_steps
PREPARED = "lstm_split_w"  # the functions of ``prepare_calls``: ``run_plan`` times the pass after them


def prepare_calls(template: Any, config: Config) -> tuple[Call, ...]:
    """The calls run once as the weights are loaded: with ``in_split`` 3 each layer's W_ih split
    into its TF32 parts, in that layer's own buffer."""
    if not config.in_split or template.step_variant(config).fuses_input:
        return ()
    return tuple(Call(f"{PREPARED}{template.input_gemm_kind(layer)}", (f"w_ih{layer}", f"ws{layer}"))
                 for layer in range(template.layers))


def plan_calls(template: Any, config: Config) -> tuple[Call, ...]:
    """Every call of one forward pass, in order: per layer the init (h0 and c0 into the state),
    S1 (with ``in_split`` 3 x's TF32 parts, then the GEMM over them and W_ih's prepared ones), the
    T steps (the variant's calls), then, after the fused step kernel, c_n's copy (the unfused
    cell kernel writes c_n itself).  Variable lengths on the fused steps (``lengths.py``): gi held
    past each row's length (with both directions the backward h0's products added at its first
    step) before the steps, the forward h_n copied from the output after them."""
    step = template.step_variant(config)
    fused = not isinstance(step, LstmCellStep)
    calls = []
    for layer in range(template.layers):
        out = "out" if layer == template.layers - 1 else f"y{layer % 2}"
        state = ("h0", "c0", layer, "hs", *step.barrier_words()) if fused else step.state_args(layer)
        calls.append(Call("lstm_init", state))
        kind = template.input_gemm_kind(layer)
        if step.fuses_input:  # the step kernel projects the input itself
            pass
        elif config.in_split:
            calls.append(Call(f"lstm_split_x{kind}", (input_buffer(layer), f"xs{kind}")))
            calls.append(Call(f"lstm_gemm_x{kind}", (f"xs{kind}", f"ws{layer}", f"b_ih{layer}", "gi")))
        else:
            calls.append(Call(f"lstm_gemm_x{kind}", (input_buffer(layer), f"w_ih{layer}", f"b_ih{layer}", "gi")))
        held = fused and template.variable_lengths  # the unfused cell holds finished rows itself
        if held:
            calls.append(Call("lstm_hold", ("lengths", "gi")))
            if template.bidirectional:
                calls.append(Call("lstm_h0_products", ("h0", f"w_hh{layer}", layer, "gh")))
                calls.append(Call("lstm_inject", ("lengths", "gh", "gi")))
        calls.extend(Call(func, args) for func, args in step.step_calls(layer, out))
        if fused:
            calls.append(Call("lstm_final_c", ("hs", layer, "c_n")))
        if held:
            calls.append(Call("lstm_last_h", ("lengths", out, layer, "h_n")))
    return tuple(calls)


def compile_lstm(template: Any, config: Config, target: TargetInfo) -> CompiledGru:
    """Schedule and compile every kernel function into one module (one source)."""
    import tvm

    scheds = template.kernels(config, target)
    funcs = {name: sch.mod["main"].with_attr("global_symbol", name) for name, sch in scheds.items()}
    modules = {name: sch.mod for name, sch in scheds.items()}
    trace = {name: plain_json(sch.trace.as_json()) for name, sch in scheds.items()}
    step = template.step_variant(config)
    looped = step.looped_steps(scheds.get("lstm_step"), target)
    if looped is not None:  # every step from one call (``tvm_ext.lowering.step_loop``)
        del funcs["lstm_step"], modules["lstm_step"]
        funcs["lstm_steps"] = looped
        modules["lstm_steps"] = tvm.IRModule({"main": funcs["lstm_steps"]})
        trace["lstm_steps"] = trace.pop("lstm_step")
    per_sm = step.lowered_blocks_per_sm(target)
    for name, func in template.lowered_kernels(config).items():  # written as loops: no trace
        func = with_min_blocks_per_sm(func, per_sm) if name == "lstm_steps" else func
        funcs[name] = func.with_attr("global_symbol", name)
        modules[name] = tvm.IRModule({"main": funcs[name]})
        trace[name] = {"lowered": name}
    arch = sm_90a(target) if template.input_on_wgmma(config) else target  # wgmma is an arch-specific instruction
    executable, launches = compile_functions(funcs, target, template.pass_config(config, target), arch)
    calls, prepare = plan_calls(template, config), prepare_calls(template, config)
    check_plan(template.for_config(config).buffers(), prepare + calls, funcs)
    source = "\n".join(m.inspect_source() for m in executable.mod.imports[:1 if target.kind != "cuda" else None])
    return CompiledGru(executable, source, launches, calls, trace, modules, prepare)


def function_stages(name: str) -> tuple[str, ...]:
    """The stages of a kernel function or of one of its device kernels."""
    return next(stages for prefix, stages in FUNCTION_STAGES.items() if name.startswith(prefix))


def run_plan(artifact: Artifact) -> RunPlan:
    """The whole pass timed by the host clock (what a caller of ``LSTM`` waits), one input set,
    the persistent kernel's barrier flag checked, seconds per stage; W_ih's split
    (``prepare_calls``) run once before, untimed."""
    steps = artifact.calls if artifact.kind == "cuda" else artifact.launches
    persistent = any("bar" in step.args for step in steps)
    flag = FailureFlag("bar", 1, BARRIER_TIMEOUT) if persistent else None
    prepared = next((i for i, step in enumerate(steps) if not step.name.startswith(PREPARED)), len(steps))
    return RunPlan(timer="host", rotate_inputs=False, failure_flag=flag,
                   stages=tuple(function_stages(step.name) for step in steps[prepared:]), prepare_steps=prepared)
