"""The tensor-core tile a float16 or bfloat16 GEMM takes wherever it runs on CUDA: the GEMM
template (``GemmTemplate(tensor_core=...)``), the GRU's input and hidden GEMMs
(``GruTemplate(in_tensor_core=..., hid_tensor_core=...)``) and the mixed-precision programs
built from them (``--tensor-core``, ``--hidden-tensor-core``).

A tile (``gemm.TensorCoreTile``) says which kernel and holds that kernel's knobs:

- ``mma.MmaGemmTile``: mma.sync + ldmatrix (``mma_`` knobs), float16 or bfloat16 operands,
  M padded to the tile; it measured faster than WMMA at 4096^3 and on the GRU's per-step
  shapes (``docs/results/gemm.md``);
- ``wmma.WmmaGemmTile``: WMMA fragments (``tc_`` knobs), float16 operands, every dimension a
  multiple of the tile; it also runs on sm_70/75 and takes shapes mma's smallest tile (16x32x32)
  does not divide (e.g. N = 48).

``parse_tile`` reads one from text (``str(tile)`` is that text, so a tile round-trips);
``pick_tile`` chooses one for a set of shapes without measuring: mma.sync where one of its
tiles fits, else WMMA, else None.
"""
from __future__ import annotations

from typing import Sequence

from tvm_ext.core.errors import TvmExtError
from tvm_ext.schedules.gemm.simt import TensorCoreTile
from tvm_ext.schedules.gemm.mma import AUTO_TILES as MMA_TILES
from tvm_ext.schedules.gemm.mma import MMA_SPACE, MmaGemmTile, pick_mma_tile_for
from tvm_ext.schedules.gemm.wmma import AUTO_TILES as WMMA_TILES
from tvm_ext.schedules.gemm.wmma import TC_SPACE, WmmaGemmTile, pick_wmma_tile
from tvm_ext.core.space import Config, Space
from tvm_ext.target import TargetInfo

# kernel -> (tile class, knob prefix, knob space, the tile parse_tile changes: 128x128x32)
KERNELS = {
    "mma": (MmaGemmTile, "mma_", MMA_SPACE, MMA_TILES[0]),
    "wmma": (WmmaGemmTile, "tc_", TC_SPACE, WMMA_TILES[1]),
}


def tile_of(kernel: str, config: Config) -> TensorCoreTile:
    """The tile of ``kernel`` ("mma" or "wmma") with ``config``'s knobs."""
    if kernel not in KERNELS:
        raise TvmExtError(f"unknown tensor-core kernel {kernel!r}; kernels: {', '.join(KERNELS)}")
    return KERNELS[kernel][0](config)


def _knob_list() -> str:
    return "; ".join(f"{kernel}: {', '.join(space.names)}" for kernel, (_, _, space, _) in KERNELS.items())


def parse_tile(text: str) -> TensorCoreTile | None:
    """A tile from the command line: ``none``; ``mma`` or ``wmma`` (that kernel's 128x128x32
    tile); or one kernel's knobs as k=v,... over that tile (``mma_`` knobs: mma.sync, ``tc_``
    knobs: WMMA).  Unknown knobs, values and mixed kernels are errors naming the allowed ones."""
    text = text.strip()
    if text == "none":
        return None
    if text in KERNELS:
        return tile_of(text, KERNELS[text][3])
    values: dict[str, int] = {}
    for item in text.split(","):
        key, sep, value = item.partition("=")
        if not sep or not value.strip().lstrip("-").isdigit():
            raise TvmExtError(f"tensor-core tile item {item!r} is not knob=integer ({_knob_list()}), "
                              f"or use 'none' / 'auto' / 'mma' / 'wmma'")
        values[key.strip()] = int(value)
    kernels = {kernel for kernel, (_, prefix, _, _) in KERNELS.items() for key in values if key.startswith(prefix)}
    if len(kernels) > 1:
        raise TvmExtError("a tensor-core tile is of one kernel: give mma_ knobs (mma.sync) or tc_ knobs (WMMA), "
                          "not both")
    kernel = kernels.pop() if kernels else ""
    space: Space | None = KERNELS[kernel][2] if kernel else None
    unknown = sorted(set(values) - set(space.names if space else ()))
    if unknown:
        knobs = ", ".join(space.names) if space else _knob_list()
        raise TvmExtError(f"unknown tensor-core knob {unknown[0]!r}; knobs: {knobs}")
    return tile_of(kernel, space.make(**{**KERNELS[kernel][3].as_dict(), **values}))  # type: ignore[union-attr]


def pick_tile(shapes: Sequence[tuple[int, int, int]], target: TargetInfo, acc_dtype: str = "float32", *,
              batch: int = 0) -> TensorCoreTile | None:
    """A tile for the float16/bfloat16 GEMMs of every (M, N, K) in ``shapes`` (``batch``: of a
    batched GEMM) on ``target``, without measuring: ``mma.pick_mma_tile_for``'s whole-K tile
    where one fits them all (output staged, as for a bias row or a narrowing store), else
    ``wmma.pick_wmma_tile``'s tile, else None (the GEMMs stay on the CUDA cores).  No tile that
    pads N or K: the GRU's float32 input GEMM on float16 parts of a padded tile measured 1.3-1.4x
    faster at H1000 but 8x less accurate than on the CUDA cores (docs/results/gru.md), and the
    16-bit GRUs and the mixed-precision GEMMs keep the tiles they were measured with."""
    mma = pick_mma_tile_for(shapes, "float16", acc_dtype, "float16", target, split_k=False, epilogue=True,
                            batch=batch, pad=False)
    if mma is not None:
        return MmaGemmTile(mma)
    wmma = pick_wmma_tile(shapes, target, acc_dtype)
    return WmmaGemmTile(wmma) if wmma is not None else None
