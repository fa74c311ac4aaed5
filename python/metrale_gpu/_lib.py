"""The shared library, its C declarations, and the translation of statuses into exceptions.

The library is found, in order: $METRALE_GPU_LIBRARY (a path to libmetrale_gpu.so), the
package's own folder (an installed wheel), then the build folders of a source tree
(build/, build-cpu/). Nothing is compiled for Python: every call goes through ctypes.
"""
import ctypes as C
import os
import pathlib

_NAME = "libmetrale_gpu.so"


def _candidates():
    env = os.environ.get("METRALE_GPU_LIBRARY")
    if env:
        yield pathlib.Path(env)
        return
    here = pathlib.Path(__file__).resolve().parent
    yield here / _NAME
    root = here.parent.parent
    for build in ("build", "build-cpu"):
        yield root / build / _NAME


def _load():
    tried = []
    for path in _candidates():
        tried.append(str(path))
        if path.exists():
            # RTLD_GLOBAL is not needed: the CUDA backend dlopens its plugins from the folder of
            # the library itself, wherever that is.
            return C.CDLL(str(path)), str(path)
    raise ImportError(
        "metrale_gpu: libmetrale_gpu.so not found (looked at %s); build it (make) or set "
        "METRALE_GPU_LIBRARY to its path" % ", ".join(tried))


lib, library_path = _load()

# ------------------------------------------------------------------ statuses and errors

STATUS_NAMES = {
    0: "MG_OK", 1: "MG_ERR_INVALID_ARGUMENT", 2: "MG_ERR_OUT_OF_MEMORY",
    3: "MG_ERR_UNAVAILABLE", 4: "MG_ERR_UNSUPPORTED", 5: "MG_ERR_NOT_FOUND",
    6: "MG_ERR_NOT_READY", 7: "MG_ERR_CAPTURING", 8: "MG_ERR_BUSY", 9: "MG_ERR_DEVICE",
    10: "MG_ERR_DEVICE_FAULT", 11: "MG_ERR_INTERNAL",
}


class Error(Exception):
    """A failed library call: `status` is the mg_status code, `status_name` its name
    (e.g. "MG_ERR_INVALID_ARGUMENT") and `message` mg_last_error()'s text at the failure."""

    def __init__(self, status, message, call=""):
        self.status = int(status)
        self.status_name = STATUS_NAMES.get(self.status, "MG_ERR_%d" % self.status)
        self.message = message
        self.call = call
        super().__init__("%s: %s%s" % (self.status_name, (call + ": ") if call else "", message))


class InvalidArgument(Error, ValueError):
    pass


class OutOfMemory(Error, MemoryError):
    pass


class Unavailable(Error):
    pass


class Unsupported(Error):
    pass


class Capturing(Error):
    pass


class DeviceError(Error):
    pass


_CLASSES = {1: InvalidArgument, 2: OutOfMemory, 3: Unavailable, 4: Unsupported, 7: Capturing,
            9: DeviceError, 10: DeviceError}


def raise_status(status, call=""):
    text = lib.mg_last_error().decode("utf-8", "replace")
    raise _CLASSES.get(status, Error)(status, text, call)


def check(status, call=""):
    if status:
        raise_status(status, call)


# ------------------------------------------------------------------ declarations

P = C.c_void_p   # an opaque handle
D = C.c_uint64   # mg_devptr
u32, i32, u64, f32, sz, b_ = C.c_uint32, C.c_int32, C.c_uint64, C.c_float, C.c_size_t, C.c_bool
S = C.c_int      # mg_status
E = C.c_int      # any C enum
cp = C.c_char_p


class Struct(C.Structure):
    """A C struct whose device-pointer fields also take a Buffer (its .ptr); the struct keeps
    the Buffers it was given alive, so `t = gemm_tensors(act=b.asbuffer(x), ...)` is safe."""

    def __init__(self, *args, **kw):
        self._buffers = [v for v in list(args) + list(kw.values()) if hasattr(v, "ptr")]
        super().__init__(*[getattr(a, "ptr", a) for a in args],
                         **{k: getattr(v, "ptr", v) for k, v in kw.items()})

    def __setattr__(self, name, value):
        if hasattr(value, "ptr") and name != "_buffers":
            self._buffers.append(value)
            value = value.ptr
        super().__setattr__(name, value)

    def __repr__(self):
        return "%s(%s)" % (type(self).__name__, ", ".join(
            "%s=%r" % (f[0], getattr(self, f[0])) for f in self._fields_))


