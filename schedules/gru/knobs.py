"""The GRU template's knobs: the step kernels' (``STEP_KNOBS``), the input GEMM's choice of
kernel (``in_split``, ``in_wgmma``) and the hidden one's (``hid_wgmma``), and the input and
hidden GEMMs' tiles (the GEMM template's knobs, prefixed ``in_`` and ``hid_``)."""
from __future__ import annotations

from tvm_ext.schedules.gemm.simt import KNOBS as GEMM_KNOBS
from tvm_ext.schedules.gemm.wgmma import TILES_PER_BLOCK
from tvm_ext.core.space import Config, Knob

# Tiles a block of an input GEMM counted for the step kernel (``step_overlap``): the GEMM's own
# choices, and more for a GEMM of hundreds of tile rows on the SMs a resident step grid leaves
COUNTED_TILES_PER_BLOCK = TILES_PER_BLOCK + (32, 64)

STEP_KNOBS = (
    Knob("cell_block", (32, 64, 128, 256, 512, 1024),
         "cell kernel threads per block (the published pipeline: 512), clamped to the device limit"),
    Knob("fuse_step", (0, 1),
         "1: hidden GEMM + cell in one kernel per step (one launch fewer per step)"),
    Knob("step_j", (2, 4, 8, 16, 32, 64, 128, 256), "fused step kernel: threads along the hidden units "
                                                   "(threadIdx.x; times step_ks x step_bt threads a block), "
                                                   "step_u units each"),
    Knob("step_b", (1, 2, 4, 8, 16), "fused step kernel: batch rows per thread (reuse of W_h in registers)"),
    Knob("step_u", (1, 2, 4), "fused step kernel: hidden units per thread (reuse of each h value read from "
                              "shared memory for 3 x step_u gate sums); a block covers step_j x step_u units"),
    Knob("step_bt", (1, 2, 4, 8, 16), "fused step kernel: threads along batch rows (threadIdx.z); a block "
                                      "covers step_bt x step_b rows, so an on-chip W slice serves more rows"),
    Knob("step_k", (8, 16, 32, 64, 128), "fused step kernel: slice of h staged in shared memory"),
    Knob("step_pipeline", (0, 1, 2, 3), "fused step kernel: n > 0 stages the h slice in n + 1 buffers, the fills of "
                                        "the next n slices overlapping the math of this one (a software pipeline)"),
    Knob("step_ks", (1, 2, 4, 8, 16), "fused step kernel: threads splitting each dot product over k "
                                  "(more warps in flight; partial sums meet in shared memory)"),
    Knob("step_loop", (0, 1, 2), "fused step kernel, CUDA: 0 one call per step from Python; 1 the step "
                                 "loop compiled into TVM's host code (one call per layer); 2 persistent: "
                                 "one launch per layer, a grid barrier between steps (grid <= SM count)"),
    Knob("step_prefetch", (0, 1), "fused step kernel: 1 loads the step's gi and b_h into registers before the "
                                  "dot products (their latency behind the math; the persistent kernel loads b_h "
                                  "once)"),
    Knob("step_barrier", (0, 1, 2), "persistent step kernel (step_loop 2): its grid barrier's leader arrives with "
                                     "an atomic add and polls with 0 atomics, 1 volatile loads, 2 acquire loads "
                                     "(arriving with a release add; no trailing fence)"),
    Knob("step_w_onchip", (0, 1, 2), "fused step kernel: 1 stages the block's W_hh slice (step_j x step_u units x 3 "
                                     "gates x hidden) in shared memory, 2 keeps each thread's share (3 gates x "
                                     "hidden/step_ks) in registers; the persistent kernel loads it once for all "
                                     "T steps, so W_hh stays on chip (else every step re-reads it from L2)"),
    Knob("step_tc", (0, 1, 2), "persistent step kernel, CUDA: 1 (h and W_hh both float16 or both bfloat16) runs "
                               "the gate dot products on the tensor cores (mma.sync), W_hh's slice of step_j units "
                               "(8, 16 or 32) in shared memory for all T steps (``tensor_core_step.py``); 2 (float32 "
                               "h and W_hh) as three products of their float16 high and low parts, float32-accurate: "
                               "with step_flags 0 16 or 32 units, h read in chunks behind the grid barrier "
                               "(``split_step.py``); with step_flags 1 the tensor-core kernel of step_tc 1 exchanging "
                               "one float32 value a word, split into parts where it is polled"),
    Knob("step_tc_rows", (16, 32, 64), "tensor-core step kernel: batch rows per block (16 per warp along M)"),
    Knob("step_tc_kw", (1, 2, 4, 8), "tensor-core step kernel: warps splitting each dot product over k (their "
                                     "partial sums meet in shared memory)"),
    Knob("step_tc_nw", (1, 2, 4), "tensor-core step kernel: warps splitting the block's units (each its units' "
                                  "three gates over all k, no partial sums; they share the block's copy of h)"),
    Knob("step_tc_acc", (1, 2, 4), "tensor-core step kernel: accumulator sets a warp's k slices take turns in "
                                   "(summed before the cell): more independent mma.sync chains in flight, more "
                                   "registers", before=1),
    Knob("step_tc_frag", (0, 1), "tensor-core step kernel: 1 loads the next k slice's ldmatrix fragments before "
                                 "this slice's mma.sync (two fragment buffers), so the loads' latency runs behind "
                                 "the multiplies", before=0),
    Knob("step_tc_wreg", (0, 1, 2, 3), "tensor-core step kernel: 1 keeps the warp's W_hh fragments in registers "
                                       "for all T steps (ldmatrix'd from shared memory once), so a step's products "
                                       "read only h from shared memory, where they fit (step_tc_wregs a lane); 2 "
                                       "keeps those of the warp's first k slices that fit, the rest read every step; "
                                       "3 as 2 with the held ones loaded from global memory, so only the rest have "
                                       "rows in shared memory (room for k warps' partial sums beside W)", before=0),
    Knob("step_tc_wregs", (96, 128, 160), "tensor-core step kernel with step_tc_wreg 1 to 3: registers a lane "
                                         "may keep W_hh's fragments in (more leave fewer for the rest; past "
                                         "255 a lane the compiler spills)", before=96),
    Knob("step_tc_poll", (8, 16), "tensor-core step kernel with step_flags 1: bytes of exchange words a lane "
                                  "loads at once polling h, one word (8) or two adjacent words in one vector load "
                                  "(16; hidden a multiple of 4): half the poll's load instructions", before=8),
    Knob("step_tc_warp_h", (0, 1), "tensor-core step kernel with step_flags 1 and one warp along the units "
                                   "(step_tc_nw 1): 1 writes the h a warp polled into shared memory with PTX stores "
                                   "TVM's barrier pass does not see, so no block barrier stands between a warp's poll "
                                   "and its products (which read only the h that warp polled): the first warps "
                                   "multiply while the last still wait for their words", before=0),
    Knob("step_tc_stack", (0, 1), "split tensor-core step kernel (step_tc 2 with step_flags 1) with batch 8 or less "
                                  "and 16 rows a block: 1 stacks h's low parts under its high parts in the m16 tile "
                                  "(rows 8-15, padding before), so one ldmatrix and two mma.sync a W part give all "
                                  "four products (hi and lo times W's hi and lo) where three of the padded tile "
                                  "gave three; rows 8-15 are folded into 0-7 before the k warps' sums", before=0),
    Knob("step_split_words", (1, 2), "split tensor-core step kernel with step_flags 1: float32 values of h an "
                                     "exchange word, 1 beside a 32-bit step tag, 2 (adjacent units) beside a one-bit "
                                     "tag in the first value's lowest mantissa bit, which the float16 parts drop "
                                     "anyway: half the words to poll", before=1),
    Knob("step_tc_ahead", (1, 2, 4), "split tensor-core step kernel (step_tc 2): chunks of h loaded ahead into "
                                     "registers (each load's L2 latency behind this many chunks' products)",
         before=1),
    Knob("step_overlap", (0,) + COUNTED_TILES_PER_BLOCK,
         "tensor-core step kernel with step_flags 1, or the resident-W cell step kernel (step_cell 1), and the "
         "input GEMM on wgmma (Hopper): N > 0 launches the step kernel while the input GEMM runs (programmatic "
         "dependent launch), the GEMM storing its tiles in row order, N a block, and counting each tile row of gi "
         "it has stored, the step kernel waiting for a step's rows before loading them: the GEMM's time behind the "
         "steps where the step kernel leaves SMs free (32 and 64 tiles a block: a GEMM of many tile rows on the few "
         "SMs a large step grid leaves)", before=0),
    Knob("step_overlap_bn", (0, 32, 64),
         "step_overlap > 0: columns of the counted input GEMM's tile (0: the GEMM's own tile's), narrower so that "
         "its first tile rows, which the first steps wait for, are stored sooner (more tiles a block over the same "
         "SMs)", before=0),
    Knob("step_overlap_tma", (0, 1), "step_overlap > 0: 1 loads the counted input GEMM's operands with TMA "
                                     "(mbarrier pipeline) where its own tile loads them with cp.async", before=0),
    Knob("step_overlap_stages", (0, 8, 12, 16),
         "step_overlap > 0: stages of the counted input GEMM's pipeline (0: the GEMM's own tile's), more so that "
         "its loads are issued further ahead of the k steps that read them, their latency hidden where the step "
         "kernel's polls load the L2", before=0),
    Knob("step_flags", (0, 1, 2), "persistent step kernel, CUDA: 1 needs no grid barrier: h goes between blocks "
                                  "as (value, step) words, polled until every tag says the step; with step_tc 0 "
                                  "the small-batch kernel of ``flag_step.py`` (batch <= 32), with step_tc 1 the "
                                  "tensor-core kernel exchanging two 16-bit values a word, with step_tc 2 one float32 "
                                  "value a word; 2 (step_tc 0, sm_90+): "
                                  "the small-batch kernel's blocks of a direction as one thread-block cluster, h "
                                  "stored into each block's shared memory and a cluster barrier a step "
                                  "(``cluster_step.py``)"),
    Knob("step_flag_input", (0, 1), "flag-exchange step kernel: 1 computes each step's x·W_ihᵀ + b_ih itself "
                                    "(its lanes hold W_ih's share as they hold W_hh's; x of the next step loaded "
                                    "while h is polled), so no input GEMM runs before it (one kernel a layer)",
         before=0),
    Knob("step_cluster_quads", (0, 1), "cluster step kernel (step_flags 2): 1 gathers a block's h' in its shared "
                                       "memory and stores it into the cluster's blocks four values an st.async, "
                                       "each receiving barrier counting a quarter of the arrivals", before=0),
    Knob("step_cluster_pull", (0, 1), "cluster step kernel (step_flags 2): 1 keeps a block's h' in its own shared "
                                      "memory as (value, step) words and every block pulls all of h with remote "
                                      "loads, each polled until tagged (no stores into a peer, no mbarrier)",
         before=0),
    Knob("step_flag_units", (4, 8, 16, 32), "flag-exchange and cluster step kernels: hidden units per block (a warp "
                                            "each, its lanes splitting k, W_hh's share in registers)"),
)
INPUT_SPLIT_KNOB = Knob("in_split", (0, 1, 2, 3), "input GEMM: 1 runs float32 x·W_ihᵀ on float16 tensor cores, "
                                                  "each operand split into a high and a low float16 part (one GEMM of "
                                                  "depth 3K, float32-accurate where |x| < 65504; ``split.py``) on an "
                                                  "mma.sync or WMMA tile, 2 on Hopper's warpgroup MMA (``wgmma.py``; "
                                                  "W_ih's parts stored N-major), 3 there on TF32 parts (3xTF32: "
                                                  "float32's range, half the float16 rate)")
