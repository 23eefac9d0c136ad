"""The GEMM family, one template per way of computing C = A·B: SIMT (``simt``), WMMA tensor cores
(``wmma``, ``tensor_core``), ``mma.sync`` (``mma``, ``mma_intrin``), Hopper's warpgroup MMA
(``wgmma``, ``wgmma_steps``, ``wgmma_template``), float32 on TF32 tensor cores (``gemm_3xtf32``),
the kernel as a knob (``tensor_core_choice``) and the tile sizes they share (``warp_tile``,
``tensor_core_tile``)."""
from .simt import GemmTemplate  # noqa: F401 (its import path before the family had a package)
