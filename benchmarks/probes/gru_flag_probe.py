"""Probe: does exchanging h with a step tag in every word beat a grid barrier per step?

A persistent GRU step kernel (float32, W_hh in registers, one block per ``units`` hidden
units, 32 lanes splitting k) written in CUDA C and run through CuPy, in two forms that
differ only in how step s+1 learns that every block's h_{s+1} is written:

- ``barrier``: h stored plainly; every block arrives on a counter (release add) and polls
  it (acquire loads), then loads h (the form of the persistent kernel ``tvm_ext`` builds);
- ``flags``: h stored as 8-byte words (value, step tag) with one relaxed 64-bit store; a
  reader polls the words themselves until every tag says step s+1 (no counter, no fence).

Modes 10-20 put all blocks in one thread-block cluster (Hopper) and pass h through distributed
shared memory instead: ``st.async`` counted on each block's ``mbarrier``, plain stores and a
cluster barrier, tagged words stored into every block and polled there, (17-20) tagged words
each block keeps in its own shared memory and the others pull with remote loads, (21, 22) a
block's h' gathered and sent to every block in one bulk copy each, or (23, 24) tagged words stored
into every block, each polled there by one thread.

Prints µs per step (from T = 128 and T = 512 runs) and the error against float64.
Run through the device tool: ``python benchmarks/probes/gru_flag_probe.py --out $OUT``.
"""
from __future__ import annotations

import argparse
import json
import os
import statistics

import numpy as np