INPUT_WGMMA_KNOB = Knob("in_wgmma", (0, 1), "input GEMM with float16 (or bfloat16) x and W_ih: 1 runs it on Hopper's "
                                            "warpgroup MMA "
                                            "(``wgmma.py``), W_ih read N-major as stored (the float32 GEMM's "
                                            "counterpart is in_split 2)")
INPUT_TF32_PROMOTE_KNOB = Knob("in_tf32_promote", (0, 1, 2),
                               "input GEMM on TF32 parts (in_split 3): 0 adds the tensor cores' sums into the "
                               "CUDA cores' every 4 k steps (``gemm_3xtf32``'s promotion), in one set of "
                               "accumulators; 1 or 2 every that many k steps, the windows alternating between two "
                               "sets, so a window's wgmma do not wait on the one before (two dependent chains of "
                               "small wgmma in flight instead of one: a tile's latency, which the first steps wait "
                               "for, nearly halved where it is the chain's)", before=0)
INPUT_TF32_PARTS_KNOB = Knob("in_tf32_parts", (3, 2),
                             "input GEMM on TF32 parts (in_split 3): 3 stores x's and W_ih's parts side by side, one "
                             "GEMM of depth 3K; 2 stores each part once ([x_lo | x_hi], [W_hi | W_lo]) and each k "
                             "tile's three products read them in turn through the TMA (gemm_3xtf32's tf_parts 2: "
                             "two thirds of the split's stores and of the GEMM's bytes)", before=3)
