"""The GRU's input GEMM (S1, x·W_ihᵀ + b_ih for every step at once) where it runs on Hopper's
wgmma: float32 as float16 parts (``in_split`` 2) or TF32 parts (``in_split`` 3, stored three or
two deep: ``in_tf32_parts``), or 16-bit x and W_ih as they are (``in_wgmma``); the PrimFuncs by
name, W_ih's split among them (run once as the weights are loaded: ``plan.prepare_calls``)."""
from __future__ import annotations

from typing import Any

from tvm_ext.core.space import Config
from tvm_ext.schedules.gemm.gemm_3xtf32 import promote_steps, split_a_func
from tvm_ext.schedules.gemm.wgmma import wgmma_gemm

from .split import SPLIT_WEIGHT_SCALE, split_weight_n_major_func, tf32_k_parts, tf32_orders


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
            k, depth = template.layer_input(i), template.input_depth(i, config)
            # float16: W_ih's scale undone before the bias; TF32: no scale, sums promoted as gemm_3xtf32 does
            way = (dict(promote=config.in_tf32_promote or promote_steps(tile, depth), k_parts=tf32_k_parts(parts),
                        overlap=bool(config.in_tf32_promote)) if tf32 else dict(scale=1.0 / SPLIT_WEIGHT_SCALE))
            funcs[f"gru_gemm_x{i}"] = wgmma_gemm(tile, m, n, depth, c_dtype=p["gi"], bias_dtype=p["w_ih"],
                                                 signal=bool(config.step_overlap), **way)
            funcs[f"gru_split_w{i}"] = split_weight_n_major_func(k, n, tf32=tf32, parts=parts)
            if template.split_rows_written(config, i):
                funcs[f"gru_split_x{i}"] = split_a_func(m, k, tf32_orders(parts)[0])
    if config.in_wgmma:  # the 16-bit input GEMM on wgmma, W_ih (K, N) read N-major
        tile = template.counted_gemm_tile(config) or template.in_wgmma_tile
        for i in template.input_gemm_kinds():
            funcs[f"gru_gemm_x{i}"] = wgmma_gemm(tile, m, n, template.layer_input(i), c_dtype=p["gi"],
                                                 bias_dtype=p["w_ih"], b_layout="KN", signal=bool(config.step_overlap))
    return funcs
