"""The compiled step's tape: the layout of its rows, which the lowering writes and the driver reads.

Owns: the op codes, the flags, every op's argument columns by name, and the split columns of
row-local ops. The lowering (lowering.py, tape_plan.py) and the driver (step_drive.drive,
step_ops.run_op) both use these names, so no column number is typed anywhere else. Does not own what an op computes
(step_ops.py) nor which graph node becomes which ops (lowering.py).

One int64 row per instruction, TAPE_WIDTH wide:

    column   OP     FLAGS   2 .. 15                      SHARES        WIDTH           UNIT
             code   FLAG_*  the op's arguments (below)   its phase's   a row-local op's split: columns
                                                         shares        WIDTH floats wide, in UNIT units

and beside it one float64 row, FLOAT_WIDTH wide, for the op's float arguments (rounded to float32
when read). Arguments are arena offsets in floats (activations, small weights, tables), byte
addresses (weights, the byte arena, generated kernels), or plain integers; an op leaves the columns
it does not name at 0.

The driver is numba code compiled with these constants in it: step_ops.SOURCES_HASH and
step_drive.SOURCES_HASH cover this file, so a change here recompiles the driver
(tests/codegen/cpu/test_cpu_step.py checks the hashes).
"""

from __future__ import annotations

OP, FLAGS = 0, 1  # the op code; its flags
# SHARES: the shares of the op's phase where a stealing tape gives it more than one a thread (0: the
# driver's count; step_steal.share_counts); WIDTH, UNIT: a row-local op's row width in floats and its
# column split unit (0: none)
SHARES, WIDTH, UNIT = 16, 17, 18
TAPE_WIDTH = 19
FLOAT_WIDTH = 4

# ---- op codes (column OP) ------------------------------------------------------------------------
OP_RMS_NORM = 1
OP_SCALE = 2
OP_ADD = 3
OP_MUL = 4
OP_SILU = 5
OP_GELU = 6
OP_SOFTCAP = 7
OP_SWIGLU = 8
OP_GEGLU = 9
OP_TAKE_ROWS = 11
OP_ROPE = 12
OP_QUANT = 13
OP_MATMUL = 14
OP_KV_STORE = 15
OP_ATTEND = 16
OP_EMBED = 20
OP_ROPE_TABLE = 21
OP_ADD_BIAS = 22
OP_COLUMNS = 23
OP_LAYER_NORM = 24
OP_ROW_KERNEL = 25
OP_MOE_QUANT = 26
OP_MOE_MATMUL = 27
ELEMENTWISE_CODES = (OP_SCALE, OP_ADD, OP_MUL, OP_SILU, OP_GELU, OP_SOFTCAP, OP_SWIGLU, OP_GEGLU)
OP_NAMES = {code: name[3:].lower() for name, code in dict(globals()).items() if name.startswith("OP_")}
# ops whose share may run twice at once (step_sync.py, "Stealing"): each run writes only final values,
# computed from inputs alone, to its outputs (no partial sums left in them, no output read back), so
# two runs write the same bits; or, the side-effect ops, run once by the share's counted run (COMMIT).
# Not layer_norm (its kernel leaves x - mean in y first) nor the mixture-of-experts ops (scratch)
STEALABLE = frozenset((OP_RMS_NORM, OP_QUANT, OP_MATMUL, OP_ROPE, OP_KV_STORE, OP_ATTEND, OP_EMBED, OP_ROPE_TABLE,
                       OP_TAKE_ROWS, OP_COLUMNS, OP_ADD_BIAS, *ELEMENTWISE_CODES))
COMMIT = frozenset((OP_KV_STORE,))

