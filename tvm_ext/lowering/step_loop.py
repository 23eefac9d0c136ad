"""A per-step kernel run for all T steps from one call: the step loop compiled into
TVM's host code, or inside one persistent launch with a grid barrier between steps.

Why: a recurrent layer's step kernel does microseconds of work, so issuing it from
Python once per step makes the host the bottleneck (the GRU at small batch;
docs/results/gru.md).  Both forms take a scheduled kernel whose only per-step argument is
a scalar ``step`` (its state must ping-pong inside one buffer indexed by the step's
parity) and remove ``step`` from its signature.

- ``HOST``: the kernel is launched T times by a loop in the compiled host function
  (no Python between launches; works for any grid).
- ``PERSISTENT`` (CUDA): the loop runs inside the kernel; after each step every
  block meets at a grid barrier (an atomic counter in a 2-int buffer ``bar`` that
  must be zeroed before the launch; its word 1 is set if a barrier timed out; how
  blocks arrive and poll is the caller's choice of ``BARRIERS``).  All
  blocks must be resident at once, so callers keep the grid within what the SMs
  hold (``min_blocks_per_sm`` caps registers so several blocks fit); a barrier that
  still waits ``SPIN_LIMIT`` polls gives up and raises the flag, so a non-resident
  grid gives a wrong answer, never a hang.  Fills no step changes (a weight tile in
  shared memory or registers) can run once before the loop (``hoist``), and fills of a
  step's own inputs a step ahead, before the barrier, so their loads overlap it (``early``).
"""
from __future__ import annotations

from typing import Any

HOST = "host"
PERSISTENT = "persistent"
MODES = (HOST, PERSISTENT)
SPIN_LIMIT = 1 << 21  # polls of the counter (~1 s on an H100) before a barrier gives up
BARRIER_WORDS = 2  # [arrivals, timed-out flag]


def lower_to_loops(mod: Any, target: Any) -> Any:
    """The ``main`` PrimFunc of a scheduled module with its blocks lowered away (the
    s_tir pipeline up to ``LowerOpaqueBlock``): thread bindings become the leading
    ``thread_extent`` attributes and the rest is loops, so a step loop can be put
    around or inside the launch.  ``tvm.compile`` finishes the lowering."""
    import tvm
    from tvm import s_tir
    from tvm.target import Target

    tgt = Target(target.tvm_target()).with_host(Target("llvm"))
    passes = [
        tvm.tirx.transform.BindTarget(tgt),
        s_tir.transform.CanonicalizeLoop(),
        s_tir.transform.LowerCrossThreadReduction(),
        s_tir.transform.LowerInitBlock(),
        s_tir.transform.PlanAndUpdateBufferAllocationLocation(),
        s_tir.transform.ConvertBlocksToOpaque(),
        s_tir.transform.LiftThreadBinding(),
        s_tir.transform.ManifestSharedMemoryLocalStage(),
        s_tir.transform.CompactBufferAllocation(),
        s_tir.transform.LowerAutoCopy(),
        s_tir.transform.UnifyThreadBinding(),
        s_tir.transform.LowerMatchBuffer(),
        s_tir.transform.StmtSimplify(),
        s_tir.transform.InjectPermutedLayout(),
        s_tir.transform.AnnotateIrregularLoop(),
        s_tir.transform.InjectSoftwarePipeline(),
        s_tir.transform.TransformMmaBufferLayout(),
        s_tir.transform.LowerOpaqueBlock(),
    ]
    return tvm.ir.transform.Sequential(passes)(mod)["main"]


def launch_chain(body: Any) -> tuple[list[Any], Any]:
    """The leading ``thread_extent`` attributes of a lowered kernel and what they wrap."""
    import tvm

    chain = []
    while isinstance(body, tvm.tirx.AttrStmt) and body.attr_key == "thread_extent":
        chain.append(body)
        body = body.body
    return chain, body


def rewrap(chain: list[Any], body: Any) -> Any:
    """``body`` inside the ``thread_extent`` attributes ``launch_chain`` took off."""
    import tvm

    for attr in reversed(chain):
        body = tvm.tirx.AttrStmt(attr.node, attr.attr_key, attr.value, body)
    return body


