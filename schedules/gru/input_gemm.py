"""The GRU's input GEMM (S1, x·W_ihᵀ + b_ih for every step at once) where it runs on Hopper's
wgmma: float32 as float16 parts (``in_split`` 2) or TF32 parts (``in_split`` 3, stored three or
two deep: ``in_tf32_parts``), or 16-bit x and W_ih as they are (``in_wgmma``); the PrimFuncs by
name, W_ih's split among them (run once as the weights are loaded: ``plan.prepare_calls``)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from tvm_ext.core.space import Config
from tvm_ext.core.template import TensorSpec
from tvm_ext.schedules.gemm.gemm_3xtf32 import promote_steps, split_a_func
from tvm_ext.schedules.gemm.wgmma import WgmmaTile, k_parts_reason, promote_reason, wgmma_gemm

from .split import PARTS, SPLIT_WEIGHT_SCALE, split_depth, split_weight_n_major_func, tf32_k_parts, tf32_orders


def wgmma_input_gemms(template: Any, config: Config) -> dict[str, Any]:
    """``gru_gemm_x{kind}`` for each input GEMM kind of ``template`` (a ``GruTemplate``) on wgmma
    under ``config``, with the splits of the parts it reads (``gru_split_w{kind}``, and
    ``gru_split_x{kind}`` where ``gemm_3xtf32``'s kernel splits x); none where it runs elsewhere."""
    p, (m, n) = template.precision, template.gi_shape
    funcs = {}
    if config.in_split >= 2:  # the split input GEMM on wgmma: float16 parts (2), TF32 parts (3)
        tf32, parts = config.in_split == 3, template.stored_parts(config)
        tile = (template.tf32_input_tile(config) if tf32
                else template.counted_gemm_tile(config) or template.in_split_wgmma)
        for i in template.input_gemm_kinds():
            funcs.update(split_input_gemm(SplitInputGemm(
                "gru", i, tile, m, n, template.layer_input(i), template.input_depth(i, config), p["gi"], p["w_ih"],
                tf32, parts, config.in_tf32_promote, bool(config.step_overlap),
                template.split_rows_written(config, i))))
    if config.in_wgmma:  # the 16-bit input GEMM on wgmma, W_ih (K, N) read N-major
        tile = template.counted_gemm_tile(config) or template.in_wgmma_tile
        for i in template.input_gemm_kinds():
            funcs[f"gru_gemm_x{i}"] = wgmma_gemm(tile, m, n, template.layer_input(i), c_dtype=p["gi"],
                                                 bias_dtype=p["w_ih"], b_layout="KN", signal=bool(config.step_overlap))
    return funcs


class SplitInputParts:
    """What a recurrent template (the GRU's, the LSTM's; its ``layer_input``, ``input_gemm_kinds``,
    sizes and ``split_buffers`` / ``split_parts``) derives from its input GEMM's operands split into
    parts (``in_split``): the parts a row stores, the GEMM's depth, who splits x, and the parts'
    buffers."""

    def stored_parts(self, config: Config) -> int:
        """The TF32 or float16 parts each row of the split input GEMM's operands holds."""
        return config.in_tf32_parts if config.in_split == 3 else PARTS

    def input_depth(self, kind: int, config: Config) -> int:
        """The depth of input GEMM ``kind`` (0: layer 0's, 1: the later layers'; ``input_gemm_kinds``),
        its float16 or TF32 parts' with ``in_split``."""
        k = self.layer_input(kind)
        return PARTS * split_depth(k) if config.in_split else k

    def split_rows_written(self, config: Config, kind: int) -> bool:
        """Whether input GEMM ``kind``'s x is split by ``gemm_3xtf32``'s kernel (four columns a
        thread, 16-byte loads and stores) rather than the scheduled one (an output element a
        thread): TF32 parts (``in_split`` 3) of a depth that needs no padding."""
        k = self.layer_input(kind)
        return config.in_split == 3 and split_depth(k) == k

    def part_specs(self, columns: int) -> dict[str, TensorSpec]:
        """The parts of the input GEMM's operands for the config of ``split_buffers`` (none without
        one): x's per depth K (``xs<kind>``), W_ih's of ``columns`` (dirs x the gates' columns) per
        layer (``ws<layer>``, split once as the weights are loaded): TF32 parts as float32 words,
        float16 parts N-major on wgmma (``in_split`` 2) and K-major on mma.sync (1)."""
        if not self.split_buffers:
            return {}
        parts = "float32" if self.split_buffers == 3 else "float16"
        specs = {f"xs{i}": TensorSpec((self.seq * self.batch, self.split_parts * split_depth(self.layer_input(i))),
                                      parts) for i in self.input_gemm_kinds()}
        for layer in range(self.layers):
            depth = self.split_parts * split_depth(self.layer_input(layer))
            specs[f"ws{layer}"] = TensorSpec((columns, depth) if self.split_buffers >= 2 else (depth, columns), parts)
        return specs


@dataclass(frozen=True)
class SplitInputGemm:
    """One input GEMM kind of a recurrent operator (the GRU's, the LSTM's) run on wgmma over x's
    and W_ih's parts: ``prefix``'s function names, the tile, gi's (M, N), the depth K and the
    parts' depth, and how the parts are made and read."""

    prefix: str  # "gru", "lstm": the functions are <prefix>_gemm_x<kind>, <prefix>_split_w<kind>, ...
    kind: int
    tile: WgmmaTile
    m: int
    n: int
    k: int
    depth: int  # the parts' depth (float16: 3 x the padded K; TF32: parts x the padded K)
    gi_dtype: str
    bias_dtype: str
    tf32: bool  # TF32 parts (in_split 3), else float16 parts with W_ih scaled (in_split 2)
    parts: int  # the parts each row stores (``stored_parts``)
    promote: int = 0  # ``in_tf32_promote``: 0 promotes every ``promote_steps``, 1 or 2 overlapped
    signal: bool = False  # the GEMM counts its stored rows for a step kernel running beside it
    rows_written: bool = False  # x split by ``gemm_3xtf32``'s kernel (else a scheduled one: the caller's)


def tf32_parts_reason(tile: WgmmaTile, depths: Any, parts: int, promote: int = 0) -> str | None:
    """Why ``tile`` cannot run an input GEMM of TF32 parts at each of ``depths``: promoting its
    sums every ``promote`` k steps in two alternating sets (``in_tf32_promote``), or taking its k
    steps from ``parts`` stored parts (``in_tf32_parts`` 2: the TMA's loads); None where it can."""
    for depth in depths:
        reason = promote and promote_reason(tile, depth, promote, overlap=True)
        if reason:
            return f"in_tf32_promote {promote}: {reason}"
        reason = k_parts_reason(tile, depth, "NK", tf32_k_parts(parts))
        if reason:
            return f"in_tf32_parts {parts}: {reason}"
    return None


def split_input_gemm(g: SplitInputGemm) -> dict[str, Any]:
    """The PrimFuncs of ``g`` by name: the GEMM, W_ih's split (run once as the weights are
    loaded: ``prepare_calls``) and, where ``rows_written``, x's split."""
    # float16: W_ih's scale undone before the bias; TF32: no scale, sums promoted as gemm_3xtf32 does
    way = (dict(promote=g.promote or promote_steps(g.tile, g.depth), k_parts=tf32_k_parts(g.parts),
                overlap=bool(g.promote)) if g.tf32 else dict(scale=1.0 / SPLIT_WEIGHT_SCALE))
    funcs = {f"{g.prefix}_gemm_x{g.kind}": wgmma_gemm(g.tile, g.m, g.n, g.depth, c_dtype=g.gi_dtype,
                                                      bias_dtype=g.bias_dtype, signal=g.signal, **way),
             f"{g.prefix}_split_w{g.kind}": split_weight_n_major_func(g.k, g.n, tf32=g.tf32, parts=g.parts)}
    if g.rows_written:
        funcs[f"{g.prefix}_split_x{g.kind}"] = split_a_func(g.m, g.k, tf32_orders(g.parts)[0])
    return funcs
