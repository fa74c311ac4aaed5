"""The ops (metrale/ops*.h, nvfp4.h, mlx.h) under their C names without the mg_ prefix.

Arguments follow the C declarations one for one: the backend (a Backend), the stream (a Stream
or None for the default stream), sizes as ints, device pointers as Buffers (or raw mg_devptr
ints, or 0 / None for "none"), descriptors as the ctypes structs of the same names
(gemm_plan, attention_desc, ...; their pointer fields take Buffers too). A tensor of another
library (NumPy on the CPU backend, PyTorch) is taken without a copy wherever a pointer is:
it is wrapped with from_dlpack for the call. Every failure raises metrale_gpu.Error (a
subclass per status) with mg_last_error()'s text. The headers state each op's contract: the
result, its error bound, alignment and shape rules; `help(op)` gives the short form.
"""
import ctypes as C

from . import _lib
from ._lib import (I32P, InvalidArgument, check, lib, op_stats, raise_status)
from ._lib import (attention_desc, attention_tensors, fp8_quant_desc, gemm_fusion,
                   gemm_fusion_tensors, gemm_plan, gemm_tensors, kv_append_args, kv_cache_desc,
                   mlx_linear, moe_combine_desc, moe_gemm_desc,
                   moe_gemm_tensors, moe_sort_desc, moe_topk_desc, nvfp4_moe_desc,
                   nvfp4_moe_tensors, nvfp4_weight, paged_attention_desc,
                   paged_attention_tensors)
from .core import Buffer, from_dlpack

# ------------------------------------------------------------------ enums
(OP_GEMM_BF16, OP_GEMM_FP8, OP_ATTENTION_RAGGED, OP_FP8_QUANTIZE, OP_SILU_MUL, OP_NVFP4_FORMAT,
 OP_MOE_ROUTING, OP_NVFP4_GEMM, OP_NVFP4_MOE_GEMM, OP_MLX_QUANT, OP_KV_APPEND,
 OP_ATTENTION_PAGED, OP_GATHER_ROWS, OP_RMSNORM, OP_ARGMAX, OP_MOE_GEMM) = range(16)
GEMM_BF16, GEMM_FP8_TENSORWISE, GEMM_FP8_ROWWISE, GEMM_FP8_BLOCKSCALED = range(4)
FP8_BLOCK_1X128, FP8_BLOCK_128X128 = 0, 1
GEMM_PROLOGUE_NONE, GEMM_PROLOGUE_RMSNORM = range(2)
(GEMM_EPILOGUE_NONE, GEMM_EPILOGUE_RESIDUAL_ADD, GEMM_EPILOGUE_SILU_MUL, GEMM_EPILOGUE_ARGMAX,
 GEMM_EPILOGUE_KV_APPEND) = range(5)
FP8_QUANT_TENSOR, FP8_QUANT_ROW, FP8_QUANT_1X128, FP8_QUANT_1X128_GEMM_LAYOUT = range(4)
ATTENTION_IMPL_AUTO, ATTENTION_IMPL_FA2, ATTENTION_IMPL_FA3 = range(3)
KV_BF16, KV_FP8_E4M3 = 0, 1
KV_PAGE_SIZE_DEFAULT = 16
MOE_GEMM_BF16, MOE_GEMM_FP8_ROWWISE, MOE_GEMM_FP8_BLOCKSCALED = range(3)
MOE_MAX_TOPK, MOE_MAX_EXPERTS = 8, 256
NVFP4_KN_TO_NK, NVFP4_NK_TO_KN = 0, 1


def _ptr(b, x, keep):
    if x is None:
        return 0
    if isinstance(x, int):
        return x
    if isinstance(x, Buffer):
        return x.ptr
    if hasattr(x, "__dlpack__"):
        buf = from_dlpack(x, backend=b)
        keep.append(buf)
        return buf.ptr
    raise TypeError("expected a Buffer, a DLPack tensor, an int device address or None, got %s"
                    % type(x).__name__)