SOURCE = r"""
#define B {B}
#define H {H}
#define U {U}
#define KP {KP}
#define NP {NP}
#define HP (KP * 32)
#define THREADS (32 * U)
#define MODE {MODE}
#define DEPTH {DEPTH}
#define STAGGER {STAGGER}
#define REPL {REPL}
#define LIMIT (1 << 22)
#define CLUSTER (MODE >= 10)
#define TAGGED (MODE >= 13 && MODE <= 16)
#define PULL (MODE >= 17 && MODE <= 20)
#define PUSH1 (MODE == 23 || MODE == 24)
#define PULL_WORDS (MODE >= 19 ? 2 : 1)
#define BULK (MODE == 21 || MODE == 22)
#define NO_MATH (MODE == 2 || MODE == 7 || MODE == 11 || MODE == 14 || MODE == 16 || MODE == 18 || MODE == 20 || \
                 MODE == 22 || MODE == 24)
#define SLOTS (CLUSTER ? 2 : 1)
#define C ((H + U - 1) / U)

__device__ __forceinline__ unsigned long long ld_relaxed(const unsigned long long* p) {{
  unsigned long long v; asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }}
__device__ __forceinline__ void st_relaxed(unsigned long long* p, unsigned long long v) {{
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" :: "l"(p), "l"(v) : "memory"); }}
__device__ __forceinline__ float sigm(float x) {{ return 1.f / (1.f + __expf(-x)); }}

__device__ __forceinline__ unsigned smem(const void* p) {{ return (unsigned)__cvta_generic_to_shared(p); }}
__device__ __forceinline__ unsigned peer(unsigned a, int rank) {{
  unsigned r; asm volatile("mapa.shared::cluster.u32 %0, %1, %2;" : "=r"(r) : "r"(a), "r"(rank)); return r; }}
__device__ __forceinline__ unsigned long long ld_shared_relaxed(unsigned a) {{
  unsigned long long v;
#if MODE >= 15
  asm volatile("ld.volatile.shared::cta.b64 %0, [%1];" : "=l"(v) : "r"(a) : "memory");
#else
  asm volatile("ld.relaxed.cluster.shared::cta.b64 %0, [%1];"
               : "=l"(v) : "r"(a) : "memory");
#endif
  return v; }}
__device__ __forceinline__ void cluster_sync() {{
  asm volatile("barrier.cluster.arrive.release.aligned;\n\tbarrier.cluster.wait.acquire.aligned;" ::: "memory"); }}

extern "C" __global__ void {ATTR} __launch_bounds__(THREADS) gru(
    const float* __restrict__ gi, const float* __restrict__ w, const float* __restrict__ bh,
    float* __restrict__ out, unsigned long long* xch, float* hbuf, int* bar, int T) {{
  __shared__ float h_s[SLOTS * B * HP];
  __shared__ __align__(8) unsigned long long mbar[2];
#if TAGGED || PUSH1
  __shared__ unsigned long long hw_s[2 * B * HP];  // (value, step tag) words, two slots
#endif
#if BULK
  __shared__ __align__(16) float stage_s[B * U];  // the block's h', gathered for its bulk copies
#endif
#if PULL
  __shared__ __align__(16) unsigned long long pub_s[2 * B * U];  // this block's h' as (value, tag) words, two slots
#endif
#if CLUSTER
  extern __shared__ float gi_s[];  // the block's input gates of every step: [T][B][3][U]
#endif
  const int lane = threadIdx.x, u = threadIdx.y, tid = u * 32 + lane;
  const int j = blockIdx.x * U + u;
  const int G = 3 * H;
  float wr[3][KP];
  #pragma unroll
  for (int g = 0; g < 3; ++g)
    #pragma unroll
    for (int i = 0; i < KP; ++i) {{
      int k = lane + i * 32;
      wr[g][i] = (k < H && j < H) ? w[k * G + g * H + j] : 0.f;
    }}
  for (int f = tid; f < SLOTS * B * HP; f += THREADS) h_s[f] = 0.f;
  float b_r = j < H ? bh[j] : 0.f, b_z = j < H ? bh[H + j] : 0.f, b_n = j < H ? bh[2 * H + j] : 0.f;
  float g_r = 0.f, g_z = 0.f, g_n = 0.f;
  if (lane < B && j < H) {{ g_r = gi[lane * G + j]; g_z = gi[lane * G + H + j]; g_n = gi[lane * G + 2 * H + j]; }}
  int spins = 0;
#if CLUSTER
  // h0 into slot 0; a barrier a slot, one arrival (its thread 0's, with the bytes it expects)
  unsigned phase = 0;  // bit i: the parity slot i's barrier waits for next
  __syncthreads();
  for (int f = tid; f < B * H; f += THREADS) h_s[f / H * HP + f % H] = hbuf[f];
  for (int f = tid; f < T * B * 3 * U; f += THREADS) {{
    const int uu = f % U, g = f / U % 3, tb = f / (3 * U), jj = blockIdx.x * U + uu;
    gi_s[f] = jj < H ? gi[tb * G + g * H + jj] : 0.f;
  }}
#if TAGGED || PUSH1
  for (int f = tid; f < 2 * B * HP; f += THREADS) hw_s[f] = 0xffffffff00000000ull;  // tag -1
  for (int f = tid; f < B * H; f += THREADS)
    hw_s[f / H * HP + f % H] = (unsigned long long)(unsigned)__float_as_int(hbuf[f]);
#endif
#if PULL
  for (int f = tid; f < 2 * B * U; f += THREADS) {{
    const int b = f / U % B, jj = blockIdx.x * U + f % U;
    pub_s[f] = f < B * U && jj < H ? (unsigned long long)(unsigned)__float_as_int(hbuf[b * H + jj])
                                   : 0xffffffff00000000ull;  // slot 0: h0 with tag 0; slot 1: tag -1
  }}
#endif
  if (tid == 0) {{
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem(&mbar[0])) : "memory");
    asm volatile("mbarrier.init.shared::cta.b64 [%0], 1;" :: "r"(smem(&mbar[1])) : "memory");
    asm volatile("fence.mbarrier_init.release.cluster;" ::: "memory");
  }}
  __syncthreads();
#if MODE == 10 || MODE == 11 || BULK
  if (tid == 0) asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                              :: "r"(smem(&mbar[1])), "r"(B * H * 4) : "memory");
#endif
  cluster_sync();
#else
  __syncthreads();
#endif
  for (int s = 0; s < T; ++s) {{
#if CLUSTER
    float* h_cur = h_s + (s & 1) * B * HP;
    float* h_nxt_local = h_s + ((s + 1) & 1) * B * HP;
    {{ const float* gs = gi_s + (s * B + lane % B) * 3 * U; g_r = gs[u]; g_z = gs[U + u]; g_n = gs[2 * U + u]; }}
#if TAGGED
    float hv[B][KP];
    {{
      const unsigned src = smem(hw_s + (s & 1) * B * HP);
      bool done = false;
      while (!done && spins < LIMIT) {{
        done = true;
        #pragma unroll
        for (int b = 0; b < B; ++b)
          #pragma unroll
          for (int i = 0; i < KP; ++i) {{
            const unsigned long long w = ld_shared_relaxed(src + 8 * (b * HP + lane + i * 32));
            hv[b][i] = lane + i * 32 < H ? __int_as_float((int)(w & 0xffffffffu)) : 0.f;
            if (lane + i * 32 < H && (int)(w >> 32) != s) done = false;
          }}
        ++spins;
      }}
    }}
#elif PUSH1
    // tagged words stored into every block, as 13, but each polled by one thread, then shared
    for (int f = tid; f < B * H; f += THREADS) {{
      const unsigned a = smem(&hw_s[(s & 1) * B * HP + f / H * HP + f % H]);
      unsigned long long w0 = 0;
      do {{ w0 = ld_shared_relaxed(a); }} while ((int)(w0 >> 32) != s && ++spins < LIMIT);
      h_cur[f / H * HP + f % H] = __int_as_float((int)(w0 & 0xffffffffu));
    }}
    __syncthreads();
#elif PULL
    // thread t pulls words t * PULL_WORDS.. of h_s from the block that wrote them, polling each
    // load until every word's tag says step s (no barrier: the writer only stores locally)
    for (int f = tid * PULL_WORDS; f < B * H; f += THREADS * PULL_WORDS) {{
      const int b = f / H, k = f % H;
      const unsigned a = peer(smem(&pub_s[((s & 1) * B + b) * U + k % U]), k / U);
      unsigned long long w0 = 0, w1 = 0;
      bool done = false;
      while (!done && spins < LIMIT) {{
#if PULL_WORDS == 2
        asm volatile("ld.relaxed.cluster.shared::cluster.v2.b64 {{%0, %1}}, [%2];"
                     : "=l"(w0), "=l"(w1) : "r"(a) : "memory");
        done = (int)(w0 >> 32) == s && (int)(w1 >> 32) == s;
#else
        asm volatile("ld.relaxed.cluster.shared::cluster.b64 %0, [%1];" : "=l"(w0) : "r"(a) : "memory");
        done = (int)(w0 >> 32) == s;
#endif
        ++spins;
      }}
      h_cur[b * HP + k] = __int_as_float((int)(w0 & 0xffffffffu));
#if PULL_WORDS == 2
      h_cur[b * HP + k + 1] = __int_as_float((int)(w1 & 0xffffffffu));
#endif
    }}
    __syncthreads();
#elif MODE != 12
    if (s > 0) {{
      const unsigned slot = s & 1, bar_a = smem(&mbar[slot]), par = (phase >> slot) & 1u;
      unsigned ok = 0;
      while (!ok && spins < LIMIT) {{
        asm volatile("{{ .reg .pred p; mbarrier.try_wait.parity.acquire.cluster.shared::cta.b64 p, [%1], %2; "
                     "selp.u32 %0, 1, 0, p; }}"
                     : "=r"(ok) : "r"(bar_a), "r"(par) : "memory");
        ++spins;
      }}
      phase ^= 1u << slot;
      if (tid == 0 && s + 1 < T)  // step s-1's phase of the other slot is complete: arm it for step s+1
        asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;"
                     :: "r"(smem(&mbar[(s + 1) & 1])), "r"(B * H * 4) : "memory");
    }}
#endif
#define HS h_cur
#else
#define HS h_s
#endif
#if MODE == 0 || MODE == 2 || MODE == 4
    const unsigned long long* src = xch + ((s & 1) * REPL + blockIdx.x % REPL) * B * H;
    unsigned long long v[NP];
    bool done = false;
#if MODE == 4
    {{ const unsigned long long* last = src + (B * H - 1 - tid % (B * H));
      while ((int)(ld_relaxed(last) >> 32) != s && spins < LIMIT) ++spins; }}
#endif
    while (!done && spins < LIMIT) {{
      done = true;
      #pragma unroll
      for (int i = 0; i < NP; ++i) {{ int f = tid + i * THREADS; if (f < B * H) v[i] = ld_relaxed(src + f); }}
      #pragma unroll
      for (int i = 0; i < NP; ++i) {{
        int f = tid + i * THREADS;
        if (f < B * H && (int)(v[i] >> 32) != s) done = false;
      }}
      ++spins;
    }}
    #pragma unroll
    for (int i = 0; i < NP; ++i) {{
      int f = tid + i * THREADS;
      if (f < B * H) h_s[f / H * HP + f % H] = __int_as_float((int)(v[i] & 0xffffffffu));
    }}
#elif MODE == 6 || MODE == 7
    // each word polled by DEPTH loads in flight, issued STAGGER cycles apart and each re-issued
    // as it returns untagged: a word is seen about STAGGER / 2 after it lands, not a round trip / 2
    const unsigned long long* src = xch + (s & 1) * B * H;
    unsigned long long v[NP], q[DEPTH][NP];
    bool ok[NP];
    #pragma unroll
    for (int i = 0; i < NP; ++i) ok[i] = tid + i * THREADS >= B * H;
    #pragma unroll
    for (int d = 0; d < DEPTH; ++d) {{
      #pragma unroll
      for (int i = 0; i < NP; ++i) {{ int f = tid + i * THREADS; if (f < B * H) q[d][i] = ld_relaxed(src + f); }}
      if (d + 1 < DEPTH) {{ long long t0 = clock64(); while (clock64() - t0 < STAGGER) {{ }} }}
    }}
    bool done = false;
    while (!done && spins < LIMIT) {{
      #pragma unroll
      for (int d = 0; d < DEPTH; ++d) {{
        done = true;
        #pragma unroll
        for (int i = 0; i < NP; ++i) {{
          if (!ok[i]) {{
            if ((int)(q[d][i] >> 32) == s) {{ v[i] = q[d][i]; ok[i] = true; }}
            else {{ q[d][i] = ld_relaxed(src + tid + i * THREADS); done = false; }}
          }}
        }}
        ++spins;
      }}
    }}
    #pragma unroll
    for (int i = 0; i < NP; ++i) {{
      int f = tid + i * THREADS;
      if (f < B * H) h_s[f / H * HP + f % H] = __int_as_float((int)(v[i] & 0xffffffffu));
    }}
#elif MODE == 5
    if (s == 0) for (int f = tid; f < B * H; f += THREADS) h_s[f / H * HP + f % H] = hbuf[f];
#elif !CLUSTER
    const float* src = hbuf + (s & 1) * B * H;
    #pragma unroll
    for (int i = 0; i < NP; ++i) {{
      int f = tid + i * THREADS;
      if (f < B * H) h_s[f / H * HP + f % H] = __ldcg(src + f);
    }}
#endif
#if !CLUSTER
    __syncthreads();
#endif
    float acc[3][B];
#if NO_MATH && TAGGED
    #pragma unroll
    for (int b = 0; b < B; ++b) {{ acc[0][b] = acc[1][b] = acc[2][b] = hv[b][0]; }}
#elif NO_MATH
    #pragma unroll
    for (int b = 0; b < B; ++b) {{ acc[0][b] = acc[1][b] = acc[2][b] = HS[b * HP + lane]; }}
#else
    #pragma unroll
    for (int b = 0; b < B; ++b) {{
      float a0 = 0.f, a1 = 0.f, a2 = 0.f;
      #pragma unroll
      for (int i = 0; i < KP; ++i) {{
#if TAGGED
        float hv_ = hv[b][i];
#else
        float hv_ = HS[b * HP + lane + i * 32];
#endif
        a0 += wr[0][i] * hv_; a1 += wr[1][i] * hv_; a2 += wr[2][i] * hv_;
      }}
      acc[0][b] = a0; acc[1][b] = a1; acc[2][b] = a2;
    }}
    #pragma unroll
    for (int off = 16; off > 0; off >>= 1)
      #pragma unroll
      for (int b = 0; b < B; ++b)
        #pragma unroll
        for (int g = 0; g < 3; ++g) acc[g][b] += __shfl_xor_sync(0xffffffffu, acc[g][b], off);
#endif
    float s_r = acc[0][0], s_z = acc[1][0], s_n = acc[2][0];  // the lane's row, selected (no divergent cells)
    #pragma unroll
    for (int b = 1; b < B; ++b) if (lane % B == b) {{ s_r = acc[0][b]; s_z = acc[1][b]; s_n = acc[2][b]; }}
    float r = sigm(g_r + s_r + b_r), z = sigm(g_z + s_z + b_z);
    float n = tanhf(g_n + r * (s_n + b_n));
#if TAGGED
    __syncwarp();  // every lane's words seen, word j among them
    // the word polled (by some lane) this step: its slot is written again only after this warp's h' of step s+1
    const float h_prev =
        __int_as_float((int)(hw_s[(s & 1) * B * HP + (lane % B) * HP + (j < H ? j : 0)] & 0xffffffffu));
    float hn = (1.f - z) * n + z * h_prev;
#else
    float hn = (1.f - z) * n + z * HS[(lane % B) * HP + (j < H ? j : 0)];
#endif
#if CLUSTER
    // lane l stores its row's h' (row l % B) into blocks l / B, l / B + 32 / B, ...
#if BULK
    // the block's h' gathered, then one bulk copy a (destination block, row) counted on its barrier
    if (tid < C * B) asm volatile("cp.async.bulk.wait_group.read 0;" ::: "memory");  // stage_s read out
    __syncthreads();
    if (s + 1 < T && lane < B) stage_s[lane * U + u] = hn;
    asm volatile("fence.proxy.async.shared::cta;" ::: "memory");
    __syncthreads();
    if (s + 1 < T && tid < C * B) {{
      const int t = tid / B, b = tid % B;
      const unsigned dst = smem(&h_nxt_local[b * HP + blockIdx.x * U]), bar_a = smem(&mbar[(s + 1) & 1]);
      asm volatile("cp.async.bulk.shared::cluster.shared::cta.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];"
                   :: "r"(peer(dst, t)), "r"(smem(&stage_s[b * U])), "r"(U * 4), "r"(peer(bar_a, t)) : "memory");
      asm volatile("cp.async.bulk.commit_group;" ::: "memory");
    }}
#elif PULL
    if (s + 1 < T && j < H && lane < B) {{  // the block's own slot; the others pull it
      const unsigned long long word = ((unsigned long long)(unsigned)(s + 1) << 32) | (unsigned)__float_as_int(hn);
      asm volatile("st.relaxed.cluster.shared::cta.b64 [%0], %1;"
                   :: "r"(smem(&pub_s[(((s + 1) & 1) * B + lane) * U + u])), "l"(word) : "memory");
    }}
#else
    if (s + 1 < T && j < H) {{
#if TAGGED || PUSH1
      const unsigned a = smem(&hw_s[((s + 1) & 1) * B * HP + (lane % B) * HP + j]);
      const unsigned long long word = ((unsigned long long)(unsigned)(s + 1) << 32) | (unsigned)__float_as_int(hn);
#else
      const unsigned a = smem(&h_nxt_local[(lane % B) * HP + j]);
#endif
#if MODE == 10 || MODE == 11
      const unsigned bar_a = smem(&mbar[(s + 1) & 1]);
#endif
      for (int t = lane / B; t < C; t += 32 / B) {{
#if TAGGED || PUSH1
        asm volatile("st.relaxed.cluster.shared::cluster.b64 [%0], %1;" :: "r"(peer(a, t)), "l"(word) : "memory");
#elif MODE == 12
        asm volatile("st.shared::cluster.f32 [%0], %1;" :: "r"(peer(a, t)), "f"(hn) : "memory");
#else
        asm volatile("st.async.shared::cluster.mbarrier::complete_tx::bytes.b32 [%0], %1, [%2];"
                     :: "r"(peer(a, t)), "r"(__float_as_uint(hn)), "r"(peer(bar_a, t)) : "memory");
#endif
      }}
    }}
#endif  // PULL
#endif
    if (lane < B && j < H) {{
#if CLUSTER
#elif MODE == 0 || MODE == 2 || MODE == 4 || MODE == 6 || MODE == 7
      unsigned long long word = ((unsigned long long)(unsigned)(s + 1) << 32) | (unsigned)__float_as_int(hn);
      #pragma unroll
      for (int r = 0; r < REPL; ++r) st_relaxed(xch + (((s + 1) & 1) * REPL + r) * B * H + lane * H + j, word);
#else
      hbuf[((s + 1) & 1) * B * H + lane * H + j] = hn;
#endif
      out[(s * B + lane) * H + j] = hn;
      if (!CLUSTER && s + 1 < T) {{
        const float* gn = gi + ((s + 1) * B + lane) * G;
        g_r = gn[j]; g_z = gn[H + j]; g_n = gn[2 * H + j];
      }}
    }}
#if MODE == 1
    __syncthreads();
    if (tid == 0) {{
      asm volatile("red.release.gpu.global.add.s32 [%0], 1;" :: "l"(bar) : "memory");
      int want = (s + 1) * gridDim.x, seen = 0;
      do {{ asm volatile("ld.acquire.gpu.global.s32 %0, [%1];" : "=r"(seen) : "l"(bar) : "memory"); }}
      while (seen < want && ++spins < LIMIT);
      if (spins >= LIMIT) bar[1] = 1;
    }}
#endif
#if MODE == 12
    cluster_sync();  // every block's h' of step s+1 stored, and every block done reading step s's slot
#elif !CLUSTER
    __syncthreads();
#endif
  }}
#if CLUSTER
  cluster_sync();  // no block leaves while another may still store into its shared memory
#endif
  if (spins >= LIMIT) bar[1] = 1;
}}
"""