class dim3(C.Structure):
    _fields_ = [("x", u32), ("y", u32), ("z", u32)]


class backend_probe(C.Structure):
    _fields_ = [("compiled_in", b_), ("usable", b_), ("device_count", C.c_int),
                ("reason", C.c_char * 256)]


class device_info(C.Structure):
    _fields_ = [("name", C.c_char * 128), ("total_bytes", u64), ("multiprocessors", C.c_int),
                ("cc_major", C.c_int), ("cc_minor", C.c_int), ("integrated", b_),
                ("l2_bytes", u64), ("max_shared_per_block_optin", u32),
                ("driver", C.c_char * 64)]


class op_stats(C.Structure):
    _fields_ = [("calls", u64), ("plans", u64), ("workspace_bytes", u64),
                ("caller_workspace_calls", u64), ("provider", C.c_char * 32),
                ("forced", C.c_char * 32)]


class gemm_fusion(Struct):
    """mg_gemm_fusion: prologue (GEMM_PROLOGUE_*), epilogue (GEMM_EPILOGUE_*), eps."""
    _fields_ = [("prologue", E), ("epilogue", E), ("eps", f32)]


class gemm_fusion_tensors(Struct):
    """mg_gemm_fusion_tensors; kv_cache / kv_append: pointers to kv_cache_desc and
    kv_append_args (ctypes.pointer), read during the call only."""
    _fields_ = [("norm_weight", D), ("residual", D), ("argmax_ids", D),
                ("kv_cache", C.c_void_p), ("kv_append", C.c_void_p)]


class gemm_plan(Struct):
    """mg_gemm_plan: kind (GEMM_*), m, n, k, ldc, out_type (DTYPE_*), act_mode and
    weight_mode (FP8_BLOCK_*, block-scaled kind only), pointer_alignment (0: 16), fusion
    (gemm_fusion; zero: none)."""
    _fields_ = [("kind", E), ("m", u32), ("n", u32), ("k", u32), ("ldc", u32),
                ("out_type", E), ("act_mode", E), ("weight_mode", E),
                ("pointer_alignment", u32), ("fusion", gemm_fusion)]


class gemm_tensors(Struct):
    _fields_ = [("act", D), ("weight", D), ("out", D), ("act_scale", D), ("weight_scale", D),
                ("workspace", D), ("workspace_bytes", sz), ("fusion", gemm_fusion_tensors)]


class fp8_quant_desc(Struct):
    _fields_ = [("mode", E), ("rows", u32), ("cols", u32), ("in_pitch", u32),
                ("rows_pad", u32)]


class attention_desc(Struct):
    _fields_ = [("num_qo_heads", u32), ("num_kv_heads", u32), ("head_dim", u32),
                ("causal", b_), ("window_left", i32), ("sm_scale", f32),
                ("graph_qo_rows", u32), ("graph_kv_rows", u32), ("impl", E),
                ("workspace", D), ("workspace_bytes", sz)]


class attention_tensors(Struct):
    _fields_ = [("q", D), ("k", D), ("v", D), ("o", D), ("lse", D), ("qo_rows", u32),
                ("kv_rows", u32)]


class kv_cache_desc(Struct):
    _fields_ = [("num_kv_heads", u32), ("head_dim", u32), ("page_size", u32),
                ("num_pages", u32), ("kv_dtype", E)]


I32P = C.POINTER(C.c_int32)


class kv_page_table(C.Structure):
    _fields_ = [("batch_size", u32), ("qo_indptr", I32P), ("kv_indptr", I32P),
                ("kv_indices", I32P), ("kv_last_page_len", I32P)]