def _op(cname, kinds, doc):
    """A wrapper of C function `cname` whose arguments are, in order, of `kinds`: b backend,
    s stream, p device pointer, v value (passed as is)."""
    fn = getattr(lib, cname)
    n = len(kinds)
    name = cname[3:]

    def call(*args):
        if len(args) != n:
            raise TypeError("%s takes %d arguments, got %d" % (name, n, len(args)))
        keep = []
        b = args[0] if kinds[0] == "b" else None
        conv = []
        for k, a in zip(kinds, args):
            if k == "b":
                conv.append(a.handle)
            elif k == "s":
                conv.append(None if a is None else a.handle)
            elif k == "p":
                conv.append(_ptr(b, a, keep))
            else:
                conv.append(a)
        st = fn(*conv)
        if st:
            raise_status(st, cname)

    call.__name__ = call.__qualname__ = name
    call.__doc__ = doc
    return call


# ------------------------------------------------------------------ registry (ops.h)
def op_name(op):
    return lib.mg_op_name(op).decode()


def op_supported(b, op):
    """Whether some provider of `op` can run on `b` (a shape may still be refused)."""
    return bool(lib.mg_op_supported(b.handle, op))


def op_force_provider(b, op, provider):
    """Every later call of `op` on `b` uses `provider`; None or "auto" restores the choice."""
    check(lib.mg_op_force_provider(b.handle, op, None if provider is None else provider.encode()),
          "mg_op_force_provider")


def op_providers(op, kind):
    names = (C.c_char_p * 16)()
    n = lib.mg_op_providers(op, kind, names, 16)
    return [names[i].decode() for i in range(min(n, 16))]


def op_stats_get(b, op):
    """calls, plans, workspace_bytes, caller_workspace_calls, provider (of the latest call),
    forced, as a dict."""
    st = op_stats()
    check(lib.mg_op_stats_get(b.handle, op, C.byref(st)), "mg_op_stats_get")
    return {f: (getattr(st, f).decode() if isinstance(getattr(st, f), bytes) else getattr(st, f))
            for f, _ in op_stats._fields_}


# ------------------------------------------------------------------ GEMM (ops_gemm.h)
_mg_gemm = lib.mg_gemm


def gemm(b, s, plan, tensors):
    """out[M, N] = act[M, K] . weight[N, K]^T (FP32 accumulation) of `plan`'s kind, operands in
    `tensors` (gemm_tensors). The fast path: build plan and tensors once, call many times."""
    st = _mg_gemm(b._h, None if s is None else s._h, plan, tensors)
    if st:
        raise_status(st, "mg_gemm")


gemm_bf16 = _op("mg_gemm_bf16", "bsvvvpppvv",
                "gemm_bf16(b, s, m, n, k, act, weight, out, out_type, ldc): BF16 act [m, k] x "
                "weight [n, k]^T into out (BF16 or F32, row pitch ldc).")
gemm_fp8_tensorwise = _op("mg_gemm_fp8_tensorwise", "bsvvvpppppv",
                          "gemm_fp8_tensorwise(b, s, m, n, k, act, act_scale, weight, "
                          "weight_scale, out, ldc): E4M3 codes, one FP32 scale each, BF16 out.")
gemm_fp8_rowwise = _op("mg_gemm_fp8_rowwise", "bsvvvpppppv",
                       "gemm_fp8_rowwise(b, s, m, n, k, act, act_scale[m], weight, "
                       "weight_scale[n], out, ldc): BF16 out.")
gemm_fp8_blockscaled = _op("mg_gemm_fp8_blockscaled", "bsvvvppvppvpv",
                           "gemm_fp8_blockscaled(b, s, m, n, k, act, act_scale, act_mode, "
                           "weight, weight_scale, weight_mode, out, ldc): 128-wide K blocks.")
fp8_act_scales_transpose = _op("mg_fp8_act_scales_transpose", "bsvvvpp",
                               "fp8_act_scales_transpose(b, s, m, m_pad, k, src, dst): [m, L] "
                               "-> [L, m_pad] with zero padding.")


def fp8_k_blocks(k):
    return lib.mg_fp8_k_blocks(k)


def fp8_rows_padded(m):
    return lib.mg_fp8_rows_padded(m)


def fp8_block_scale_count(mode, rows, k):
    return lib.mg_fp8_block_scale_count(mode, rows, k)


