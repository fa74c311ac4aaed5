"""metrale_gpu: the metrale-gpu runtime from Python, through ctypes (no compiled extension).

    import numpy as np, metrale_gpu as mg
    b = mg.Backend("cpu")
    x = mg.from_dlpack(np.ones((4, 8), np.float32), backend=b)   # no copy
    y = np.from_dlpack(b.alloc((4, 8), "f32"))                   # no copy either

The model layer (metrale_gpu.model: Model, Tokenizer, ChatTemplate, generate, generate_text)
loads checkpoints and generates text through libmetrale_model.so. Names follow the C API
without the mg_ prefix (mg_gemm_bf16 -> gemm_bf16, mg_kv_append ->
kv_append); handles are objects (Backend, Stream, Event, Graph, Buffer, AttentionPlan,
Timing) whose methods are the C calls on them. Failures raise Error (status, status_name,
message = mg_last_error()).
"""
from ._lib import (Capturing, DeviceError, Error, InvalidArgument, OutOfMemory, Unavailable,
                   Unsupported, library_path)
from ._lib import (attention_desc, attention_tensors, fp8_quant_desc, gemm_fusion,
                   gemm_fusion_tensors, gemm_plan, gemm_tensors,
                   kv_append_args, kv_cache_desc, mlx_linear, moe_combine_desc, moe_gemm_desc,
                   moe_gemm_tensors, moe_sort_desc, moe_topk_desc, nvfp4_moe_desc,
                   nvfp4_moe_tensors, nvfp4_weight, paged_attention_desc,
                   paged_attention_tensors)
from .core import *  # noqa: F401,F403
from .core import (Backend, Buffer, Event, Graph, Stream, backend_probe_kind, dtype_bytes,
                   dtype_of, from_dlpack)
from .ops import *  # noqa: F401,F403
from .timing import *  # noqa: F401,F403
from . import numerics  # noqa: F401
from .model import (ChatTemplate, GenResult, GenResults, Model, Tokenizer, TokenStream,
                    generate, generate_text, model_library_path, presets, prompt_ids,
                    sampling_params, sampling_params_check)

__version__ = "0.1.0"


def last_error():
    """mg_last_error(): the message of the last failing call on this thread."""
    from ._lib import lib
    return lib.mg_last_error().decode("utf-8", "replace")
