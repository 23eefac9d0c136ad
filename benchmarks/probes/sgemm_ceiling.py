"""What a hand-written SGEMM reaches on this GPU, against cuBLAS fp32 (TF32 off) in the same run:
the yardstick for the SGEMM template's 0.95 target.  256 threads as 16 x 16, TM x TN outputs a
thread in 4-wide groups 64 apart, K slices of 8 register-staged into the second of two shared
buffers (one barrier a slice), A stored K-major in shared memory.  Uses CuPy (NVRTC) for the raw
kernels; each is checked against float64 on NaN-poisoned outputs and timed the three ways of
``common.time_vendor`` on the rotated randn operands cuBLAS gets.  Beside them: three- and
four-stage ``cp.async`` pipelines (``async_*``), fragments double-buffered in registers with warp
tiles (``frag_*``) and two K slices staged in registers (``deep_*``).

    python benchmarks/probes/sgemm_ceiling.py                    # 4096^3, every kernel
    python benchmarks/probes/sgemm_ceiling.py --only frag,deep   # those kernels only
"""
from __future__ import annotations

import argparse
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # benchmarks/
from common import (l2_rotation, poisoned_error, rel_error_vs, table, time_vendor, torch_stream,  # noqa: E402
                    vendor_methods)

SOURCE = r"""
// DEPTH register sets stage the K slices: slice s + DEPTH is loaded from global memory while
// slice s is computed (DEPTH 2 gives a load two slices of math to arrive).  K % (DEPTH * BK) == 0.
template <int TM, int TN, int BK, int DEPTH = 1>
__device__ void sgemm(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C, int N, int K) {
  constexpr int BM = 16 * TM, BN = 16 * TN;
  constexpr int AL = BK * BM / 4 / 256, BL = BK * BN / 4 / 256;  // float4 loads a thread per slice
  __shared__ __align__(16) float As[2][BK][BM + 4];
  __shared__ __align__(16) float Bs[2][BK][BN];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int ty = (warp / 2) * 4 + lane / 8, tx = (warp % 2) * 8 + lane % 8;  // a warp: 4 x 8 threads
  const float* Ab = A + (size_t)blockIdx.y * BM * K;
  const float* Bb = B + blockIdx.x * BN;
  float4 ra[DEPTH][AL], rb[DEPTH][BL];
  float acc[TM][TN] = {};
  auto load = [&](int set, int k0) {
    #pragma unroll
    for (int i = 0; i < AL; ++i) {
      int idx = tid + i * 256;
      ra[set][i] = *(const float4*)(Ab + (size_t)(idx / (BK / 4)) * K + k0 + (idx % (BK / 4)) * 4);
    }
    #pragma unroll
    for (int i = 0; i < BL; ++i) {
      int idx = tid + i * 256;
      rb[set][i] = *(const float4*)(Bb + (size_t)(k0 + idx / (BN / 4)) * N + (idx % (BN / 4)) * 4);
    }
  };
  auto store = [&](int set, int buf) {
    #pragma unroll
    for (int i = 0; i < AL; ++i) {
      int idx = tid + i * 256, r = idx / (BK / 4), c = (idx % (BK / 4)) * 4;
      const float4 v = ra[set][i];
      As[buf][c][r] = v.x; As[buf][c + 1][r] = v.y; As[buf][c + 2][r] = v.z; As[buf][c + 3][r] = v.w;
    }
    #pragma unroll
    for (int i = 0; i < BL; ++i) {
      int idx = tid + i * 256;
      *(float4*)&Bs[buf][idx / (BN / 4)][(idx % (BN / 4)) * 4] = rb[set][i];
    }
  };
  #pragma unroll
  for (int d = 0; d < DEPTH; ++d) load(d, d * BK);
  store(0, 0); __syncthreads();
  int cur = 0;
  for (int k0 = 0; k0 < K; k0 += DEPTH * BK) {
    #pragma unroll
    for (int p = 0; p < DEPTH; ++p) {
      const int kp = k0 + p * BK;
      if (kp + DEPTH * BK < K) load(p, kp + DEPTH * BK);
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
      if (kp + BK < K) { store((p + 1) % DEPTH, cur ^ 1); __syncthreads(); cur ^= 1; }
    }
  }
  #pragma unroll
  for (int i = 0; i < TM; ++i) {
    float* row = C + (size_t)(blockIdx.y * BM + ty * 4 + i % 4 + (i / 4) * 64) * N + blockIdx.x * BN + tx * 4;
    #pragma unroll
    for (int g = 0; g < TN / 4; ++g)
      *(float4*)(row + g * 64) = make_float4(acc[i][4 * g], acc[i][4 * g + 1], acc[i][4 * g + 2], acc[i][4 * g + 3]);
  }
}

__device__ __forceinline__ void cp_async4(float* dst, const float* src) {
  asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}
__device__ __forceinline__ void cp_async16(float* dst, const float* src) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" :: "r"((unsigned)__cvta_generic_to_shared(dst)), "l"(src));
}
__device__ __forceinline__ void cp_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N> __device__ __forceinline__ void cp_wait() { asm volatile("cp.async.wait_group %0;\n" :: "n"(N)); }

// STAGES-deep cp.async pipeline, one barrier a K slice: A transposed into shared memory by
// 4-byte copies (As[k][m], rows padded by 4), B by 16-byte copies; warps WM x WN, each a
// (BM/WM) x (BN/WN) warp tile of lanes (32/LN) x LN holding TM x TN in 4-wide groups.
template <int BM, int BN, int BK, int WM, int WN, int TM, int TN, int STAGES>
__device__ void sgemm_async(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                            int N, int K) {
  extern __shared__ __align__(16) float smem[];
  constexpr int AP = BM + 4, ASZ = BK * AP, BSZ = BK * BN;
  constexpr int WTM = BM / WM, WTN = BN / WN, LN = WTN / TN, LM = 32 / LN;
  static_assert(LM * TM == WTM && WM * WN == 8, "tile");
  float* As = smem;
  float* Bs = smem + STAGES * ASZ;
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  const int row0 = (warp / WN) * WTM + (lane / LN) * 4, col0 = (warp % WN) * WTN + (lane % LN) * 4;
  const float* Ab = A + (size_t)blockIdx.y * BM * K;
  const float* Bb = B + (size_t)blockIdx.x * BN;
  auto load = [&](int kt, int s) {
    const int k0 = kt * BK;
    float* as = As + s * ASZ;
    float* bs = Bs + s * BSZ;
    #pragma unroll
    for (int i = 0; i < BM * BK / 256; ++i) {
      int idx = tid + i * 256, m = idx / BK, k = idx % BK;
      cp_async4(as + k * AP + m, Ab + (size_t)m * K + k0 + k);
    }
    #pragma unroll
    for (int i = 0; i < BK * BN / 4 / 256; ++i) {
      int idx = tid + i * 256, k = idx / (BN / 4), n = (idx % (BN / 4)) * 4;
      cp_async16(bs + k * BN + n, Bb + (size_t)(k0 + k) * N + n);
    }
  };
  const int KT = K / BK;
  #pragma unroll
  for (int s = 0; s < STAGES - 1; ++s) { if (s < KT) load(s, s); cp_commit(); }
  float acc[TM][TN] = {};
  int read = 0, write = STAGES - 1;
  for (int kt = 0; kt < KT; ++kt) {
    cp_wait<STAGES - 2>();
    __syncthreads();
    if (kt + STAGES - 1 < KT) load(kt + STAGES - 1, write);
    cp_commit();
    write = write + 1 == STAGES ? 0 : write + 1;
    const float* as = As + read * ASZ;
    const float* bs = Bs + read * BSZ;
    read = read + 1 == STAGES ? 0 : read + 1;
    #pragma unroll
    for (int k = 0; k < BK; ++k) {
      float a[TM], b[TN];
      #pragma unroll
      for (int g = 0; g < TM / 4; ++g) *(float4*)&a[4 * g] = *(const float4*)&as[k * AP + row0 + g * LM * 4];
      #pragma unroll
      for (int g = 0; g < TN / 4; ++g) *(float4*)&b[4 * g] = *(const float4*)&bs[k * BN + col0 + g * LN * 4];
      #pragma unroll
      for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[i] * b[j];
    }
  }
  #pragma unroll
  for (int i = 0; i < TM; ++i) {
    float* row = C + (size_t)(blockIdx.y * BM + row0 + i % 4 + (i / 4) * LM * 4) * N + blockIdx.x * BN + col0;
    #pragma unroll
    for (int g = 0; g < TN / 4; ++g)
      *(float4*)(row + g * LN * 4) =
          make_float4(acc[i][4 * g], acc[i][4 * g + 1], acc[i][4 * g + 2], acc[i][4 * g + 3]);
  }
}
#define ASYNC(name, BM, BN, BK, WM, WN, TM, TN, S, MIN) \
  extern "C" __global__ void __launch_bounds__(256, MIN) name(const float* A, const float* B, float* C, int N, int K) \
  { sgemm_async<BM, BN, BK, WM, WN, TM, TN, S>(A, B, C, N, K); }
ASYNC(async_256x128_w4x2_s3, 256, 128, 8, 4, 2, 8, 16, 3, 1)
ASYNC(async_256x128_w4x2_s4, 256, 128, 8, 4, 2, 8, 16, 4, 1)
ASYNC(async_256x128_w4x2_k16_s3, 256, 128, 16, 4, 2, 8, 16, 3, 1)
ASYNC(async_128x256_w2x4_s3, 128, 256, 8, 2, 4, 8, 16, 3, 1)
ASYNC(async_256x128_w2x4_s3, 256, 128, 8, 2, 4, 16, 8, 3, 1)
ASYNC(async_128x128_w2x4_s3, 128, 128, 8, 2, 4, 8, 8, 3, 2)
ASYNC(async_128x128_w2x4_s4, 128, 128, 8, 2, 4, 8, 8, 4, 2)
ASYNC(async_128x128_w4x2_k16_s3, 128, 128, 16, 4, 2, 8, 8, 3, 2)

// Warp-tiled, fragments double-buffered in registers: the next k's A and B fragments are read
// from shared memory while this k's 4x4 outer products run, and the next K slice waits in
// registers (loaded at the slice's start) until its last k, when it goes into the other shared
// buffer, one barrier a slice.  Warps WM x WN; lanes LM x LN; a thread holds TM x TN outputs in
// 4 x 4 sub-tiles LM*4 rows and LN*4 columns apart.  GROUP > 0 rasterizes the grid in bands of
// GROUP block rows (blocks of one wave share B's columns in L2).
template <int WM, int WN, int LM, int LN, int TM, int TN, int BK, int GROUP>
__device__ void sgemm_frag(const float* __restrict__ A, const float* __restrict__ B, float* __restrict__ C,
                           int M, int N, int K) {
  constexpr int BM = WM * LM * TM, BN = WN * LN * TN, AP = BM + 4;
  constexpr int AL = BM * BK / 4 / 256, BL = BK * BN / 4 / 256;
  static_assert(WM * WN == 8 && LM * LN == 32 && AL >= 1 && BL >= 1, "tile");
  __shared__ __align__(16) float As[2][BK][AP];
  __shared__ __align__(16) float Bs[2][BK][BN];
  const int tid = threadIdx.x, lane = tid % 32, warp = tid / 32;
  int bx = blockIdx.x, by = blockIdx.y;
  if (GROUP > 0) {
    const int grid_n = gridDim.x, linear = blockIdx.y * grid_n + blockIdx.x, band = GROUP * grid_n;
    const int first = (linear / band) * GROUP, rows = min(GROUP, M / BM - first);
    by = first + (linear % band) % rows;
    bx = (linear % band) / rows;
  }
  const int r0 = (warp / WN) * (LM * TM) + (lane / LN) * 4, c0 = (warp % WN) * (LN * TN) + (lane % LN) * 4;
  const float* Ab = A + (size_t)by * BM * K;
  const float* Bb = B + (size_t)bx * BN;
  float4 ra[AL], rb[BL];
  auto load = [&](int k0) {
    #pragma unroll
    for (int i = 0; i < AL; ++i) {
      int idx = tid + i * 256;
      ra[i] = __ldg((const float4*)(Ab + (size_t)(idx / (BK / 4)) * K + k0 + (idx % (BK / 4)) * 4));
    }
    #pragma unroll
    for (int i = 0; i < BL; ++i) {
      int idx = tid + i * 256;
      rb[i] = __ldg((const float4*)(Bb + (size_t)(k0 + idx / (BN / 4)) * N + (idx % (BN / 4)) * 4));
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
  float a[2][TM], b[2][TN];
  auto frag = [&](int f, int buf, int k) {
    #pragma unroll
    for (int g = 0; g < TM / 4; ++g) *(float4*)&a[f][4 * g] = *(const float4*)&As[buf][k][r0 + g * LM * 4];
    #pragma unroll
    for (int g = 0; g < TN / 4; ++g) *(float4*)&b[f][4 * g] = *(const float4*)&Bs[buf][k][c0 + g * LN * 4];
  };
  float acc[TM][TN] = {};
  load(0); store(0); __syncthreads();
  frag(0, 0, 0);
  int cur = 0;
  for (int k0 = 0; k0 < K; k0 += BK) {
    const bool more = k0 + BK < K;
    if (more) load(k0 + BK);
    #pragma unroll
    for (int k = 0; k < BK; ++k) {
      if (k == BK - 1 && more) { store(cur ^ 1); __syncthreads(); cur ^= 1; }
      if (k < BK - 1 || more) frag((k + 1) % 2, cur, (k + 1) % BK);
      #pragma unroll
      for (int i = 0; i < TM; ++i)
        #pragma unroll
        for (int j = 0; j < TN; ++j) acc[i][j] += a[k % 2][i] * b[k % 2][j];
    }
  }
  #pragma unroll
  for (int i = 0; i < TM; ++i) {
    float* row = C + (size_t)(by * BM + r0 + i % 4 + (i / 4) * LM * 4) * N + bx * BN + c0;
    #pragma unroll
    for (int g = 0; g < TN / 4; ++g)
      *(float4*)(row + g * LN * 4) =
          make_float4(acc[i][4 * g], acc[i][4 * g + 1], acc[i][4 * g + 2], acc[i][4 * g + 3]);
  }
}
#define FRAG(name, WM, WN, LM, LN, TM, TN, BK, GROUP, MIN) \
  extern "C" __global__ void __launch_bounds__(256, MIN) name(const float* A, const float* B, float* C, int M, int N, \
                                                              int K) \
  { sgemm_frag<WM, WN, LM, LN, TM, TN, BK, GROUP>(A, B, C, M, N, K); }
FRAG(frag_128x128_w4x2_l4x8, 4, 2, 4, 8, 8, 8, 8, 0, 2)
FRAG(frag_128x128_w2x4_l8x4, 2, 4, 8, 4, 8, 8, 8, 0, 2)
FRAG(frag_128x128_w2x4_l8x4_g8, 2, 4, 8, 4, 8, 8, 8, 8, 2)
FRAG(frag_128x128_w4x2_l4x8_k16, 4, 2, 4, 8, 8, 8, 16, 0, 2)
FRAG(frag_128x128_w4x2_l4x8_one, 4, 2, 4, 8, 8, 8, 8, 0, 1)
FRAG(frag_128x256_w4x2_l4x8, 4, 2, 4, 8, 8, 16, 8, 0, 1)
FRAG(frag_128x256_w2x4_l8x4, 2, 4, 8, 4, 8, 16, 8, 0, 1)
FRAG(frag_256x128_w4x2_l4x8, 4, 2, 4, 8, 16, 8, 8, 0, 1)
FRAG(frag_256x128_w4x2_l4x8_g4, 4, 2, 4, 8, 16, 8, 8, 4, 1)
FRAG(frag_256x128_w2x4_l8x4, 2, 4, 8, 4, 16, 8, 8, 0, 1)

extern "C" __global__ void __launch_bounds__(256, 2) sgemm_8x8(const float* A, const float* B, float* C, int N, int K)
{ sgemm<8, 8, 8>(A, B, C, N, K); }
extern "C" __global__ void __launch_bounds__(256, 1) sgemm_8x16(const float* A, const float* B, float* C, int N, int K)
{ sgemm<8, 16, 8>(A, B, C, N, K); }
extern "C" __global__ void __launch_bounds__(256, 1) sgemm_16x8(const float* A, const float* B, float* C, int N, int K)
{ sgemm<16, 8, 8>(A, B, C, N, K); }
extern "C" __global__ void __launch_bounds__(256, 2)
sgemm_8x8_k16(const float* A, const float* B, float* C, int N, int K)
{ sgemm<8, 8, 16>(A, B, C, N, K); }
extern "C" __global__ void __launch_bounds__(256, 2) deep_8x8(const float* A, const float* B, float* C, int N, int K)
{ sgemm<8, 8, 8, 2>(A, B, C, N, K); }
extern "C" __global__ void __launch_bounds__(256, 1) deep_8x16(const float* A, const float* B, float* C, int N, int K)
{ sgemm<8, 16, 8, 2>(A, B, C, N, K); }
extern "C" __global__ void __launch_bounds__(256, 1) deep_16x8(const float* A, const float* B, float* C, int N, int K)
{ sgemm<16, 8, 8, 2>(A, B, C, N, K); }
extern "C" __global__ void __launch_bounds__(256, 1) deep_8x8_one(const float* A, const float* B, float* C, int N,
                                                                  int K)
{ sgemm<8, 8, 8, 2>(A, B, C, N, K); }
"""
# name -> outputs a thread (M, N), K slice; deep_*: two register sets (DEPTH 2), deep_8x8_one: one block an SM
KERNELS = {"sgemm_8x8": (8, 8, 8), "sgemm_8x16": (8, 16, 8), "sgemm_16x8": (16, 8, 8),
           "sgemm_8x8_k16": (8, 8, 16), "deep_8x8": (8, 8, 8), "deep_8x16": (8, 16, 8), "deep_16x8": (16, 8, 8),
           "deep_8x8_one": (8, 8, 8)}