def gemm_scale_count(plan, act):
    return lib.mg_gemm_scale_count(plan, bool(act))


def gemm_workspace_bytes(b, plan):
    n = C.c_size_t()
    check(lib.mg_gemm_workspace_bytes(b.handle, plan, C.byref(n)), "mg_gemm_workspace_bytes")
    return n.value


def gemm_prewarm(b, s, plans):
    arr = (gemm_plan * len(plans))(*plans)
    check(lib.mg_gemm_prewarm(b.handle, None if s is None else s.handle, arr, len(plans)),
          "mg_gemm_prewarm")


def gemm_set_batch_invariant(b, enabled):
    check(lib.mg_gemm_set_batch_invariant(b.handle, bool(enabled)), "mg_gemm_set_batch_invariant")


def _host_quantizer(cname, scale_count):
    fn = getattr(lib, cname)

    def call(bf16):
        """Host FP8 quantizer: BF16 bits (uint16 NumPy [rows, cols]) -> (E4M3 codes uint8
        [rows, cols], FP32 scales) as metrale/ops_gemm.h lays them out."""
        import numpy as np
        a = np.ascontiguousarray(bf16, dtype=np.uint16)
        if a.ndim != 2:
            raise InvalidArgument(1, "%s: a 2-D [rows, cols] array, got shape %s"
                                  % (cname[3:], list(a.shape)))
        rows, cols = a.shape
        codes = np.empty((rows, cols), np.uint8)
        scales = np.empty(max(scale_count(rows, cols), 1), np.float32)
        check(fn(a.ctypes.data, rows, cols, codes.ctypes.data, scales.ctypes.data), cname)
        return codes, scales

    call.__name__ = cname[3:]
    return call