# ---- flags (column FLAGS) ------------------------------------------------------------------------
FLAG_BARRIER = 1  # wait for every thread after this op
FLAG_OUTPUT_ROWS = 2  # the op works on the R output rows, not the T pass rows
FLAG_COLUMNS = 4  # a pass of fewer rows than threads: row-local ops split columns (WIDTH wide, in UNIT units)
FLAG_STEAL = 8  # the op's phase may be stolen: a share whose holder is off its core is run again (step_sync.py)
FLAG_COMMIT = 16  # in such a phase, an op with a side effect outside the arena (a KV store): run only by the
#                   share's one counted run, after its other ops (step_drive.drive)
FLAG_SPLIT_ROWS = 32  # a matmul of the row-split plan (tape_plan.py): a share is rows, every column, not columns
FLAG_PREFIX = 64  # a stolen phase's leading op that every thread runs in full (every column) before its first
#                   share of the phase (step_steal.prefix_flags): no barrier before the phase's matmuls
# ops small enough to run in full on every thread as such a prefix: each run writes the same bits
PREFIX_OPS = frozenset((OP_RMS_NORM, OP_QUANT))

# ---- each op's argument columns --------------------------------------------------------------------
# rms_norm: y = x * scale of its group (* weight, repeated every WEIGHT_SIZE floats; WEIGHT -1: none)
RMS_X, RMS_Y, RMS_WIDTH, RMS_GROUP, RMS_WEIGHT, RMS_WEIGHT_SIZE = range(2, 8)
RMS_EPS = 0  # float column
# activation quantization of X's rows (WIDTH floats) by the generated KERNEL into the byte arena:
# values Q, block scales D, extras E (E_ROW bytes a row); BLOCK values a block
QUANT_X, QUANT_WIDTH, QUANT_KERNEL, QUANT_Q, QUANT_D, QUANT_E, QUANT_BLOCK, QUANT_E_ROW = range(2, 10)
# the generated matmul KERNEL on WEIGHT (bytes as stored) and quantized activations Q / D / E into Y,
# N output columns; Q_ROW / D_ROW / E_ROW the bytes between two rows of Q / D / E (a share of rows
# starts that many rows in: FLAG_SPLIT_ROWS)
(MATMUL_KERNEL, MATMUL_WEIGHT, MATMUL_Q, MATMUL_D, MATMUL_E, MATMUL_Y, MATMUL_N, MATMUL_Q_ROW, MATMUL_D_ROW,
 MATMUL_E_ROW) = range(2, 12)
# rotary of X into Y by the pass's COS / SIN tables
ROPE_X, ROPE_Y, ROPE_N_HEAD, ROPE_HEAD_DIM, ROPE_N_ROT, ROPE_NEOX, ROPE_COS, ROPE_SIN = range(2, 10)
# keys K and values V (WIDTH floats a row) into LAYER's f16 cache, in place
KV_K, KV_V, KV_WIDTH, KV_LAYER = range(2, 6)
# attention of queries Q into Y over LAYER's cache; SCORE_KERNEL / SOFTMAX_KERNEL generated (0: the
# numba path), HEADS query heads an item; SCALE_BITS / CAP_BITS the floats' f32 bits; TILE_KERNEL the
# generated tile kernel of passes of several rows (attention_tile_ir; 0: none); F32_ACC 1 where the
# value accumulator is f32 (order "key_chain_f16_acc32": the numba path's; the kernels are rendered so)
(ATTEND_Q, ATTEND_Y, ATTEND_LAYER, ATTEND_N_HEAD, ATTEND_N_KV_HEAD, ATTEND_HEAD_DIM, ATTEND_WINDOW,
 ATTEND_SCORE_KERNEL, ATTEND_SOFTMAX_KERNEL, ATTEND_HEADS, ATTEND_SCALE_BITS, ATTEND_CAP_BITS,
 ATTEND_TILE_KERNEL, ATTEND_F32_ACC) = range(2, 16)