# name -> block (M, N), K slice, stages: the cp.async pipelines
ASYNC_KERNELS = {"async_256x128_w4x2_s3": (256, 128, 8, 3), "async_256x128_w4x2_s4": (256, 128, 8, 4),
                 "async_256x128_w4x2_k16_s3": (256, 128, 16, 3), "async_128x256_w2x4_s3": (128, 256, 8, 3),
                 "async_256x128_w2x4_s3": (256, 128, 8, 3), "async_128x128_w2x4_s3": (128, 128, 8, 3),
                 "async_128x128_w2x4_s4": (128, 128, 8, 4), "async_128x128_w4x2_k16_s3": (128, 128, 16, 3)}
# name -> block (M, N), K slice, band of block rows (0: none): fragments double-buffered in registers
FRAG_KERNELS = {"frag_128x128_w4x2_l4x8": (128, 128, 8, 0), "frag_128x128_w2x4_l8x4": (128, 128, 8, 0),
                "frag_128x128_w2x4_l8x4_g8": (128, 128, 8, 8), "frag_128x128_w4x2_l4x8_k16": (128, 128, 16, 0),
                "frag_128x128_w4x2_l4x8_one": (128, 128, 8, 0),
                "frag_128x256_w4x2_l4x8": (128, 256, 8, 0), "frag_128x256_w2x4_l8x4": (128, 256, 8, 0),
                "frag_256x128_w4x2_l4x8": (256, 128, 8, 0), "frag_256x128_w4x2_l4x8_g4": (256, 128, 8, 4),
                "frag_256x128_w2x4_l8x4": (256, 128, 8, 0)}

