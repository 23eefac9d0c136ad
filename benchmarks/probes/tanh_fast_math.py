"""tanhf and expf under NVRTC's --use_fast_math (TVM's default) against float64, and an
expm1f-based tanh: which elementwise function costs the float32 GRU its accuracy."""
import cupy as cp
import numpy as np

SRC = r'''
extern "C" __global__ void f(const float* x, float* a, float* b, float* c, float* d, int n) {
  int i = blockIdx.x * blockDim.x + threadIdx.x;
  if (i < n) {
    float v = x[i];
    a[i] = tanhf(v);
    b[i] = 1.0f / (1.0f + expf(-v));
    float e = expm1f(-2.0f * fabsf(v));
    c[i] = copysignf(-e / (2.0f + e), v);
    d[i] = 0.5f * tanhf(0.5f * v) + 0.5f;
  }
}'''
x = np.linspace(-8, 8, 1 << 20).astype(np.float32)
x = np.concatenate([x, np.random.default_rng(0).normal(0, 1, 1 << 20).astype(np.float32)])
ref_t = np.tanh(x.astype(np.float64))
ref_s = 1 / (1 + np.exp(-x.astype(np.float64)))
for opts in ((), ("--use_fast_math",)):
    k = cp.RawKernel(SRC, "f", options=opts)
    dx = cp.asarray(x)
    outs = [cp.empty_like(dx) for _ in range(4)]
    k(((x.size + 255) // 256,), (256,), (dx, *outs, np.int32(x.size)))
    a, b, c, d = (o.get().astype(np.float64) for o in outs)
    rel = lambda y, r: float(np.max(np.abs(y - r) / np.maximum(np.abs(r), 1e-30)))  # noqa: E731
    print(opts or "precise", f"tanhf {rel(a, ref_t):.1e}  sigmoid(expf) {rel(b, ref_s):.1e}  "
          f"tanh(expm1f) {rel(c, ref_t):.1e}  sigmoid(tanhf) {rel(d, ref_s):.1e}")