def min_blocks_bound(body: Any, blocks: int) -> Any:
    """``body`` (inside a kernel's launch attributes) marked so the kernel is compiled with
    ``__launch_bounds__(threads, blocks)`` (read by SplitHostDevice): nvcc keeps a lane's
    registers to what ``blocks`` blocks an SM leave it; ``body`` itself where ``blocks`` is 1."""
    from tvm import tirx

    if blocks <= 1:
        return body
    return tirx.AttrStmt(tirx.const(0, "int32"), "tirx.launch_bounds_min_blocks_per_sm",
                         tirx.const(blocks, "int32"), body)


def with_min_blocks_per_sm(func: Any, blocks: int) -> Any:
    """``func`` (a lowered kernel) with its body under ``min_blocks_bound``."""
    chain, inner = launch_chain(func.body)
    return func.with_body(rewrap(chain, min_blocks_bound(inner, blocks)))


# Grid barriers of the persistent form: how the leader thread of each block arrives and
# waits.  All three fence the block's writes before arriving and keep the timed-out flag.
BARRIER_ATOMIC = "atomic"  # arrive with atomicAdd, poll with atomicAdd(ptr, 0), fences both sides
BARRIER_VOLATILE = "volatile"  # arrive with atomicAdd, poll with volatile loads (cooperative groups' way)
BARRIER_ACQUIRE = "acquire"  # arrive with a release add, poll with acquire loads, no trailing fence
BARRIERS = (BARRIER_ATOMIC, BARRIER_VOLATILE, BARRIER_ACQUIRE)
# PTX memory orders and scopes as the ``__nv_atomic_*`` builtins number them (CUDA >= 12.8)
NV_ATOMIC_RELAXED, NV_ATOMIC_ACQUIRE, NV_ATOMIC_RELEASE, NV_SCOPE_DEVICE = 0, 2, 3, 3


def _barrier_template(kind: str = BARRIER_ATOMIC) -> Any:
    """Grid barrier for one block: everyone syncs, one leader thread arrives on the counter
    and polls it until ``expected`` blocks have arrived (or SPIN_LIMIT polls pass: then it
    raises the flag), then everyone syncs again; the state written in the step is visible to
    every block after it (``BARRIERS`` says how each kind orders it).

    Why the poll is an atomic, volatile or acquire access: a plain load of ``bar`` (a
    ``__restrict__`` parameter the spin loop does not write) is loop-invariant to the
    compiler, which may hoist it out of the loop, and a weak load may be served by the SM's
    incoherent L1.  (An earlier attempt with ``__ldcv`` loads timed out on every multi-block
    grid on the H100; nvcc keeps that load inside the loop, so the cause was elsewhere.)"""
    from tvm.script import tirx as T

    if kind not in BARRIERS:
        raise ValueError(f"unknown grid barrier {kind!r}; allowed: {', '.join(BARRIERS)}")
    limit = SPIN_LIMIT

    def poll(bar: Any) -> Any:
        if kind == BARRIER_ATOMIC:
            return T.call_extern("int32", "atomicAdd", T.address_of(bar[0]), 0)
        if kind == BARRIER_VOLATILE:  # prints as *(volatile int*)(&bar[0]): a load nvcc must repeat
            return T.call_extern("int32", "*(volatile int*)", T.address_of(bar[0]))
        return T.call_extern("int32", "__nv_atomic_load_n", T.address_of(bar[0]), NV_ATOMIC_ACQUIRE,
                             NV_SCOPE_DEVICE)

    release = kind == BARRIER_ACQUIRE

    @T.prim_func(private=True)
    def barrier(bar: T.Buffer((BARRIER_WORDS,), "int32"), expected: T.int32, leader: T.bool):
        T.tvm_storage_sync("shared")
        if leader:
            if release:  # the add is a release: the block's writes (ordered by the sync) come first
                T.evaluate(T.call_extern("int32", "__nv_atomic_fetch_add", T.address_of(bar[0]), 1,
                                         NV_ATOMIC_RELEASE, NV_SCOPE_DEVICE))
            else:
                T.evaluate(T.call_extern("void", "__threadfence"))
                T.evaluate(T.call_extern("int32", "atomicAdd", T.address_of(bar[0]), 1))
            spins: T.int32 = 0
            while poll(bar) < expected and spins < limit:
                spins = spins + 1
            if spins >= limit:
                bar[1] = 1
            if not release:  # an acquire load already orders what follows
                T.evaluate(T.call_extern("void", "__threadfence"))
        T.tvm_storage_sync("shared")

    return barrier