# The SGEMM template's knobs at the hand kernel sgemm_8x8's tile: 16 x 16 threads in 4 x 8 warps, 8 x 8 a thread
# in 4-wide groups 64 apart, K slices of 8 register-staged into the second of two shared buffers, A K-major, padded
HAND_TILE = dict(wg_x=16, wg_y=16, task_x=8, task_y=8, k_step=8, use_shared=1, pad=1, unroll=16, vec=4,
                 double_buffer=1, a_transposed=1, prefetch=3, warp_x=8)

def main() -> int:
    import cupy as cp
    import numpy as np
    import torch

    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--size", type=int, default=4096, help="an n^3 GEMM (a multiple of 256)")
    p.add_argument("--only", default="",
                   help="time only the hand kernels whose names contain one of these comma-separated texts")
    p.add_argument("--template", action="store_true",
                   help="also time the SGEMM template (tvm_ext.schedules.gemm.simt) at the hand kernels' tile and at "
                        "its known-good tile, built by TVM in the same run")
    args = p.parse_args()
    n = args.size
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
    # name -> (row label, grid, dynamic shared bytes) of every hand kernel
    kernels = {name: (f"hand {16 * tm}x{16 * tn} block, {tm}x{tn} a thread, k {bk}"
                      f"{f', two slices staged in registers ({name})' if name.startswith('deep') else ''}",
                      (n // (16 * tn), n // (16 * tm)), 0) for name, (tm, tn, bk) in KERNELS.items()}
    kernels.update({name: (f"hand {bm}x{bn} block, k {bk}, {stages}-stage cp.async ({name})", (n // bn, n // bm),
                           4 * stages * (bk * (bm + 4) + bk * bn))
                    for name, (bm, bn, bk, stages) in ASYNC_KERNELS.items()})
    kernels.update({name: (f"hand {bm}x{bn} block, k {bk}, fragments double-buffered"
                           f"{f', bands of {group} block rows' if group else ''} ({name})", (n // bn, n // bm), 0)
                    for name, (bm, bn, bk, group) in FRAG_KERNELS.items()})
    for name, (label, grid, smem) in kernels.items():
        if not any(part in name for part in args.only.split(",")):
            continue
        kernel = module.get_function(name)
        sizes = (n, n, n) if name in FRAG_KERNELS else (n, n)  # the frag kernels take M too
        if smem:
            kernel.max_dynamic_shared_size_bytes = smem

        def launch(i: int, kernel: object = kernel, grid: tuple[int, int] = grid, smem: int = smem,
                   sizes: tuple[int, ...] = sizes) -> object:
            x, y = sets[i]
            with torch_stream(cp, torch):
                kernel(grid, (256,), (x.data_ptr(), y.data_ptr(), outs[i].data_ptr(), *map(np.int32, sizes)),
                       shared_mem=smem)
            return outs[i]

        err = poisoned_error(launch, outs[0], ref)
        if not err < 1e-5:
            print(f"error: {name} differs from float64 by {err:.1e}", file=sys.stderr)
            return 1
        add(label, time_vendor(launch, len(sets)), err, str(kernel.num_regs))
    if args.template:
        from common import ours_on

        from tvm_ext.schedules.gemm.simt import REGISTER_STAGED_TILE, STAGING_DEFAULTS, GemmTemplate
        from tvm_ext.target import resolve_target

        template, target = GemmTemplate(n, n, n, staging=True), resolve_target("cuda")
        tiles = {"sgemm_8x8's tile (prefetch 3, warp_x 8)": HAND_TILE,
                 "the same, one shared buffer (prefetch 1)": {**HAND_TILE, "prefetch": 1},
                 "its known-good 64x128 tile, k 16": REGISTER_STAGED_TILE}
        for label, knobs in tiles.items():
            cfg = template.space(target).make(**{**STAGING_DEFAULTS, **knobs})
            times, err = ours_on(template, dict(cfg.items), target, sets)
            add(f"template: {label}", times, err)
    print(table(f"SGEMM {n}^3 ceiling: hand-written kernels against cuBLAS fp32, {len(sets)} rotated operand sets",
                ["kernel", "per call ms", "back-to-back ms", "CUDA graph ms", "TFLOP/s at best",
                 "of cuBLAS best", "rel err vs f64", "registers"], rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