HIDDEN_WGMMA_KNOB = Knob("hid_wgmma", (0, 1), "unfused steps (fuse_step 0) with float16 (or bfloat16) h and W_hh: 1 "
                                             "runs each step's hidden GEMM on Hopper's warpgroup MMA (``wgmma.py``), "
                                             "W_hh read N-major as stored, a bias row a direction; float32 ones there "
                                             "as TF32 parts (three products) with the cell in its store (hid_cell "
                                             "1-6); 0 on the hid_tensor_core tile (mma.sync) or the CUDA cores",
                         before=0)
HIDDEN_CELL_KNOB = Knob("hid_cell", (0, 1, 2, 3, 4, 5, 6), "hidden GEMM on wgmma (hid_wgmma 1): 1 runs the cell in its "
                                                    "store, one kernel a step, each 64-row tile's 96 columns the three "
                                                    "gates of 32 units (``cell_epilogue.py``); 2 the same with K split "
                                                    "in halves, the two blocks of a cluster adding them; 3 that on "
                                                    "128-row tiles; 4 128-row tiles with K whole; 5 192-row tiles "
                                                    "(three consumer warpgroups) with K in halves; 6 256-row ones "
                                                    "(four); 0 a cell kernel after it", before=0)
HIDDEN_CELL_SHARE_KNOB = Knob("hid_cell_share", (0, 1), "the cell tile with K whole (hid_cell 1 or 4): 1 pairs "
                                                       "adjacent tiles of a row in clusters of two blocks that share "
                                                       "h's k tiles by TMA multicast, each block loading half of them "
                                                       "(``wgmma_multicast``)", before=0)