def grid_barrier(kind: str, expected: Any, leader: Any) -> tuple[Any, Any]:
    """The grid barrier of kind ``kind`` (``BARRIERS``) as a statement, and the int32 buffer
    (BARRIER_WORDS) it uses, for the kernel to take as its parameter: it waits for
    ``expected`` arrivals in all, and ``leader`` (one thread of each block) arrives and polls."""
    sync = _barrier_template(kind)
    return sync.specialize({sync.params[1]: expected, sync.params[2]: leader}).body, sync.params[0]


def _stored_buffers(stmt: Any) -> set[str]:
    """Names of the buffers a lowered statement stores to."""
    import tvm
    import tvm_ffi

    names: set[str] = set()
    tvm_ffi.structural_walk(stmt, [(tvm.tirx.BufferStore, lambda node: names.add(node.buffer.name))])
    return names


def _loaded_buffers(stmt: Any) -> set[str]:
    """Names of the buffers a lowered statement loads from."""
    import tvm
    import tvm_ffi

    names: set[str] = set()  # a buffer load is an ``ir.TensorLoad`` whose source is the buffer
    tvm_ffi.structural_walk(stmt, [(tvm.ir.expr.TensorLoad, lambda node: names.add(node.source.name))])
    return names


def _split_body(body: Any, hoist: tuple[str, ...], early: tuple[str, ...],
                step: Any) -> tuple[list[Any], list[Any], list[Any]]:
    """Split a kernel body (its ``step`` not yet bound) into what runs once before the step
    loop (the allocations and the top-level statements that store only to ``hoist``
    buffers), the top-level fills of ``early`` buffers (issued a step ahead) and the rest."""
    from tvm import tirx

    stmts = list(body.seq) if isinstance(body, tirx.SeqStmt) else [body]
    before, fills, rest, found = [], [], [], set()
    for stmt in stmts:
        stored = _stored_buffers(stmt)
        if isinstance(stmt, tirx.AllocBuffer):
            before.append(stmt)
        elif stored and stored <= set(hoist):
            if any(v.same_as(step) for v in tirx.analysis.undefined_vars(stmt, [])):
                raise ValueError(f"the fill of {sorted(stored)} depends on the step: it cannot run once")
            before.append(stmt)
            found |= stored
        elif stored and stored <= set(early):
            fills.append(stmt)
            found |= stored
        else:
            rest.append(stmt)
    missing = (set(hoist) | set(early)) - found
    if missing:
        raise ValueError(f"no top-level fill of {sorted(missing)} to move out of the step")
    written = set().union(*map(_stored_buffers, rest)) if rest else set()
    clash = set().union(*map(_loaded_buffers, fills)) & written if fills else set()
    if clash or written & set(early):
        raise ValueError(f"the fills of {sorted(early)} cannot run a step ahead: the step writes "
                         f"{sorted(clash | (written & set(early)))}")
    return before, fills, rest


