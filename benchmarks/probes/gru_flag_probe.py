"""Probe: does exchanging h with a step tag in every word beat a grid barrier per step?

A persistent GRU step kernel (float32, W_hh in registers, one block per ``units`` hidden
units, 32 lanes splitting k) written in CUDA C and run through CuPy, in two forms that
differ only in how step s+1 learns that every block's h_{s+1} is written:

- ``barrier``: h stored plainly; every block arrives on a counter (release add) and polls
  it (acquire loads), then loads h (the form of the persistent kernel ``tvm_ext`` builds);
- ``flags``: h stored as 8-byte words (value, step tag) with one relaxed 64-bit store; a
  reader polls the words themselves until every tag says step s+1 (no counter, no fence).

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

__device__ __forceinline__ unsigned long long ld_relaxed(const unsigned long long* p) {{
  unsigned long long v; asm volatile("ld.relaxed.gpu.global.b64 %0, [%1];" : "=l"(v) : "l"(p) : "memory"); return v; }}
__device__ __forceinline__ void st_relaxed(unsigned long long* p, unsigned long long v) {{
  asm volatile("st.relaxed.gpu.global.b64 [%0], %1;" :: "l"(p), "l"(v) : "memory"); }}
__device__ __forceinline__ float sigm(float x) {{ return 1.f / (1.f + __expf(-x)); }}

extern "C" __global__ void __launch_bounds__(THREADS) gru(
    const float* __restrict__ gi, const float* __restrict__ w, const float* __restrict__ bh,
    float* __restrict__ out, unsigned long long* xch, float* hbuf, int* bar, int T) {{
  __shared__ float h_s[B * HP];
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
  for (int f = tid; f < B * HP; f += THREADS) h_s[f] = 0.f;
  float b_r = j < H ? bh[j] : 0.f, b_z = j < H ? bh[H + j] : 0.f, b_n = j < H ? bh[2 * H + j] : 0.f;
  float g_r = 0.f, g_z = 0.f, g_n = 0.f;
  if (lane < B && j < H) {{ g_r = gi[lane * G + j]; g_z = gi[lane * G + H + j]; g_n = gi[lane * G + 2 * H + j]; }}
  int spins = 0;
  __syncthreads();
  for (int s = 0; s < T; ++s) {{
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
#else
    const float* src = hbuf + (s & 1) * B * H;
    #pragma unroll
    for (int i = 0; i < NP; ++i) {{
      int f = tid + i * THREADS;
      if (f < B * H) h_s[f / H * HP + f % H] = __ldcg(src + f);
    }}
#endif
    __syncthreads();
    float acc[3][B];
#if MODE == 2 || MODE == 7
    #pragma unroll
    for (int b = 0; b < B; ++b) {{ acc[0][b] = acc[1][b] = acc[2][b] = h_s[b * HP + lane]; }}
#else
    #pragma unroll
    for (int b = 0; b < B; ++b) {{
      float a0 = 0.f, a1 = 0.f, a2 = 0.f;
      #pragma unroll
      for (int i = 0; i < KP; ++i) {{
        float hv = h_s[b * HP + lane + i * 32];
        a0 += wr[0][i] * hv; a1 += wr[1][i] * hv; a2 += wr[2][i] * hv;
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
    for (int b = 1; b < B; ++b) if (lane == b) {{ s_r = acc[0][b]; s_z = acc[1][b]; s_n = acc[2][b]; }}
    float r = sigm(g_r + s_r + b_r), z = sigm(g_z + s_z + b_z);
    float n = tanhf(g_n + r * (s_n + b_n));
    float hn = (1.f - z) * n + z * h_s[(lane % B) * HP + (j < H ? j : 0)];
    if (lane < B && j < H) {{
#if MODE == 0 || MODE == 2 || MODE == 4 || MODE == 6 || MODE == 7
      unsigned long long word = ((unsigned long long)(unsigned)(s + 1) << 32) | (unsigned)__float_as_int(hn);
      #pragma unroll
      for (int r = 0; r < REPL; ++r) st_relaxed(xch + (((s + 1) & 1) * REPL + r) * B * H + lane * H + j, word);
#else
      hbuf[((s + 1) & 1) * B * H + lane * H + j] = hn;
#endif
      out[(s * B + lane) * H + j] = hn;
      if (s + 1 < T) {{
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
    __syncthreads();
  }}
  if (spins >= LIMIT) bar[1] = 1;
}}
"""


MODES = ("flags", "barrier", "flags, no math", "no sync (racy)", "flags, one word first", "math only (h loaded once)",
         "flags, polls staggered", "flags, polls staggered, no math")


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
    src = SOURCE.format(B=batch, H=hidden, U=units, KP=kp, NP=npl, MODE=mode, DEPTH=depth, STAGGER=stagger, REPL=repl)
    kernel = cp.RawKernel(src, "gru", options=("-std=c++17",))
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

    def launch() -> None:
        kernel(grid, (32, units), (d_gi, d_w, d_bh, out, xch, hbuf, bar, np.int32(steps)))

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
                         "8:R flags with h in R copies, 9:R the same without the math")
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