MODES = ("flags", "barrier", "flags, no math", "no sync (racy)", "flags, one word first", "math only (h loaded once)",
         "flags, polls staggered", "flags, polls staggered, no math", "", "",
         "cluster, st.async + mbarrier", "cluster, st.async + mbarrier, no math", "cluster, stores + cluster barrier",
         "cluster, tagged words into every block's shared memory", "cluster, tagged words, no math",
         "cluster, tagged words, volatile polls", "cluster, tagged words, volatile polls, no math",
         "cluster, h' pulled from its writer's shared memory", "cluster, h' pulled, no math",
         "cluster, h' pulled two words a load", "cluster, h' pulled two words a load, no math",
         "cluster, h' gathered and bulk-copied into every block (mbarrier)", "cluster, bulk copies, no math",
         "cluster, tagged words into every block, each polled by one thread",
         "cluster, tagged words polled once, no math")


def reference(gi: np.ndarray, w: np.ndarray, bh: np.ndarray, h0: np.ndarray, steps: int) -> np.ndarray:
    """float64 GRU recurrence given gi (input gates with b_ih)."""
    hid = h0.shape[1]
    h, outs = h0.astype(np.float64), []
    for s in range(steps):
        gh = h @ w.astype(np.float64) + bh
        g = gi[s].astype(np.float64)
        sig = lambda x: 1 / (1 + np.exp(-x))  # noqa: E731
        r, z = sig(g[:, :hid] + gh[:, :hid]), sig(g[:, hid:2 * hid] + gh[:, hid:2 * hid])
        n = np.tanh(g[:, 2 * hid:] + r * gh[:, 2 * hid:])
        h = (1 - z) * n + z * h
        outs.append(h)
    return np.stack(outs)