fp8_quantize_tensorwise = _host_quantizer("mg_fp8_quantize_tensorwise", lambda r, c: 1)
fp8_quantize_rowwise = _host_quantizer("mg_fp8_quantize_rowwise", lambda r, c: r)
fp8_quantize_1x128 = _host_quantizer("mg_fp8_quantize_1x128", lambda r, c: r * ((c + 127) // 128))
fp8_quantize_128x128 = _host_quantizer(
    "mg_fp8_quantize_128x128", lambda r, c: lib.mg_fp8_block_scale_count(1, r, c))

# ------------------------------------------------------------------ quantizer, activation, rows
fp8_quantize = _op("mg_fp8_quantize", "bsvppp",
                   "fp8_quantize(b, s, desc, in, out, scales): BF16 [rows, cols] -> E4M3 codes "
                   "and FP32 scales in desc.mode's layout (ops_quantize.h).")


def fp8_quant_scale_count(desc):
    return lib.mg_fp8_quant_scale_count(desc)


def fp8_quant_output_bytes(desc):
    return lib.mg_fp8_quant_output_bytes(desc)


silu_mul_bf16 = _op("mg_silu_mul_bf16", "bsvvpvpv",
                    "silu_mul_bf16(b, s, rows, cols, in, in_pitch, out, out_pitch): out = "
                    "silu(gate) * up with in rows [gate | up] of 2 cols.")
gather_rows_bf16 = _op("mg_gather_rows_bf16", "bsvvpvppp",
                       "gather_rows_bf16(b, s, rows, cols, ids, src_rows, src, add, out): "
                       "out[r] = src[ids[r]] (+ add[ids[r]]); ids outside give zeros.")
rmsnorm_bf16 = _op("mg_rmsnorm_bf16", "bsvvvpppp",
                   "rmsnorm_bf16(b, s, rows, cols, eps, x, add, weight, out): x += add (when "
                   "given), out = x / sqrt(mean(x^2) + eps) * weight, BF16.")
argmax_f32 = _op("mg_argmax_f32", "bsvvpvp",
                 "argmax_f32(b, s, rows, cols, in, pitch, ids): the lowest column of each row's "
                 "maximum; NaN never wins.")
argmax_bf16 = _op("mg_argmax_bf16", "bsvvpvp", "argmax_bf16(b, s, rows, cols, in, pitch, ids).")

# ------------------------------------------------------------------ MoE (ops_moe.h, ops_moe_gemm.h)
moe_topk = _op("mg_moe_topk", "bsvppp",
               "moe_topk(b, s, desc, logits, topk_ids, topk_weights): softmax top-k per token.")
moe_sort = _op("mg_moe_sort", "bsvppvppp",
               "moe_sort(b, s, desc, topk_ids, workspace, workspace_bytes, expert_offsets, "
               "sorted_token_ids, pair_positions): pairs grouped by expert.")
moe_combine = _op("mg_moe_combine", "bsvppppp",
                  "moe_combine(b, s, desc, rows, pair_positions, topk_weights, residual, out): "
                  "the weighted sum of each token's k expert rows (+ residual).")
moe_gemm = _op("mg_moe_gemm", "bsvv",
               "moe_gemm(b, s, desc, tensors): the grouped per-expert GEMM (ops_moe_gemm.h).")


def moe_sort_workspace_bytes(desc):
    return lib.mg_moe_sort_workspace_bytes(desc)


def moe_gemm_workspace_bytes(b, desc):
    n = C.c_size_t()
    check(lib.mg_moe_gemm_workspace_bytes(b.handle, desc, C.byref(n)),
          "mg_moe_gemm_workspace_bytes")
    return n.value


# ------------------------------------------------------------------ NVFP4 (nvfp4.h, ops_nvfp4.h)
nvfp4_quantize = _op("mg_nvfp4_quantize", "bsvvvpppp",
                     "nvfp4_quantize(b, s, n, k, in_pitch, in, global, packed, scales): BF16 "
                     "[n, k] -> packed E2M1 [n, k/2] (low nibble first) and E4M3 scales "
                     "[n, k/16] under the FP32 global scale.")
nvfp4_dequantize = _op("mg_nvfp4_dequantize", "bsvvpppvp",
                       "nvfp4_dequantize(b, s, n, k, packed, scales, global, out_dtype, out).")
nvfp4_prepare = _op("mg_nvfp4_prepare", "bsvvvpppp",
                    "nvfp4_prepare(b, s, n, k, experts, codes, scales, prepared_values, "
                    "prepared_scales): the layout the NVFP4 GEMMs read.")
nvfp4_gemm = _op("mg_nvfp4_gemm", "bsvvvpvvpv",
                 "nvfp4_gemm(b, s, m, n, k, act, act_pitch, weight, out, ldc): BF16 act x "
                 "prepared NVFP4 weight (nvfp4_weight) into BF16 out.")
nvfp4_gemm_gate_up = _op("mg_nvfp4_gemm_gate_up", "bsvvvpvvvpv",
                         "nvfp4_gemm_gate_up(b, s, m, n, k, act, act_pitch, gate, up, out, ldc): "
                         "silu(act . gate^T) * (act . up^T).")
nvfp4_gemm_fused = _op("mg_nvfp4_gemm_fused", "bsvvvpvvvpvvv",
                       "nvfp4_gemm_fused(b, s, m, n, k, act, act_pitch, weight, up_or_None, out, "
                       "ldc, fusion, fusion_tensors): the dense GEMM or gate_up with an RMSNorm "
                       "prologue and/or a residual-add epilogue (gemm_fusion).")


def nvfp4_gemm_fusion_supported(b, m, n, k, gate_up, fusion):
    """Whether nvfp4_gemm_fused would run `fusion` at m x n x k on `b` (raises if not)."""
    check(lib.mg_nvfp4_gemm_fusion_supported(b.handle, m, n, k, bool(gate_up), fusion),
          "mg_nvfp4_gemm_fusion_supported")


nvfp4_moe_gemm = _op("mg_nvfp4_moe_gemm", "bsvv",
                     "nvfp4_moe_gemm(b, s, desc, tensors): the grouped NVFP4 GEMM.")


def nvfp4_packed_bytes(n, k):
    return lib.mg_nvfp4_packed_bytes(n, k)


def nvfp4_scale_bytes(n, k):
    return lib.mg_nvfp4_scale_bytes(n, k)


def nvfp4_prepared_value_bytes(n, k):
    return lib.mg_nvfp4_prepared_value_bytes(n, k)


def nvfp4_prepared_scale_bytes(n, k):
    return lib.mg_nvfp4_prepared_scale_bytes(n, k)


def nvfp4_global_scale_from_amax(amax):
    return lib.mg_nvfp4_global_scale_from_amax(amax)


def nvfp4_e2m1_to_f32(nibble):
    return lib.mg_nvfp4_e2m1_to_f32(nibble)


# ------------------------------------------------------------------ MLX (mlx.h)
mlx_dequant = _op("mg_mlx_dequant", "bsvvp",
                  "mlx_dequant(b, s, linear, expert, out): the BF16 [n, k] weight of an MLX "
                  "affine-quantized layer (mlx_linear).")
mlx_gemv = _op("mg_mlx_gemv", "bsvvvpp",
               "mlx_gemv(b, s, linear, expert, m, x, y): y[m, n] = x[m, k] . W^T, m <= 8.")
mlx_gemm = _op("mg_mlx_gemm", "bsvvvppp",
               "mlx_gemm(b, s, linear, expert, m, x, y, scratch): any m (dequantize, BF16 GEMM).")


def mlx_gemm_scratch_bytes(linear):
    return lib.mg_mlx_gemm_scratch_bytes(linear)


# ------------------------------------------------------------------ attention and the KV cache
def _i32(a, what):
    import numpy as np
    arr = np.ascontiguousarray(a, dtype=np.int32)
    if arr.ndim != 1:
        raise InvalidArgument(1, "%s: a 1-D int32 array, got shape %s" % (what, list(arr.shape)))
    return arr, arr.ctypes.data_as(I32P)


class AttentionPlan:
    """A ragged (attention_plan_create) or paged (paged_attention_plan_create) attention
    plan: run(tensors, stream), update(...), destroy(). Indptrs are host int32 arrays."""

    def __init__(self, backend, handle, paged):
        self.backend, self._h, self.paged = backend, handle, paged

    @property
    def handle(self):
        if not self._h or not self.backend._h:
            raise InvalidArgument(1, "the attention plan (or its backend) is destroyed")
        return self._h

    def update(self, *args, stream=None):
        """Ragged: update(qo_indptr, kv_indptr, batch_size); paged: update(page_table)."""
        if self.paged:
            (table,) = args
            check(lib.mg_paged_attention_plan_update(self.handle, table.struct,
                                                     None if stream is None else stream.handle),
                  "mg_paged_attention_plan_update")
        else:
            qo, kv, batch = args
            qo, qp = _i32(qo, "qo_indptr")
            kv, kp = _i32(kv, "kv_indptr")
            check(lib.mg_attention_plan_update(self.handle, qp, kp, batch,
                                               None if stream is None else stream.handle),
                  "mg_attention_plan_update")

    def run(self, tensors, stream=None):
        s = None if stream is None else stream.handle
        if self.paged:
            st = lib.mg_paged_attention_run(self.handle, tensors, s)
        else:
            st = lib.mg_attention_run(self.handle, tensors, s)
        if st:
            raise_status(st, "mg_paged_attention_run" if self.paged else "mg_attention_run")

    def destroy(self):
        h, self._h = self._h, None
        if h and self.backend._h:
            check(lib.mg_attention_plan_destroy(h), "mg_attention_plan_destroy")

    def __del__(self):
        if getattr(self, "_h", None) and self.backend._h:
            lib.mg_attention_plan_destroy(self._h)


def attention_plan_create(b, desc, qo_indptr, kv_indptr, batch_size, stream=None):
    """The ragged prefill attention plan of a batch (ops_attention.h): q/o [qo_rows, Hq, D],
    k/v [kv_rows, Hkv, D] BF16; request i owns rows indptr[i] .. indptr[i + 1]."""
    qo, qp = _i32(qo_indptr, "qo_indptr")
    kv, kp = _i32(kv_indptr, "kv_indptr")
    h = C.c_void_p()
    check(lib.mg_attention_plan_create(b.handle, desc, qp, kp, batch_size,
                                       None if stream is None else stream.handle, C.byref(h)),
          "mg_attention_plan_create")
    return AttentionPlan(b, h.value, paged=False)


def attention_workspace_bytes(b, desc, qo_indptr, kv_indptr, batch_size):
    qo, qp = _i32(qo_indptr, "qo_indptr")
    kv, kp = _i32(kv_indptr, "kv_indptr")
    n = C.c_size_t()
    check(lib.mg_attention_workspace_bytes(b.handle, desc, qp, kp, batch_size, C.byref(n)),
          "mg_attention_workspace_bytes")
    return n.value


class PageTable:
    """mg_kv_page_table over host int32 arrays (kept alive here): qo_indptr [B + 1] (or None),
    kv_indptr [B + 1], kv_indices [kv_indptr[B]], kv_last_page_len [B]."""

    def __init__(self, batch_size, qo_indptr, kv_indptr, kv_indices, kv_last_page_len):
        self.struct = _lib.kv_page_table()
        self.struct.batch_size = batch_size
        self._arrays = []
        for name, a in (("qo_indptr", qo_indptr), ("kv_indptr", kv_indptr),
                        ("kv_indices", kv_indices), ("kv_last_page_len", kv_last_page_len)):
            if a is not None:
                arr, p = _i32(a, name)
                self._arrays.append(arr)
                setattr(self.struct, name, p)


def kv_page_table_check(desc, table, fn="python"):
    check(lib.mg_kv_page_table_check(desc, table.struct, fn.encode()), "mg_kv_page_table_check")


def paged_attention_workspace_bytes(b, desc, table):
    """The caller's workspace a paged plan of `desc` and `table` carves (0: the provider takes
    none and allocates its own)."""
    n = C.c_size_t()
    check(lib.mg_paged_attention_workspace_bytes(b.handle, desc, table.struct, C.byref(n)),
          "mg_paged_attention_workspace_bytes")
    return n.value


def paged_attention_plan_create(b, desc, table, stream=None):
    """Decode / prefill attention over the paged KV cache (ops_kv_cache.h)."""
    h = C.c_void_p()
    check(lib.mg_paged_attention_plan_create(b.handle, desc, table.struct,
                                             None if stream is None else stream.handle,
                                             C.byref(h)), "mg_paged_attention_plan_create")
    return AttentionPlan(b, h.value, paged=True)


kv_append = _op("mg_kv_append", "bsvv",
                "kv_append(b, s, cache_desc, args): new keys/values (with RoPE on k and q when "
                "args.rope) into the paged cache.")


def kv_cache_bytes(desc):
    n = C.c_size_t()
    check(lib.mg_kv_cache_bytes(desc, C.byref(n)), "mg_kv_cache_bytes")
    return n.value


def kv_cache_pools(desc, pool):
    """(k_pages, v_pages) device addresses inside `pool` (a Buffer of kv_cache_bytes)."""
    k, v = C.c_uint64(), C.c_uint64()
    check(lib.mg_kv_cache_pools(desc, getattr(pool, "ptr", pool), C.byref(k), C.byref(v)),
          "mg_kv_cache_pools")
    return k.value, v.value


class KVPageAllocator:
    """mg_kv_page_allocator: alloc(count) -> int32 page ids (all or nothing), free(pages),
    free_count."""

    def __init__(self, num_pages):
        h = C.c_void_p()
        check(lib.mg_kv_page_allocator_create(num_pages, C.byref(h)),
              "mg_kv_page_allocator_create")
        self._h = h.value

    def alloc(self, count):
        import numpy as np
        pages = np.empty(max(count, 1), np.int32)
        check(lib.mg_kv_page_alloc(self._h, count, pages.ctypes.data_as(I32P)), "mg_kv_page_alloc")
        return pages[:count]

    def free(self, pages):
        arr, p = _i32(pages, "pages")
        check(lib.mg_kv_page_free(self._h, len(arr), p), "mg_kv_page_free")

    @property
    def free_count(self):
        return lib.mg_kv_page_free_count(self._h)

    def __del__(self):
        if getattr(self, "_h", None):
            lib.mg_kv_page_allocator_destroy(self._h)
            self._h = None


kv_page_allocator_create = KVPageAllocator