class kv_append_args(Struct):
    _fields_ = [("batch_size", u32), ("num_tokens", u32), ("num_kv_indices", u32),
                ("k", D), ("v", D), ("k_stride", u32), ("v_stride", u32), ("q", D),
                ("q_stride", u32), ("num_qo_heads", u32), ("positions", D), ("rope", b_),
                ("rope_theta", f32), ("rope_inv_freq", D), ("qo_indptr", D), ("kv_indptr", D),
                ("kv_indices", D), ("kv_last_page_len", D), ("k_pages", D), ("v_pages", D),
                ("k_scale", D), ("v_scale", D)]


class paged_attention_desc(Struct):
    _fields_ = [("num_qo_heads", u32), ("num_kv_heads", u32), ("head_dim", u32),
                ("page_size", u32), ("window_left", i32), ("sm_scale", f32),
                ("logits_soft_cap", f32), ("graph_qo_rows", u32), ("graph_kv_tokens", u32),
                ("kv_dtype", E), ("impl", E), ("workspace", D), ("workspace_bytes", sz)]


class paged_attention_tensors(Struct):
    _fields_ = [("q", D), ("o", D), ("lse", D), ("qo_rows", u32), ("k_pages", D),
                ("v_pages", D), ("num_pages", u32), ("kv_indices", D),
                ("num_kv_indices", u32), ("k_scale", D), ("v_scale", D)]


class moe_topk_desc(Struct):
    _fields_ = [("tokens", u32), ("experts", u32), ("k", u32), ("logits_dtype", E),
                ("logits_pitch", u32), ("renormalize", b_)]


class moe_sort_desc(Struct):
    _fields_ = [("tokens", u32), ("experts", u32), ("k", u32)]


class moe_combine_desc(Struct):
    _fields_ = [("tokens", u32), ("k", u32), ("hidden", u32)]


class moe_gemm_desc(Struct):
    _fields_ = [("kind", E), ("experts", u32), ("rows", u32), ("act_rows", u32), ("n", u32),
                ("k", u32), ("act_pitch", u32), ("ldc", u32), ("gate_up", b_)]


class moe_gemm_tensors(Struct):
    _fields_ = [("act", D), ("sorted_token_ids", D), ("expert_offsets", D), ("weight", D),
                ("weight_scale", D), ("out", D), ("workspace", D), ("workspace_bytes", sz)]


class nvfp4_weight(Struct):
    _fields_ = [("values", D), ("scales", D), ("global_scale", D)]


class nvfp4_moe_desc(Struct):
    _fields_ = [("experts", u32), ("rows", u32), ("act_rows", u32), ("n", u32), ("k", u32),
                ("act_pitch", u32), ("ldc", u32)]


class nvfp4_moe_tensors(Struct):
    _fields_ = [("act", D), ("sorted_token_ids", D), ("expert_offsets", D),
                ("w", nvfp4_weight), ("up", C.POINTER(nvfp4_weight)), ("out", D)]


class mlx_linear(Struct):
    _fields_ = [("experts", u32), ("n", u32), ("k", u32), ("bits", u32), ("group_size", u32),
                ("scale_type", E), ("weight", D), ("scales", D), ("biases", D), ("bias", D),
                ("bias_type", E)]


class timing_options(Struct):
    _fields_ = [("level", E), ("pool_pairs", u32), ("kernel_span_every", u32),
                ("trace_capacity", u32), ("epoch_interval_ms", u32)]


class timing_counters(C.Structure):
    _fields_ = [(n, u64) for n in ("recorded", "harvested", "dropped_pool_full",
                                   "skipped_capturing", "abandoned", "open", "pending",
                                   "trace_overwritten")]


class timing_summary(C.Structure):
    _fields_ = [("name", C.c_char * 96), ("kind", E), ("count", u64), ("total_us", C.c_double),
                ("min_us", C.c_double), ("max_us", C.c_double), ("p50_us", C.c_double),
                ("p99_us", C.c_double)]


class sample_params(C.Structure):
    """mg_sample_params (metrale/ops_sample.h): 48 bytes; step and history_len are the
    generator's."""
    _fields_ = [("seed", u64), ("step", u64), ("temperature", f32), ("top_p", f32),
                ("min_p", f32), ("repetition_penalty", f32), ("presence_penalty", f32),
                ("frequency_penalty", f32), ("top_k", u32), ("history_len", u32)]