ATTEND_SCALE, ATTEND_CAP = 0, 1  # float columns
# embedding rows of TABLE (ROW_BYTES a row, format KIND) by token into Y
EMBED_TABLE, EMBED_ROW_BYTES, EMBED_Y, EMBED_WIDTH, EMBED_KIND = range(2, 7)
EMBED_Q8_0, EMBED_F16, EMBED_F32 = 0, 1, 2  # EMBED_KIND's table formats
# a rotary table: each row's ANGLES (HALF a row), their COS / SIN through the C library's maps
TABLE_ANGLES, TABLE_COS, TABLE_SIN, TABLE_HALF, TABLE_COSF, TABLE_SINF = range(2, 8)
TABLE_STEP, TABLE_FREQ_SCALE = 0, 1  # float columns
# output row r = X's row out_rows[r]
TAKE_X, TAKE_Y, TAKE_WIDTH = range(2, 5)
# every elementwise op: Y = op(X, B) (B 0 for one-input ops), with two float columns
EW_X, EW_B, EW_Y, EW_WIDTH = range(2, 6)
EW_F0, EW_F1 = 0, 1
SCALE_FACTOR = EW_F0  # scale's
SOFTCAP_CAP, SOFTCAP_INVERSE = EW_F0, EW_F1  # softcap's: cap and 1 / cap
# Y = X + BIAS on every row (BIAS: WIDTH floats, a constant of the arena)
BIAS_X, BIAS_B, BIAS_Y, BIAS_WIDTH = range(2, 6)
# Y's rows (WIDTH = COUNT floats) = X's rows (X_WIDTH floats) from column START on
COLS_X, COLS_Y, COLS_X_WIDTH, COLS_START = range(2, 6)
# layer_norm of X's rows (WIDTH floats) into Y by the generated KERNEL (width and eps in it), times
# the constant WEIGHT (-1: none); whole rows only (UNIT = WIDTH)
NORM_KERNEL, NORM_X, NORM_Y, NORM_WEIGHT, NORM_WIDTH = range(2, 7)
# a generated row kernel (moe_ir.py) KERNEL(x, b, y, r0, r1) on whole rows (UNIT = WIDTH): X, B, Y
# f32 offsets (B -1: none)
ROWK_KERNEL, ROWK_X, ROWK_B, ROWK_Y = range(2, 6)
# a mixture-of-experts product's two instructions (moe_step.py): the slots' rows quantized grouped
# by expert, then the generated matmul per expert. PARAMS: the address of the instruction's int64
# parameters (moe_step.P_*); X the input rows, IDS the chosen experts, Y the output, SCRATCH a
# group's products (f32 offsets); Q / D / E the grouped rows (byte addresses)
MOE_PARAMS, MOE_X, MOE_IDS, MOE_Q, MOE_D, MOE_E, MOE_Y, MOE_SCRATCH = range(2, 10)

ARGUMENTS = {  # the columns each op's row fills (the lowering fills exactly these)
    OP_RMS_NORM: range(RMS_X, RMS_WEIGHT_SIZE + 1),
    OP_QUANT: range(QUANT_X, QUANT_E_ROW + 1),
    OP_MATMUL: range(MATMUL_KERNEL, MATMUL_E_ROW + 1),
    OP_ROPE: range(ROPE_X, ROPE_SIN + 1),
    OP_KV_STORE: range(KV_K, KV_LAYER + 1),
    OP_ATTEND: range(ATTEND_Q, ATTEND_F32_ACC + 1),
    OP_EMBED: range(EMBED_TABLE, EMBED_KIND + 1),
    OP_ROPE_TABLE: range(TABLE_ANGLES, TABLE_SINF + 1),
    OP_TAKE_ROWS: range(TAKE_X, TAKE_WIDTH + 1),
    OP_ADD_BIAS: range(BIAS_X, BIAS_WIDTH + 1),
    OP_COLUMNS: range(COLS_X, COLS_START + 1),
    OP_LAYER_NORM: range(NORM_KERNEL, NORM_WIDTH + 1),
    OP_ROW_KERNEL: range(ROWK_KERNEL, ROWK_Y + 1),
    OP_MOE_QUANT: range(MOE_PARAMS, MOE_SCRATCH + 1),
    OP_MOE_MATMUL: range(MOE_PARAMS, MOE_SCRATCH + 1),
    **{code: range(EW_X, EW_WIDTH + 1) for code in ELEMENTWISE_CODES},
}
