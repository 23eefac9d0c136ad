"""What a hand-written row sum reaches on this GPU, against torch's ``x.sum(dim=1)`` in the same
run: the yardstick for the row-sum template's 1.3x target.  A row sum reads every byte once and
writes almost nothing, so its ceiling is the GPU's read rate; the kernels here try what raises
it: threads per row, rows per block, every load of a thread issued before the first add (16-byte
loads), cache hints (streaming ``__ldcs``; ``ld.global.nc`` with no L1 allocation and 256-byte L2
prefetch), and a persistent grid that walks the rows.  A device-to-device copy of the matrix
(read + write counted) is printed beside them.  CuPy (NVRTC) builds the kernels; each is checked
against float64 on NaN-poisoned outputs and timed the three ways of ``common.time_vendor`` on
inputs rotated through twice the L2.

    python benchmarks/probes/rowsum_ceiling.py            # 4096 x 4096 float32
"""
from __future__ import annotations

import argparse
import os
import sys
from typing import Any

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import (l2_rotation, poisoned_error, rel_error_vs, table, time_vendor, torch_stream,  # noqa: E402
                    vendor_methods)

TEMPLATE = r"""
template <int LOAD>
__device__ __forceinline__ float4 load4(const float4* p) {
  if (LOAD == 1) return __ldcs(p);
  if (LOAD == 2) {
    float4 v;
    asm volatile("ld.global.nc.L1::no_allocate.L2::256B.v4.f32 {%0,%1,%2,%3}, [%4];"
                 : "=f"(v.x), "=f"(v.y), "=f"(v.z), "=f"(v.w) : "l"(p));
    return v;
  }
  return __ldg(p);
}

// T threads a row (a multiple of 32), R rows a block, COLS columns: each thread issues all of
// its COLS / 4 / T 16-byte loads before it adds; PERSIST: blocks walk the rows with a stride.
template <int T, int R, int COLS, int LOAD, bool PERSIST>
__device__ void rowsum(const float* __restrict__ x, float* __restrict__ out, int rows) {
  constexpr int PER = COLS / 4 / T;
  __shared__ float part[R][T / 32];
  const int lane = threadIdx.x % 32, t = threadIdx.x % T, r = threadIdx.x / T;
  const int stride = PERSIST ? gridDim.x * R : rows;
  for (int row = blockIdx.x * R + r; row < rows; row += stride) {
    const float4* p = reinterpret_cast<const float4*>(x + (size_t)row * COLS) + t;
    float4 v[PER];
#pragma unroll
    for (int j = 0; j < PER; ++j) v[j] = load4<LOAD>(p + j * T);
    float s = 0.f;
#pragma unroll
    for (int j = 0; j < PER; ++j) s += (v[j].x + v[j].y) + (v[j].z + v[j].w);
#pragma unroll
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffff, s, o);
    if (T == 32) {
      if (lane == 0) out[row] = s;
    } else {
      if (lane == 0) part[r][t / 32] = s;
      __syncthreads();
      if (t == 0) {
        float total = 0.f;
#pragma unroll
        for (int w = 0; w < T / 32; ++w) total += part[r][w];
        out[row] = total;
      }
      if (PERSIST) __syncthreads();
    }
  }
}
"""
WRAPPER = ('extern "C" __global__ void __launch_bounds__({threads}) {name}(const float* x, float* out, int rows)'
           ' {{ rowsum<{t}, {r}, {cols}, {load}, {persist}>(x, out, rows); }}\n')
LOADS = {0: "__ldg", 1: "__ldcs", 2: "nc.no_allocate.L2::256B"}


def variants(cols: int) -> list[tuple[str, int, int, int, int]]:
    """(name, threads a row, rows a block, load, persistent blocks an SM or 0)."""
    out = []
    for t, r in ((32, 8), (32, 4), (64, 4), (64, 8), (128, 2), (128, 4), (256, 1), (256, 2), (512, 1)):
        if cols % (4 * t) or cols // (4 * t) > 32:  # at most 32 loads in flight a thread (128 registers)
            continue
        for load in LOADS:
            out.append((f"rs_t{t}_r{r}_l{load}", t, r, load, 0))
    for t, r, per_sm in ((64, 8, 4), (128, 4, 4), (256, 2, 4), (64, 8, 8)):
        if not cols % (4 * t) and cols // (4 * t) <= 32:
            for load in (0, 2):
                out.append((f"rs_t{t}_r{r}_l{load}_p{per_sm}", t, r, load, per_sm))
    return out


def main() -> int:
    import cupy as cp
    import numpy as np
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--rows", type=int, default=4096)
    p.add_argument("--cols", type=int, default=4096, help="a multiple of 128")
    args = p.parse_args()
    rows_n, cols = args.rows, args.cols
    if cols % 128 or rows_n < 1:
        print(f"error: --cols {cols} is not a multiple of 128 (the kernels have no edge guards)", file=sys.stderr)
        return 2
    nbytes = 4.0 * rows_n * cols
    sets = [torch.randn(rows_n, cols, device="cuda") for _ in range(l2_rotation(nbytes))]
    outs = [torch.empty(rows_n, device="cuda") for _ in sets]
    copies = [torch.empty_like(x) for x in sets]
    ref = sets[0].double().sum(dim=1)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    rows = []

    def add(name: str, times: Any, err: float | None, moved: float = nbytes, regs: str = "-") -> None:
        cells = [f"{t.seconds * 1e6:.1f}" if t else method for method, t in vendor_methods(times)]
        best = times.best.seconds
        rows.append([name, *cells, f"{moved / best / 1e9:.0f}", f"{vendor.best.seconds / best:.3f}",
                     "-" if err is None else f"{err:.1e}", regs])

    vendor = time_vendor(lambda i: torch.sum(sets[i], dim=1, out=outs[i]), len(sets))
    add("torch x.sum(dim=1)", vendor, rel_error_vs(sets[0].sum(dim=1), ref))
    add("torch copy_ (read + write)", time_vendor(lambda i: copies[i].copy_(sets[i]), len(sets)), None, 2 * nbytes)
    chosen = variants(cols)
    source = TEMPLATE + "".join(WRAPPER.format(name=name, threads=t * r, t=t, r=r, cols=cols, load=load,
                                               persist="true" if per_sm else "false")
                                for name, t, r, load, per_sm in chosen)
    module = cp.RawModule(code=source, options=("-std=c++17",))
    for name, t, r, load, per_sm in chosen:
        kernel = module.get_function(name)
        grid = min(per_sm * sms, -(-rows_n // r)) if per_sm else -(-rows_n // r)

        def launch(i: int, kernel: Any = kernel, grid: int = grid, threads: int = t * r) -> Any:
            with torch_stream(cp, torch):
                kernel((grid,), (threads,), (sets[i].data_ptr(), outs[i].data_ptr(), np.int32(rows_n)))
            return outs[i]

        err = poisoned_error(launch, outs[0], ref)
        if not err < 1e-5:
            print(f"error: {name} differs from float64 by {err:.1e}", file=sys.stderr)
            return 1
        shape = f"{t} threads a row, {r} rows a block, {LOADS[load]}" + (f", persistent {per_sm}/SM" if per_sm else "")
        add(f"hand: {shape}", time_vendor(launch, len(sets)), err, regs=str(kernel.num_regs))
    print(table(f"Row sum {rows_n}x{cols} float32 ceiling: hand-written kernels against torch, {len(sets)} rotated "
                f"sets ({nbytes / 1e6:.0f} MB each)",
                ["kernel", "per call us", "back-to-back us", "CUDA graph us", "GB/s at best", "of torch best",
                 "rel err vs f64", "registers"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
