"""Where the float32 GRU's error comes from: the error against float64 of a few configs, as
built by default and with NVRTC's fast math undone (TVM_CUDA_NVRTC_EXTRA_OPTS)."""
import sys

import numpy as np

from tvm_ext.precision.precision import relative_error
from tvm_ext.schedules.gru import GRU, gru_reference
from tvm_ext.target import resolve_target

rng = np.random.default_rng(0)
B, H, T = 8, 512, 64
w = {}
for n, s in (("weight_ih_l0", (3 * H, H)), ("weight_hh_l0", (3 * H, H)), ("bias_ih_l0", (3 * H,)),
             ("bias_hh_l0", (3 * H,))):
    w[n] = rng.uniform(-H ** -0.5, H ** -0.5, s).astype(np.float32)
x = rng.uniform(-1, 1, (T, B, H)).astype(np.float32)
ref, ref_h = gru_reference(x, w)
target = resolve_target("cuda", 0)
for name, cfg in (("pick", None), ("unfused in_split0", {"fuse_step": 0, "in_split": 0}),
                  ("persistent in_split0", {"fuse_step": 1, "step_loop": 2, "in_split": 0})):
    g = GRU.build(target, H, H, batch=B, seq=T, config=cfg).load_numpy(w)
    out, h = g(x)
    print(sys.argv[1], name, f"{relative_error(out, ref):.2e}", f"{relative_error(h, ref_h):.2e}", flush=True)