def loop_steps(func: Any, steps: int, mode: str, step: str = "step", state: tuple[str, str] | None = None,
               name: str = "", min_blocks_per_sm: int = 1, hoist: tuple[str, ...] = (),
               barrier: str = BARRIER_ATOMIC, early: tuple[str, ...] = ()) -> Any:
    """``func`` (from ``lower_to_loops``) with its ``step`` parameter replaced by a loop
    over ``steps`` (see the module docstring).  Parameters keep their order without
    ``step``; ``PERSISTENT`` appends ``bar`` (int32, BARRIER_WORDS).

    ``state``: (read, write) names of two parameters that are one buffer, the state read
    through one and written through the other (a schedulable kernel cannot read and
    write one buffer at data-dependent slots).  They become one parameter, the first:
    kernel parameters are ``__restrict__``, and a pointer only read would let nvcc load
    through the non-coherent cache, stale once another block rewrote the state.

    ``min_blocks_per_sm`` (``PERSISTENT``): blocks each SM must hold at once for the whole
    grid to be resident; above 1 it becomes ``__launch_bounds__(threads, n)``, so nvcc
    caps the registers per thread to let them fit.

    ``hoist`` (``PERSISTENT``): buffers (e.g. a weight tile staged in shared memory) whose
    top-level fill statements run once before the step loop instead of every step; the
    caller guarantees they are filled only from data no step changes.

    ``barrier`` (``PERSISTENT``): the grid barrier's kind (``BARRIERS``).

    ``early`` (``PERSISTENT``): buffers (e.g. registers holding a step's inputs) whose
    top-level fills run a step ahead: step s+1's fill is issued after step s's work and
    before its barrier (step 0's before the loop), so the loads overlap the wait.  The caller
    guarantees the fills read only data no step changes (checked: nothing the step writes)."""
    import tvm
    from tvm import tirx

    if mode not in MODES:
        raise ValueError(f"unknown step-loop mode {mode!r}; allowed: {', '.join(MODES)}")
    params = {p.name: p for p in func.params}
    if step not in params:
        raise ValueError(f"kernel has no parameter {step!r}; it has {list(params)}")
    chain, inner = launch_chain(func.body)
    if not chain:
        raise ValueError("kernel has no thread bindings")
    index = tirx.Var("s", "int32")
    values: dict[Any, Any] = {params[step]: index}
    dropped = {step}
    if state is not None:
        read, write = state
        if read not in params or write not in params:
            raise ValueError(f"kernel has no parameters {state}; it has {list(params)}")
        values[params[write]] = params[read]
        dropped.add(write)
    kept = [p for p in func.params if p.name not in dropped]
    if mode == HOST:
        body = tirx.PrimFunc(func.params, func.body).specialize(values).body
        new_params = kept
    else:
        blocks, leader = 1, tirx.const(True, "bool")
        for attr in chain:
            if attr.node.thread_tag.startswith("blockIdx"):
                blocks *= int(attr.value)
            else:
                leader = tirx.And(leader, attr.node.var == 0)
        sync = _barrier_template(barrier)
        arrive = sync.specialize({sync.params[1]: (index + 1) * blocks, sync.params[2]: leader})

        def at(stmts: list[Any], step_value: Any) -> Any:  # the statements with ``step`` bound
            seq = stmts[0] if len(stmts) == 1 else tirx.SeqStmt(stmts)
            return tirx.PrimFunc(func.params, seq).specialize({**values, params[step]: step_value}).body

        if hoist or early:
            before, fills, rest = _split_body(inner, hoist, early, params[step])
            before = [at([stmt], index) for stmt in before]
        else:
            before, fills, rest = [], [], [inner]
        body_stmts = [at(rest, index)]
        if fills:  # the next step's fills, issued before the barrier so their loads overlap it
            before.append(at(fills, tirx.const(0, "int32")))
            body_stmts.append(tirx.IfThenElse(index + 1 < steps, at(fills, index + 1), None))
        body = tvm.tirx.SeqStmt(body_stmts + [arrive.body])
        new_params = kept + [sync.params[0]]
    loop = tirx.For(index, tirx.const(0, "int32"), tirx.const(steps, "int32"), tirx.ForKind.SERIAL, body)
    if mode == PERSISTENT:
        loop = tirx.SeqStmt(before + [loop]) if before else loop
        loop = min_blocks_bound(loop, min_blocks_per_sm)
    out = tirx.PrimFunc(new_params, rewrap(chain, loop) if mode == PERSISTENT else loop, attrs=func.attrs)
    return out.with_attr("global_symbol", name) if name else out