def R(t):
    return C.POINTER(t)


# name: (restype, argtypes). Statuses are checked by the callers (core.py, ops.py).
_DECLS = {
    "mg_api_version": (C.c_uint32, []),
    "mg_status_name": (cp, [E]),
    "mg_last_error": (cp, []),
    "mg_clear_error": (None, []),
    "mg_dtype_bytes": (sz, [E]),
    "mg_dtype_name": (cp, [E]),
    "mg_backend_kind_name": (cp, [E]),
    "mg_backend_probe_kind": (S, [E, R(backend_probe)]),
    "mg_backend_open": (S, [E, C.c_int, R(P)]),
    "mg_backend_close": (S, [P]),
    "mg_backend_get_kind": (E, [P]),
    "mg_device_get_info": (S, [P, R(device_info)]),
    "mg_memory_free_bytes": (S, [P, R(u64), R(u64)]),
    "mg_backend_supports": (b_, [P, E]),
    "mg_alloc_at": (S, [P, sz, E, R(D), cp, C.c_int]),
    "mg_free": (S, [P, D]),
    "mg_ledger_live": (S, [P, R(u64), R(u64)]),
    "mg_copy_h2d": (S, [P, D, P, sz]),
    "mg_copy_d2h": (S, [P, P, D, sz]),
    "mg_copy_d2d": (S, [P, D, D, sz]),
    "mg_copy_h2d_async": (S, [P, D, P, sz, P]),
    "mg_copy_h2d_async_retained": (S, [P, D, P, sz, P]),
    "mg_copy_d2h_async": (S, [P, P, D, sz, P]),
    "mg_copy_d2d_async": (S, [P, D, D, sz, P]),
    "mg_memset": (S, [P, D, C.c_uint8, sz]),
    "mg_memset_async": (S, [P, D, C.c_uint8, sz, P]),
    "mg_stream_default": (P, [P]),
    "mg_stream_create": (S, [P, R(P)]),
    "mg_stream_destroy": (S, [P]),
    "mg_stream_synchronize": (S, [P]),
    "mg_stream_is_capturing": (S, [P, R(b_)]),
    "mg_event_create": (S, [P, R(P)]),
    "mg_event_record": (S, [P, P]),
    "mg_stream_wait_event": (S, [P, P]),
    "mg_event_synchronize": (S, [P]),
    "mg_event_query": (S, [P]),
    "mg_event_elapsed_ms": (S, [P, P, R(f32)]),
    "mg_event_destroy": (S, [P]),
    "mg_graph_begin_capture": (S, [P]),
    "mg_graph_end_capture": (S, [P, R(P)]),
    "mg_graph_end_capture_update": (S, [P, P, R(b_)]),
    "mg_graph_abort_capture": (S, [P]),
    "mg_graph_launch": (S, [P, P]),
    "mg_graph_destroy": (S, [P]),
    "mg_host_register": (S, [P, P, sz, R(D)]),
    "mg_host_unregister": (S, [P, P]),
    # ops.h
    "mg_op_name": (cp, [E]),
    "mg_op_parse": (S, [cp, R(E)]),
    "mg_op_supported": (b_, [P, E]),
    "mg_op_force_provider": (S, [P, E, cp]),
    "mg_op_stats_get": (S, [P, E, R(op_stats)]),
    "mg_op_providers": (sz, [E, E, R(cp), sz]),
    # ops_gemm.h
    "mg_gemm_bf16": (S, [P, P, u32, u32, u32, D, D, D, E, u32]),
    "mg_gemm_fp8_tensorwise": (S, [P, P, u32, u32, u32, D, D, D, D, D, u32]),
    "mg_gemm_fp8_rowwise": (S, [P, P, u32, u32, u32, D, D, D, D, D, u32]),
    "mg_gemm_fp8_blockscaled": (S, [P, P, u32, u32, u32, D, D, E, D, D, E, D, u32]),
    "mg_fp8_k_blocks": (u32, [u32]),
    "mg_fp8_rows_padded": (u32, [u32]),
    "mg_fp8_block_scale_count": (sz, [E, u32, u32]),
    "mg_fp8_act_scales_transpose": (S, [P, P, u32, u32, u32, D, D]),
    "mg_fp8_quantize_tensorwise": (S, [P, u32, u32, P, P]),
    "mg_fp8_quantize_rowwise": (S, [P, u32, u32, P, P]),
    "mg_fp8_quantize_1x128": (S, [P, u32, u32, P, P]),
    "mg_fp8_quantize_128x128": (S, [P, u32, u32, P, P]),
    "mg_gemm": (S, [P, P, R(gemm_plan), R(gemm_tensors)]),
    "mg_gemm_workspace_bytes": (S, [P, R(gemm_plan), R(sz)]),
    "mg_gemm_scale_count": (sz, [R(gemm_plan), b_]),
    "mg_gemm_prewarm": (S, [P, P, R(gemm_plan), sz]),
    "mg_gemm_set_batch_invariant": (S, [P, b_]),
    # ops_quantize.h, ops_activation.h, ops_elementwise.h
    "mg_fp8_quant_scale_count": (sz, [R(fp8_quant_desc)]),
    "mg_fp8_quant_output_bytes": (sz, [R(fp8_quant_desc)]),
    "mg_fp8_quantize": (S, [P, P, R(fp8_quant_desc), D, D, D]),
    "mg_silu_mul_bf16": (S, [P, P, u32, u32, D, u32, D, u32]),
    "mg_gather_rows_bf16": (S, [P, P, u32, u32, D, u32, D, D, D]),
    "mg_rmsnorm_bf16": (S, [P, P, u32, u32, f32, D, D, D, D]),
    "mg_argmax_f32": (S, [P, P, u32, u32, D, u32, D]),
    "mg_argmax_bf16": (S, [P, P, u32, u32, D, u32, D]),
    # ops_attention.h, ops_kv_cache.h
    "mg_attention_workspace_bytes": (S, [P, R(attention_desc), I32P, I32P, u32, R(sz)]),
    "mg_attention_plan_create": (S, [P, R(attention_desc), I32P, I32P, u32, P, R(P)]),
    "mg_attention_plan_update": (S, [P, I32P, I32P, u32, P]),
    "mg_attention_run": (S, [P, R(attention_tensors), P]),
    "mg_attention_plan_destroy": (S, [P]),
    "mg_kv_cache_bytes": (S, [R(kv_cache_desc), R(sz)]),
    "mg_kv_cache_pools": (S, [R(kv_cache_desc), D, R(D), R(D)]),
    "mg_kv_page_allocator_create": (S, [u32, R(P)]),
    "mg_kv_page_allocator_destroy": (None, [P]),
    "mg_kv_page_alloc": (S, [P, u32, I32P]),
    "mg_kv_page_free": (S, [P, u32, I32P]),
    "mg_kv_page_free_count": (u32, [P]),
    "mg_kv_page_table_check": (S, [R(kv_cache_desc), R(kv_page_table), cp]),
    "mg_kv_append": (S, [P, P, R(kv_cache_desc), R(kv_append_args)]),
    "mg_paged_attention_workspace_bytes": (S, [P, R(paged_attention_desc), R(kv_page_table),
                                               R(sz)]),
    "mg_paged_attention_plan_create": (S, [P, R(paged_attention_desc), R(kv_page_table), P,
                                           R(P)]),
    "mg_paged_attention_plan_update": (S, [P, R(kv_page_table), P]),
    "mg_paged_attention_run": (S, [P, R(paged_attention_tensors), P]),
    # ops_moe.h, ops_moe_gemm.h
    "mg_moe_topk": (S, [P, P, R(moe_topk_desc), D, D, D]),
    "mg_moe_sort_workspace_bytes": (sz, [R(moe_sort_desc)]),
    "mg_moe_sort": (S, [P, P, R(moe_sort_desc), D, D, sz, D, D, D]),
    "mg_moe_combine": (S, [P, P, R(moe_combine_desc), D, D, D, D, D]),
    "mg_moe_gemm_workspace_bytes": (S, [P, R(moe_gemm_desc), R(sz)]),
    "mg_moe_gemm": (S, [P, P, R(moe_gemm_desc), R(moe_gemm_tensors)]),
    # nvfp4.h, ops_nvfp4.h
    "mg_nvfp4_packed_bytes": (sz, [u32, u32]),
    "mg_nvfp4_scale_bytes": (sz, [u32, u32]),
    "mg_nvfp4_global_scale_from_amax": (f32, [f32]),
    "mg_nvfp4_e2m1_to_f32": (f32, [C.c_uint8]),
    "mg_nvfp4_quantize": (S, [P, P, u32, u32, u32, D, D, D, D]),
    "mg_nvfp4_dequantize": (S, [P, P, u32, u32, D, D, D, E, D]),
    "mg_nvfp4_prepared_value_bytes": (sz, [u32, u32]),
    "mg_nvfp4_prepared_scale_bytes": (sz, [u32, u32]),
    "mg_nvfp4_prepare": (S, [P, P, u32, u32, u32, D, D, D, D]),
    "mg_nvfp4_gemm": (S, [P, P, u32, u32, u32, D, u32, R(nvfp4_weight), D, u32]),
    "mg_nvfp4_gemm_gate_up": (S, [P, P, u32, u32, u32, D, u32, R(nvfp4_weight),
                                  R(nvfp4_weight), D, u32]),
    "mg_nvfp4_gemm_fused": (S, [P, P, u32, u32, u32, D, u32, R(nvfp4_weight), R(nvfp4_weight),
                                D, u32, R(gemm_fusion), R(gemm_fusion_tensors)]),
    "mg_nvfp4_gemm_fusion_supported": (S, [P, u32, u32, u32, b_, R(gemm_fusion)]),
    "mg_nvfp4_moe_gemm": (S, [P, P, R(nvfp4_moe_desc), R(nvfp4_moe_tensors)]),
    # mlx.h
    "mg_mlx_linear_bytes": (u64, [R(mlx_linear)]),
    "mg_mlx_dequant": (S, [P, P, R(mlx_linear), u32, D]),
    "mg_mlx_gemv": (S, [P, P, R(mlx_linear), u32, u32, D, D]),
    "mg_mlx_gemm_scratch_bytes": (u64, [R(mlx_linear)]),
    "mg_mlx_gemm": (S, [P, P, R(mlx_linear), u32, u32, D, D, D]),
    # timing.h
    "mg_timing_create": (S, [P, R(timing_options), R(P)]),
    "mg_timing_destroy": (S, [P]),
    "mg_timing_lane": (S, [P, cp, R(u32)]),
    "mg_timing_step_begin": (S, [P, u64]),
    "mg_timing_kernel_spans_armed": (b_, [P]),
    "mg_timing_lane_begin": (S, [P, u32, P, R(u64)]),
    "mg_timing_kernel_begin": (S, [P, cp, P, R(u64)]),
    "mg_timing_span_end": (S, [P, u64, P]),
    "mg_timing_trace_launches": (S, [P, b_]),
    "mg_timing_harvest": (S, [P, R(sz)]),
    "mg_timing_get_counters": (S, [P, R(timing_counters)]),
    "mg_timing_summary_count": (sz, [P]),
    "mg_timing_summary_get": (S, [P, sz, R(timing_summary)]),
    "mg_timing_export_chrome_trace": (S, [P, cp]),
    "mg_sample_params_greedy": (sample_params, []),
    "mg_sample_params_check": (S, [R(sample_params), u32, u32]),
}

# The MG_API_VERSION of the C headers this binding declares (include/metrale/gpu.h); a library
# of another version may have other struct layouts and signatures, so it is refused at import.
API_VERSION = 2

for _name, (_res, _args) in _DECLS.items():
    _fn = getattr(lib, _name)
    _fn.restype = _res
    _fn.argtypes = _args

if lib.mg_api_version() != API_VERSION:
    raise ImportError("metrale_gpu: %s has API version %d, this binding is written for %d" %
                      (library_path, lib.mg_api_version(), API_VERSION))
