"""What a hand-written SGEMM reaches on this GPU, against cuBLAS fp32 (TF32 off) in the same run:
the yardstick for the SGEMM template's 0.95 target.  256 threads as 16 x 16, TM x TN outputs a
thread in 4-wide groups 64 apart, K slices of 8 register-staged into the second of two shared
buffers (one barrier a slice), A stored K-major in shared memory.  Uses CuPy (NVRTC) for the raw
kernels; each is checked against float64 on NaN-poisoned outputs and timed the three ways of
``common.time_vendor`` on the rotated randn operands cuBLAS gets.

    python benchmarks/sgemm_ceiling.py            # 4096^3
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from common import (l2_rotation, poisoned_error, rel_error_vs, table, time_vendor, torch_stream,  # noqa: E402
                    vendor_methods)

SOURCE = r"""
template <int TM, int TN, int BK>
__device__ void sgemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int N, int K) {
  constexpr int BM = 16 * TM, BN = 16 * TN;
  constexpr int AL = BK * BM / 4 / 256, BL = BK * BN / 4 / 256;  // float4 loads a thread per slice
  __shared__ __align__(16) float As[2][BK][BM + 4];
  __shared__ __align__(16) float Bs[2][BK][BN];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int ty = (warp / 2) * 4 + lane / 8, tx = (warp % 2) * 8 + lane % 8;  // a warp: 4 x 8 threads
  const float* Ab = A + (size_t)blockIdx.y * BM * K;
  const float* Bb = B + blockIdx.x * BN;
  float4 ra[AL], rb[BL];
  float acc[TM][TN] = {};
  auto load = [&](int k0) {
    #pragma unroll
    for (int i = 0; i < AL; ++i) {
      int idx = tid + i * 256;
      ra[i] = *(const float4*)(Ab + (size_t)(idx / (BK / 4)) * K + k0 + (idx % (BK / 4)) * 4);
    }
    #pragma unroll
    for (int i = 0; i < BL; ++i) {
      int idx = tid + i * 256;
      rb[i] = *(const float4*)(Bb + (size_t)(k0 + idx / (BN / 4)) * N + (idx % (BN / 4)) * 4);
    }
  };
  auto store = [&](int buf) {
    #pragma unroll
    for (int i = 0; i < AL; ++i) {
      int idx = tid + i * 256, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
      As[buf][c][r] = ra[i].x; As[buf][c + 1][r] = ra[i].y; As[buf][c + 2][r] = ra[i].z; As[buf][c + 3][r] = ra[i].w;
    }
    #pragma unroll
    for (int i = 0; i < BL; ++i) {
      int idx = tid + i * 256;
      *(float4*)&Bs[buf][idx / (BN / 4)][(idx % (BN / 4)) * 4] = rb[i];
    }
  };
  load(0); store(0); __syncthreads();
  int cur = 0;
  for (int k0 = 0; k0 < K; k0 += BK) {
    const bool more = k0 + BK < K;
    if (more) load(k0 + BK);
    #pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[TM], b[TN];
      #pragma unroll
      for (int g = 0; g < TM / 4; ++g) *(float4*)&a[4 * g] = *(const float4*)&As[cur][k][ty * 4 + g * 64];
      #pragma unroll
      for (int g = 0; g < TN / 4; ++g) *(float4*)&b[4 * g] = *(const float4*)&Bs[cur][k][tx * 4 + g * 64];
      #pragma unroll
      for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
    if (more) { store(cur ^ 1); __syncthreads(); cur ^= 1; }
  }
  #pragma unroll
  for (int i = 0; i < TM; ++i) {
    float* row = C + (size_t)(blockIdx.y * BM + ty * 4 + i % 4 + (i / 4) * 64) * N + blockIdx.x * BN + tx * 4;
    #pragma unroll
    for (int g = 0; g < TN / 4; ++g)
      *(float4*)(row + g * 64) = make_float4(acc[i][4 * g], acc[i][4 * g + 1], acc[i][4 * g + 2], acc[i][4 * g + 3]);
  }
}
extern "C" __global__ void __launch_bounds__(256, 2) sgemm_8x8(const float* A, const float* B, float* C, int N, int K)
{ sgemm<8, 8, 8>(A, B, C, N, K); }
extern "C" __global__ void __launch_bounds__(256, 1) sgemm_8x16(const float* A, const float* B, float* C, int N, int K)
{ sgemm<8, 16, 8>(A, B, C, N, K); }
"""
KERNELS = {"sgemm_8x8": (8, 8), "sgemm_8x16": (8, 16)}  # name -> outputs a thread (M, N)


def main() -> int:
    import cupy as cp
    import numpy as np
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=4096, help="an n^3 GEMM (a multiple of 256)")
    n = p.parse_args().size
    if n % 256:
        print(f"error: --size {n} is not a multiple of 256 (the kernels have no edge guards)", file=sys.stderr)
        return 2
    torch.backends.cuda.matmul.allow_tf32 = False
    sets = [(torch.randn(n, n, device="cuda"), torch.randn(n, n, device="cuda"))
            for _ in range(l2_rotation(4 * 3 * n * n))]
    outs = [torch.empty(n, n, device="cuda") for _ in sets]
    flops = 2.0 * n ** 3
    a, b = sets[0]
    ref = a.double() @ b.double()
    rows = []

    def add(name: str, times: object, err: float, regs: str = "-") -> None:
        cells = [f"{t.seconds * 1e3:.3f}" if t else method for method, t in vendor_methods(times)]
        best = times.best.seconds
        rows.append([name, *cells, f"{flops / best / 1e12:.1f}", f"{vendor.best.seconds / best:.3f}", f"{err:.1e}",
                     regs])

    vendor = time_vendor(lambda i: torch.matmul(*sets[i], out=outs[i]), len(sets))
    add("cuBLAS fp32 (TF32 off)", vendor, rel_error_vs(torch.matmul(a, b), ref))
    module = cp.RawModule(code=SOURCE, options=("-std=c++17",))
    for name, (tm, tn) in KERNELS.items():
        kernel = module.get_function(name)

        def launch(i: int, kernel: object = kernel, tm: int = tm, tn: int = tn) -> object:
            x, y = sets[i]
            with torch_stream(cp, torch):
                kernel((n // (16 * tn), n // (16 * tm)), (256,),
                       (x.data_ptr(), y.data_ptr(), outs[i].data_ptr(), np.int32(n), np.int32(n)))
            return outs[i]

        err = poisoned_error(launch, outs[0], ref)
        if not err < 1e-5:
            print(f"error: {name} differs from float64 by {err:.1e}", file=sys.stderr)
            return 1
        add(f"hand {16 * tm}x{16 * tn} block, {tm}x{tn} a thread", time_vendor(launch, len(sets)), err,
            str(kernel.num_regs))
    print(table(f"SGEMM {n}^3 ceiling: hand-written kernels against cuBLAS fp32, {len(sets)} rotated operand sets",
                ["kernel", "per call ms", "back-to-back ms", "CUDA graph ms", "TFLOP/s at best",
                 "of cuBLAS best", "rel err vs f64", "registers"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