HIDDEN_CELL_BT_KNOB = Knob("hid_cell_bt", (0, 1), "the cell tile of a 16-bit GRU (hid_cell 1-6): 1 reads W_hh "
                                                 "from a copy made as the weights load, transposed (3H, H) with each "
                                                 "tile's rows its units' r, z and n, one 128-byte TMA box a k step "
                                                 "(0: as stored, three 64-byte boxes)", before=0)
HIDDEN_CELL_UNITS_KNOB = Knob("hid_cell_units", (32, 24), "the cell tile (hid_cell 1-6): the units whose three gates "
                                                           "make its columns (96 or 72); 24 where W_hh is read from a "
                                                           "copy in tile order (hid_cell_bt 1, or float32's TF32 "
                                                           "parts), so that more tiles fill the SMs (H1536: 128 "
                                                           "blocks where 32 units make 96)", before=32)
RESIDENT_CELL_KNOB = Knob("step_cell", (0, 1), "persistent step kernel (fuse_step 1, step_loop 2) on Hopper with "
                                               "float16 or bfloat16 h and W_hh: 1 runs the cell-in-the-store tile "
                                               "(64 rows x the three gates of 32 units, wgmma) as one launch a layer, "
                                               "each block's W_hh columns resident in shared memory for all T steps, "
                                               "its rows of h streamed through step_cell_stages cp.async stages, a "
                                               "grid barrier (step_barrier) between steps (``resident_cell.py``)",
                          before=0)
RESIDENT_CELL_STAGES_KNOB = Knob("step_cell_stages", (4, 3), "resident-W cell step kernel (step_cell 1): stages "
                                                             "of h's 64 x 64 k tiles beside W_hh's columns", before=4)
RESIDENT_CELL_INFLIGHT_KNOB = Knob("step_cell_inflight", (1, 0), "resident-W cell step kernel (step_cell 1): wgmma "
                                                                "groups left in flight at each k step (0: one more "
                                                                "stage of h loaded ahead)", before=1)
# The hidden GEMM (batched over directions) searches these of the GEMM template's knobs
# (its transposed A tile is not searched); the input GEMM searches all of them.
BATCHED_GEMM_KNOBS = ("wg_x", "wg_y", "task_x", "task_y", "k_step", "use_shared", "pad", "unroll",
                      "vec", "double_buffer")
IN_GEMM_KNOBS = GEMM_KNOBS
HID_GEMM_KNOBS = tuple(k for k in GEMM_KNOBS if k.name in BATCHED_GEMM_KNOBS)
KNOBS = (STEP_KNOBS + (INPUT_SPLIT_KNOB, INPUT_WGMMA_KNOB, INPUT_TF32_PROMOTE_KNOB)
         + tuple(Knob("in_" + k.name, k.choices, "input GEMM (S1): " + k.doc) for k in IN_GEMM_KNOBS)
         + tuple(Knob("hid_" + k.name, k.choices, "hidden GEMM (S2): " + k.doc) for k in HID_GEMM_KNOBS)
         + (HIDDEN_WGMMA_KNOB, HIDDEN_CELL_KNOB, HIDDEN_CELL_SHARE_KNOB, HIDDEN_CELL_BT_KNOB, HIDDEN_CELL_UNITS_KNOB,
            RESIDENT_CELL_KNOB, RESIDENT_CELL_STAGES_KNOB, RESIDENT_CELL_INFLIGHT_KNOB, INPUT_TF32_PARTS_KNOB))


def gemm_config(config: Config, prefix: str, base: Config) -> Config:
    """The GEMM config held in a GRU config under ``prefix``; GEMM knobs the GRU does not
    search keep ``base``'s values (the GEMM template's default)."""
    values = config.as_dict()
    return base.replace(**{k: values[prefix + k] for k in base.as_dict() if prefix + k in values})