def run(cp: object, batch: int, hidden: int, units: int, mode: int, steps: int, reps: int,
        depth: int = 1, stagger: int = 0) -> dict:
    repl = 1
    if mode in (8, 9):  # flags (no math) with h written to ``depth`` copies, block b reading copy b % depth
        mode, repl, depth = {8: 0, 9: 2}[mode], depth, 1
    kp = -(-hidden // 32)
    threads = 32 * units
    npl = -(-batch * hidden // threads)
    cluster = -(-hidden // units) if mode >= 10 else 0
    attr = f"__cluster_dims__({cluster}, 1, 1)" if cluster else ""
    src = SOURCE.format(B=batch, H=hidden, U=units, KP=kp, NP=npl, MODE=mode, DEPTH=depth, STAGGER=stagger, REPL=repl,
                        ATTR=attr)
    kernel = cp.RawKernel(src, "gru", options=("-std=c++17", "-arch=sm_90") if cluster else ("-std=c++17",))
    if cluster > 8:  # past the portable size: CU_FUNC_ATTRIBUTE_NON_PORTABLE_CLUSTER_SIZE_ALLOWED
        cp.cuda.driver.funcSetAttribute(kernel.kernel.ptr, 14, 1)
    rng = np.random.default_rng(0)
    scale = 1 / np.sqrt(hidden)
    gi = rng.uniform(-1, 1, (steps, batch, 3 * hidden)).astype(np.float32)
    w = rng.uniform(-scale, scale, (hidden, 3 * hidden)).astype(np.float32)
    bh = rng.uniform(-scale, scale, 3 * hidden).astype(np.float32)
    h0 = rng.uniform(-1, 1, (batch, hidden)).astype(np.float32)
    d_gi, d_w, d_bh = cp.asarray(gi), cp.asarray(w), cp.asarray(bh)
    out = cp.full((steps, batch, hidden), np.nan, cp.float32)
    xch = cp.zeros((2, repl, batch, hidden), cp.uint64)
    hbuf = cp.zeros((2, batch, hidden), cp.float32)
    bar = cp.zeros(2, cp.int32)
    packed0 = cp.asarray(h0.view(np.uint32).astype(np.uint64))
    grid = (-(-hidden // units),)

    def init() -> None:
        xch.fill(0)
        xch[0] = packed0[None]
        hbuf[0] = cp.asarray(h0)
        bar.fill(0)

    gi_bytes = steps * batch * 3 * units * 4 if cluster else 0
    if gi_bytes:
        kernel.max_dynamic_shared_size_bytes = gi_bytes

    def launch() -> None:
        kernel(grid, (32, units), (d_gi, d_w, d_bh, out, xch, hbuf, bar, np.int32(steps)), shared_mem=gi_bytes)

    init()
    launch()
    cp.cuda.Device().synchronize()
    err = float(np.linalg.norm(out.get() - reference(gi, w, bh, h0, steps)) /
                np.linalg.norm(reference(gi, w, bh, h0, steps)))
    timed_out = int(bar.get()[1])
    times = []
    start, stop = cp.cuda.Event(), cp.cuda.Event()
    for _ in range(reps):
        init()
        start.record()
        launch()
        stop.record()
        stop.synchronize()
        times.append(cp.cuda.get_elapsed_time(start, stop) * 1e3)
    label = MODES[mode] + (f" ({depth} in flight, {stagger} cycles apart)" if mode in (6, 7) else "") + \
        (f", {repl} copies of h" if repl > 1 else "")
    return {"batch": batch, "hidden": hidden, "units": units, "mode": label, "steps": steps,
            "blocks": grid[0], "us": statistics.median(times), "err": err, "timed_out": timed_out}


def main() -> None:
    import cupy as cp

    ap = argparse.ArgumentParser()
    ap.add_argument("--out", default=".")
    ap.add_argument("--reps", type=int, default=30)
    ap.add_argument("--modes", default="1,0,2,3",
                    help="0 flags, 1 barrier, 2 flags without the math, 3 no sync, 6:D:S polls staggered "
                         "(D loads a word in flight, S cycles apart), 7:D:S the same without the math, "
                         "8:R flags with h in R copies, 9:R the same without the math, "
                         "10 a thread-block cluster of all blocks, h' stored into every block's shared memory by "
                         "st.async counted on its mbarrier, 11 the same without the math, 12 plain stores into the "
                         "cluster and a cluster barrier a step, 13 (value, step tag) words stored into every "
                         "block's shared memory and polled there, 14 the same without the math, 15 / 16 as 13 / 14 "
                         "with volatile polls, 17 each block's h' kept in its own shared memory as tagged words and "
                         "pulled by every block with remote loads polled until tagged, 18 the same without the "
                         "math, 19 / 20 as 17 / 18 two words a load, 21 each block's h' gathered in its shared memory "
                         "and copied into every block by one cp.async.bulk a block counted on its mbarrier, 22 the "
                         "same without the math, 23 / 24 as 13 / 14 with each word polled by one thread and shared "
                         "(cluster modes read the input gates from "
                         "shared memory, loaded before the first step)")
    ap.add_argument("--cases", default="1x256x8,1x256x16,8x512x8,8x512x4,8x1024x8", help="BxHxunits,...")
    args = ap.parse_args()
    ap_modes = [tuple(int(v) for v in m.split(':')) for m in args.modes.split(',')]
    cases = [tuple(int(v) for v in c.split('x')) for c in args.cases.split(',')]
    rows = []
    with open(os.path.join(args.out, "gru_flag_probe.jsonl"), "a") as f:
        for batch, hidden, units in cases:
            for mode in ap_modes:
                per = {}
                for steps in (128, 512):
                    rec = run(cp, batch, hidden, units, mode[0], steps, args.reps, *mode[1:])
                    f.write(json.dumps(rec) + "\n")
                    per[steps] = rec
                slope = (per[512]["us"] - per[128]["us"]) / 384
                rows.append((batch, hidden, units, per[128]["blocks"], per[128]["mode"], per[128]["us"], slope,
                             max(per[128]["err"], per[512]["err"]), per[128]["timed_out"] + per[512]["timed_out"]))
    print("| B | H | units | blocks | exchange | T=128 µs | µs/step | err | timeouts |")
    print("|---|---|---|---|---|---|---|---|---|")
    for r in rows:
        print(f"| {r[0]} | {r[1]} | {r[2]} | {r[3]} | {r[4]} | {r[5]:.1f} | {r[6]:.2f} | {r[7]:.1e} | {r[8]} |")


if __name__ == "__main__":
    main()
