"""Host time of one ``tvm_ext.torch.GRU`` call: torch tensors converted once per call
(``tvm_ffi.from_dlpack``) against passed to every TVM call as they are, and the eager wall
clock with a synchronize beside the graph replay (B8 H512 float32, T=128; 2026-11-27)."""
import statistics
import time

import torch
import tvm_ffi

import tvm_ext.torch as tt

net = torch.nn.GRU(512, 512).cuda().eval()
gru = tt.GRU.from_module(net, fallback="off")
x = torch.randn(128, 8, 512, device="cuda")
with torch.no_grad():
    gru(x)
    torch.cuda.synchronize()


def host_us(n=200):
    times = []
    for _ in range(n):
        torch.cuda.synchronize()
        start = time.perf_counter()
        gru(x)
        times.append(time.perf_counter() - start)
    torch.cuda.synchronize()
    return statistics.median(times) * 1e6


def wall_us(n=50):
    times = []
    for _ in range(n):
        start = time.perf_counter()
        gru(x)
        torch.cuda.synchronize()
        times.append(time.perf_counter() - start)
    return statistics.median(times) * 1e6


with torch.no_grad():
    print(f"converted once: host {host_us():.1f} us, eager wall {wall_us():.1f} us", flush=True)
    original = tt._run_bound
    tt._run_bound = lambda executor, tensors: executor.run_bound(dict(tensors))
    print(f"passed as torch tensors: host {host_us():.1f} us, eager wall {wall_us():.1f} us", flush=True)
    tt._run_bound = original
    engine = next(iter(gru._engines.values()))
    names = [c.name for c in engine.compiled.function_calls()]
    print("calls per forward:", len(names), names, flush=True)
    a = torch.empty(1024, device="cuda")
    start = time.perf_counter()
    for _ in range(1000):
        tvm_ffi.from_dlpack(a)
    print(f"from_dlpack: {(time.perf_counter() - start) * 1e3:.2f} us each", flush=True)
    # host time of each of the plan's calls on its own (after a synchronize)
    ex = engine.executor
    for (func, args), name in zip(ex.calls[0], names):
        times = []
        for _ in range(50):
            torch.cuda.synchronize()
            start = time.perf_counter()
            func(*args)
            times.append(time.perf_counter() - start)
        print(f"{name}: host {statistics.median(times) * 1e6:.1f} us", flush=True)
