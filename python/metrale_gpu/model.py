"""The model layer from Python: checkpoints, tokenizers, chat templates, generation.

A thin layer over libmetrale_model.so (src/model/: model.h, generate.h, tokenizer.h, chat.h),
which the build makes beside libmetrale_gpu.so and which shares its library instance, so a
Backend of this package drives it.

    import metrale_gpu as mg
    b = mg.Backend("auto")
    path = "SmolLM2-135M-Instruct.Q4_1.gguf"
    print(mg.generate_text(b, path, chat="What is the capital of France?", on_text=print))

    tok = mg.Tokenizer.open(path)                       # a GGUF file, tokenizer.json, or a dir
    ids = tok.encode("The history of the printing press", add_special=True)
    out = mg.generate(b, [ids], model_path=path, max_tokens=32, temperature=0.7, top_p=0.9,
                      seed=42, stop_ids=[tok.eos])
    print(tok.decode(out[0].tokens), out[0].finish, out.stats)

    m = mg.Model(b, path, prompts=[ids])                # one pass at a time: teacher forcing
    m.prefill(); first = m.logits()                     # float32 [batch, vocab]
    m.force_tokens([1234]); m.decode(); second = m.logits()

What a caller may rely on: the C contracts of those headers (a bad request, parameter or file
raises before any pass runs, naming it); every failure raises metrale_gpu.Error with the
library's message (mg_last_error, or mg_tok_error for the tokenizer's own calls).
"""
import ctypes as C
import json
import os
import pathlib

from . import _lib
from ._lib import (E, I32P, S, Error, InvalidArgument, P, b_, cp, f32, i32, sample_params, sz,
                   u32, u64)

U32P = C.POINTER(C.c_uint32)

_MODEL_NAME = "libmetrale_model.so"


# ------------------------------------------------------------------ structs (C mirrors)
class model_shape(C.Structure):
    _fields_ = [(n, u32) for n in ("hidden", "heads", "kv_heads", "head_dim", "intermediate",
                                   "experts", "experts_per_token", "vocab")]


class fwd_rope_llama3(C.Structure):
    _fields_ = [("factor", f32), ("low_freq_factor", f32), ("high_freq_factor", f32),
                ("original_max_positions", u32)]


class fwd_preset(C.Structure):
    _fields_ = [("name", cp), ("description", cp), ("shape", model_shape), ("layers", u32),
                ("rope_theta", f32), ("norm_eps", f32), ("max_batch_tokens", u32),
                ("max_batch_size", u32), ("batch", u32), ("prompt_len", u32), ("steps", u32),
                ("context", u32), ("qkv_bias", b_), ("qk_norm", b_),
                ("rope_llama3", fwd_rope_llama3), ("rope_freq_factors", C.c_void_p)]


class fwd_config(C.Structure):
    _fields_ = [("preset", C.POINTER(fwd_preset)), ("batch", u32), ("prompt_len", u32),
                ("steps", u32), ("seed", u64), ("use_graphs", b_), ("weights", E),
                ("checkpoint", cp), ("mlx_dequantized", b_), ("model_path", cp),
                ("prompt_ids", I32P), ("prompt_ids_count", u32), ("prompt_lengths", U32P),
                ("unfused", b_)]


class arena_summary(C.Structure):
    _fields_ = [("buffer_count", sz), ("sum_bytes", u64), ("arena_bytes", u64),
                ("peak_live_bytes", u64), ("device_bytes", u64), ("chunk_count", u32),
                ("largest_chunk_bytes", u64)]


class fwd_info(C.Structure):
    _fields_ = [("weight_bytes", u64), ("decode_weight_bytes", u64), ("kv_pool_bytes", u64),
                ("decode_kv_bytes", u64), ("prompt_tokens", u64), ("arena", arena_summary),
                ("graph_steps", u32), ("graph_kernels", u32), ("graph_nodes", u32),
                ("fused_decode", b_), ("fused_qkv", b_), ("fused_kv_append", b_),
                ("tp_ranks", u32), ("tp_rank", u32), ("graph_outside_kernels", u32),
                ("graph_layer_kernels", u32)]


class gen_request(C.Structure):
    _fields_ = [("prompt", I32P), ("prompt_len", u32), ("max_tokens", u32),
                ("sampling", sample_params), ("stop_ids", I32P), ("stop_count", u32)]


class gen_result(C.Structure):
    _fields_ = [("tokens", I32P), ("count", u32), ("finish", E)]


class gen_stats(C.Structure):
    _fields_ = [("load_s", C.c_double), ("prefill_s", C.c_double), ("decode_s", C.c_double),
                ("prompt_tokens", u32), ("decode_steps", u32), ("graph_steps", u32)]


class gen_options(C.Structure):
    _fields_ = [("model_path", cp), ("preset", C.POINTER(fwd_preset)), ("weights", E),
                ("weight_seed", u64), ("use_graphs", b_), ("penalty_last_n", u32)]


class chat_template_struct(C.Structure):
    _fields_ = [("format", E), ("default_system", C.c_char * 512), ("bos_token", C.c_char * 64),
                ("eos_token", C.c_char * 64)]


class chat_message(C.Structure):
    _fields_ = [("role", cp), ("content", cp)]


TOKEN_FN = C.CFUNCTYPE(b_, C.c_void_p, u32, u32, i32)

# mg_fwd_weights; mg_gen_finish; mg_chat_format
WEIGHTS = {"bf16": 0, "nvfp4": 1, "fp8": 2, "mlx8": 3, "mlx4": 4, "checkpoint": 5}
FINISH = {0: "unfinished", 1: "stop_id", 2: "max_tokens", 3: "callback"}
CHAT_FORMATS = {1: "chatml", 2: "llama3", 3: "mistral", 4: "mistral_system"}

_DECLS = {
    "mg_fwd_presets": (C.POINTER(fwd_preset), [C.POINTER(sz)]),
    "mg_fwd_preset_find": (C.POINTER(fwd_preset), [cp]),
    "mg_fwd_config_default": (fwd_config, [C.POINTER(fwd_preset)]),
    "mg_fwd_create": (S, [P, C.POINTER(fwd_config), C.POINTER(P)]),
    "mg_fwd_create_tp": (S, [C.POINTER(P), C.c_int, C.POINTER(fwd_config), C.POINTER(P)]),
    "mg_fwd_destroy": (None, [P]),
    "mg_fwd_prefill": (S, [P, P]),
    "mg_fwd_decode": (S, [P, P]),
    "mg_fwd_get_preset": (C.POINTER(fwd_preset), [P, C.POINTER(E)]),
    "mg_fwd_tokens": (I32P, [P, u32, C.POINTER(u32)]),
    "mg_fwd_logits": (S, [P, C.POINTER(C.c_float)]),
    "mg_fwd_force_tokens": (S, [P, I32P]),
    "mg_fwd_set_sampling": (S, [P, C.POINTER(sample_params), u32]),
    "mg_fwd_get_info": (None, [P, C.POINTER(fwd_info)]),
    "mg_generate": (S, [P, C.POINTER(gen_options), C.POINTER(gen_request), u32, TOKEN_FN,
                        C.c_void_p, C.POINTER(gen_result), C.POINTER(gen_stats)]),
    "mg_gen_results_free": (None, [C.POINTER(gen_result), u32]),
    "mg_tok_from_json": (S, [cp, C.POINTER(P)]),
    "mg_tok_from_json_text": (S, [cp, sz, C.POINTER(P)]),
    "mg_tok_destroy": (None, [P]),
    "mg_tok_encode": (S, [P, cp, sz, b_, b_, I32P, sz, C.POINTER(sz)]),
    "mg_tok_decode": (S, [P, I32P, sz, b_, C.c_void_p, sz, C.POINTER(sz)]),
    "mg_tok_token_text": (cp, [P, i32]),
    "mg_tok_token_id": (i32, [P, cp]),
    "mg_tok_vocab_size": (u32, [P]),
    "mg_tok_bos": (i32, [P]),
    "mg_tok_eos": (i32, [P]),
    "mg_tok_is_special": (b_, [P, i32]),
    "mg_tok_error": (cp, []),
    "mg_tok_stream_create": (S, [P, b_, C.POINTER(P)]),
    "mg_tok_stream_put": (S, [P, i32, C.c_void_p, sz, C.POINTER(sz)]),
    "mg_tok_stream_finish": (S, [P, C.c_void_p, sz, C.POINTER(sz)]),
    "mg_tok_stream_destroy": (None, [P]),
    "mg_gguf_text_open": (S, [cp, C.POINTER(P), C.POINTER(chat_template_struct),
                              C.POINTER(b_), C.c_char_p, sz]),
    "mg_chat_template_recognise": (S, [cp, sz, C.POINTER(chat_template_struct)]),
    "mg_chat_set_special_tokens": (S, [C.POINTER(chat_template_struct), cp, cp]),
    "mg_chat_writes_bos": (b_, [C.POINTER(chat_template_struct), sz]),
    "mg_chat_render": (S, [C.POINTER(chat_template_struct), C.POINTER(chat_message), sz, b_,
                           C.c_void_p, sz, C.POINTER(sz)]),
}

_model_lib = None


def model_library_path():
    """Where libmetrale_model.so is looked for: $METRALE_MODEL_LIBRARY, else beside the
    libmetrale_gpu.so this package loaded."""
    env = os.environ.get("METRALE_MODEL_LIBRARY")
    if env:
        return pathlib.Path(env)
    return pathlib.Path(_lib.library_path).resolve().parent / _MODEL_NAME


def _m():
    """The model library, loaded at first use (so `import metrale_gpu` needs only
    libmetrale_gpu.so)."""
    global _model_lib
    if _model_lib is None:
        path = model_library_path()
        if not path.exists():
            raise ImportError("metrale_gpu: %s not found; build it (make) or set "
                              "METRALE_MODEL_LIBRARY to its path" % path)
        m = C.CDLL(str(path))
        # the libmetrale_gpu.so the model library resolved (its dependency, found through its
        # handle) must be the API this package checked at import
        m.mg_api_version.restype = C.c_uint32
        if m.mg_api_version() != _lib.API_VERSION:
            raise ImportError("metrale_gpu: %s runs over a libmetrale_gpu of API version %d; "
                              "this package is written for %d" %
                              (path, m.mg_api_version(), _lib.API_VERSION))
        for name, (res, args) in _DECLS.items():
            fn = getattr(m, name)
            fn.restype, fn.argtypes = res, args
        _model_lib = m
    return _model_lib


def _check(status, call):
    if status:
        _lib.raise_status(status, call)


def _check_tok(status, call):
    """Tokenizer calls report through mg_tok_error (tokenizer.h), not mg_last_error."""
    if status:
        text = _m().mg_tok_error().decode("utf-8", "replace")
        raise _lib._CLASSES.get(status, Error)(status, text, call)


def _ids(values):
    """An int32 array of `values` (at least one element, so that it is never NULL) and their
    count."""
    values = [int(v) for v in values]
    return (C.c_int32 * max(len(values), 1))(*values), len(values)


def _grow(call):
    """Calls call(buf, cap, len_ptr) with a buffer large enough (the C size-query rule: *len is
    always the full length; MG_ERR_INVALID_ARGUMENT when it did not fit)."""
    n = sz(0)
    cap = 256
    while True:
        buf = C.create_string_buffer(cap)
        st = call(buf, cap, C.byref(n))
        if st == 1 and n.value + 1 > cap:
            cap = n.value + 1
            continue
        return st, buf.raw[:n.value]


# ------------------------------------------------------------------ presets
def presets():
    """The synthetic presets (model.h): a list of dicts with name, description, layers,
    vocab, hidden, max_batch_size."""
    count = sz(0)
    first = _m().mg_fwd_presets(C.byref(count))
    return [_preset_dict(first[i]) for i in range(count.value)]


def _preset_dict(p):
    s = p.shape
    return {"name": p.name.decode(), "description": (p.description or b"").decode(),
            "layers": p.layers, "hidden": s.hidden, "heads": s.heads, "kv_heads": s.kv_heads,
            "head_dim": s.head_dim, "intermediate": s.intermediate, "experts": s.experts,
            "experts_per_token": s.experts_per_token, "vocab": s.vocab,
            "rope_theta": p.rope_theta, "norm_eps": p.norm_eps,
            "max_batch_tokens": p.max_batch_tokens, "max_batch_size": p.max_batch_size,
            "context": p.context}


def _find_preset(name):
    p = _m().mg_fwd_preset_find(name.encode())
    if not p:
        raise InvalidArgument(1, "no preset named %r (presets(): %s)" % (
            name, ", ".join(q["name"] for q in presets())))
    return p


def _weights(name):
    if name not in WEIGHTS or name == "checkpoint":
        raise InvalidArgument(1, "weights %r: one of bf16, nvfp4, fp8, mlx8, mlx4" % (name,))
    return WEIGHTS[name]


# ------------------------------------------------------------------ sampling parameters
def sampling_params(temperature=0.0, top_k=0, top_p=1.0, min_p=0.0, repetition_penalty=1.0,
                    presence_penalty=0.0, frequency_penalty=0.0, seed=0):
    """An mg_sample_params (metrale/ops_sample.h); the defaults change nothing (greedy)."""
    p = _lib.lib.mg_sample_params_greedy()
    p.temperature, p.top_k, p.top_p, p.min_p = temperature, top_k, top_p, min_p
    p.repetition_penalty, p.presence_penalty = repetition_penalty, presence_penalty
    p.frequency_penalty, p.seed = frequency_penalty, seed
    return p


def sampling_params_check(params, vocab, history_pitch=0):
    """mg_sample_params_check: InvalidArgument naming the first parameter out of range."""
    _check(_lib.lib.mg_sample_params_check(C.byref(params), vocab, history_pitch),
           "mg_sample_params_check")


# ------------------------------------------------------------------ the forward model
class Model:
    """mg_fwd (model.h): one model, its weights, arena and KV cache, driven a pass at a time.

    Model(backend, model_path, prompts=[[ids...], ...]) loads a checkpoint (a GGUF file, a
    Hugging Face or MLX directory); Model(backend, preset="tiny", weights="bf16", prompts=...)
    builds a synthetic preset with deterministic random weights (seed). prompts=None gives
    random prompts of about prompt_len tokens for `batch` requests; `steps` is how many decode
    steps the KV cache is sized for (a step past them is refused). prefill() runs every
    prompt; decode() one token per request (graph replays after the second step with
    use_graphs); logits() the FP32 logits the latest tokens were chosen from.

    A list of backends (one kind, distinct devices) splits the model over them, tensor-parallel
    (mg_fwd_create_tp): the same calls, rank 0's tokens and whole logits; the passes run every
    rank, on backend[0]'s stream for rank 0."""

    def __init__(self, backend, model_path=None, *, prompts=None, preset=None, weights="bf16",
                 seed=1, batch=None, prompt_len=None, steps=64, use_graphs=True,
                 unfused=False):
        m = _m()
        self._h = None
        ranks = list(backend) if isinstance(backend, (list, tuple)) else [backend]
        if not ranks:
            raise InvalidArgument(1, "Model: an empty list of backends")
        self.backend, self._ranks = ranks[0], ranks  # the ranks' backends must outlive it
        base = _find_preset(preset or "tiny")
        c = m.mg_fwd_config_default(base)  # a checkpoint's config replaces base's architecture
        if model_path is not None:
            self._path = str(model_path).encode()
            c.model_path = self._path
        elif preset is None:
            raise InvalidArgument(1, "Model: give model_path or preset")
        else:
            c.weights = _weights(weights)
        c.seed, c.use_graphs, c.unfused, c.steps = seed, use_graphs, unfused, steps
        if prompts is not None:
            prompts = [list(p) for p in prompts]
            if not prompts:
                raise InvalidArgument(1, "Model: prompts is empty")
            flat = [t for p in prompts for t in p]
            self._ids, n = _ids(flat)
            self._lengths = (C.c_uint32 * len(prompts))(*[len(p) for p in prompts])
            c.prompt_ids, c.prompt_ids_count = self._ids, n
            c.prompt_lengths, c.batch = self._lengths, len(prompts)
        if batch is not None:
            c.batch = batch
        if prompt_len is not None:
            c.prompt_len = prompt_len
        self.batch = c.batch
        h = P()
        if len(ranks) == 1:
            _check(m.mg_fwd_create(self.backend.handle, C.byref(c), C.byref(h)), "mg_fwd_create")
        else:
            handles = (P * len(ranks))(*[r.handle for r in ranks])
            _check(m.mg_fwd_create_tp(handles, len(ranks), C.byref(c), C.byref(h)),
                   "mg_fwd_create_tp")
        self._h = h.value
        self._stream = self.backend.stream_create()
        w = E()
        self.preset = _preset_dict(m.mg_fwd_get_preset(self._h, C.byref(w))[0])
        self.weights = {v: k for k, v in WEIGHTS.items()}[w.value]
        self.vocab = self.preset["vocab"]

    @property
    def handle(self):
        if not self._h:
            raise InvalidArgument(1, "the Model was closed")
        return self._h

    def close(self):
        """Frees the model. Closing its backend first frees the model's device memory with
        everything else; the model's host state is then left (a leak, not a crash)."""
        if self._h:
            if all(r._h for r in self._ranks):
                self._stream.destroy()
                _m().mg_fwd_destroy(self._h)
            self._h = None

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass

    def prefill(self):
        _check(_m().mg_fwd_prefill(self.handle, self._stream.handle), "mg_fwd_prefill")

    def decode(self):
        _check(_m().mg_fwd_decode(self.handle, self._stream.handle), "mg_fwd_decode")

    def tokens(self, request=0):
        """The ids generated so far for `request` (the prefill's first, then one per step)."""
        if not 0 <= request < self.batch:
            raise InvalidArgument(1, "request %d of a batch of %d" % (request, self.batch))
        n = u32(0)
        p = _m().mg_fwd_tokens(self.handle, request, C.byref(n))
        return [p[i] for i in range(n.value)]

    def logits(self):
        """FP32 [batch, vocab] (a NumPy array): each request's logits after the latest pass."""
        import numpy as np
        out = np.empty((self.batch, self.vocab), np.float32)
        _check(_m().mg_fwd_logits(self.handle, out.ctypes.data_as(C.POINTER(C.c_float))),
               "mg_fwd_logits")
        return out

    def force_tokens(self, ids):
        """Replaces every request's latest token with ids[batch] (teacher forcing)."""
        ids = list(ids)
        if len(ids) != self.batch:
            raise InvalidArgument(1, "force_tokens: %d ids for a batch of %d" % (
                len(ids), self.batch))
        arr, _ = _ids(ids)
        _check(_m().mg_fwd_force_tokens(self.handle, arr), "mg_fwd_force_tokens")

    def set_sampling(self, params=None, penalty_last_n=0):
        """Sampled decoding for the later passes: params is one sampling_params() per request
        (or one for all), None for greedy argmax again."""
        if params is None:
            _check(_m().mg_fwd_set_sampling(self.handle, None, 0), "mg_fwd_set_sampling")
            return
        if isinstance(params, sample_params):
            params = [params] * self.batch
        if len(params) != self.batch:
            raise InvalidArgument(1, "set_sampling: %d parameter sets for a batch of %d" % (
                len(params), self.batch))
        arr = (sample_params * self.batch)(*params)
        _check(_m().mg_fwd_set_sampling(self.handle, arr, penalty_last_n),
               "mg_fwd_set_sampling")

    def info(self):
        """mg_fwd_info as a dict (bytes of the weights and KV cache, the arena, the captured
        decode graph's kernel count, which fusions the decode step runs)."""
        i = fwd_info()
        _m().mg_fwd_get_info(self.handle, C.byref(i))
        d = {f: getattr(i, f) for f, _ in fwd_info._fields_ if f != "arena"}
        d["arena"] = {f: getattr(i.arena, f) for f, _ in arena_summary._fields_}
        return d


# ------------------------------------------------------------------ generation
class GenResult:
    """One request's generated ids and why it stopped ("stop_id", "max_tokens",
    "callback")."""
    __slots__ = ("tokens", "finish")

    def __init__(self, tokens, finish):
        self.tokens, self.finish = tokens, finish

    def __repr__(self):
        return "GenResult(tokens=%r, finish=%r)" % (self.tokens, self.finish)


class GenResults(list):
    """The GenResults of generate(), in request order, with `stats` (wall seconds of loading,
    the prefill and the decode steps; prompt tokens, decode steps, graph replays)."""
    stats = None


def generate(backend, prompts, *, model_path=None, preset=None, weights="bf16", weight_seed=1,
             max_tokens=128, stop_ids=(), temperature=0.0, top_k=0, top_p=1.0, min_p=0.0,
             repetition_penalty=1.0, presence_penalty=0.0, frequency_penalty=0.0, seed=0,
             penalty_last_n=0, use_graphs=True, on_token=None):
    """mg_generate (generate.h): every prompt (a list of ids) as one request of one batch,
    decoded in lockstep until each meets a stop id, max_tokens or its callback's stop.

    The sampling parameters apply to every request; `seed` may be a list (one per request).
    on_token(request, index, token) is called for every new token in order; returning False
    finishes that request after it. An exception raised in on_token finishes every request
    and is raised again here. The model (model_path, or preset with `weights`) is created
    for the call and freed before it returns."""
    m = _m()
    prompts = [list(p) for p in prompts]
    count = len(prompts)
    if count == 0:
        raise InvalidArgument(1, "generate: no prompts")
    seeds = list(seed) if isinstance(seed, (list, tuple)) else [seed] * count
    if len(seeds) != count:
        raise InvalidArgument(1, "generate: %d seeds for %d prompts" % (len(seeds), count))
    keep = []
    stops, n_stops = _ids(stop_ids)
    requests = (gen_request * count)()
    for r, p in enumerate(prompts):
        arr, n = _ids(p)
        keep.append(arr)
        requests[r].prompt, requests[r].prompt_len = arr if n else None, n
        requests[r].max_tokens = max_tokens
        requests[r].sampling = sampling_params(temperature, top_k, top_p, min_p,
                                               repetition_penalty, presence_penalty,
                                               frequency_penalty, seeds[r])
        requests[r].stop_ids, requests[r].stop_count = (stops if n_stops else None), n_stops
    o = gen_options(use_graphs=use_graphs, penalty_last_n=penalty_last_n,
                    weight_seed=weight_seed)
    if model_path is not None:
        path = str(model_path).encode()
        o.model_path = path
    elif preset is not None:
        o.preset, o.weights = _find_preset(preset), _weights(weights)
    else:
        raise InvalidArgument(1, "generate: give model_path or preset")

    raised = []

    def trampoline(_user, request, index, token):
        if raised:
            return False
        try:
            return on_token(request, index, token) is not False
        except BaseException as e:  # noqa: B902 - re-raised after mg_generate returns
            raised.append(e)
            return False

    fn = TOKEN_FN(trampoline) if on_token else TOKEN_FN()
    results = (gen_result * count)()
    stats = gen_stats()
    try:
        st = m.mg_generate(backend.handle, C.byref(o), requests, count, fn, None, results,
                           C.byref(stats))
        if raised:
            raise raised[0]
        _check(st, "mg_generate")
        out = GenResults(GenResult([results[r].tokens[i] for i in range(results[r].count)],
                                   FINISH.get(results[r].finish, results[r].finish))
                         for r in range(count))
    finally:
        m.mg_gen_results_free(results, count)
    out.stats = {f: getattr(stats, f) for f, _ in gen_stats._fields_}
    return out


# ------------------------------------------------------------------ text
class ChatTemplate:
    """A recognised chat template (chat.h: ChatML, SmolLM2's ChatML with a default system
    message, Llama-3, Mistral-instruct), rendered in C exactly as the template renders."""

    def __init__(self, struct):
        self._t = struct

    @classmethod
    def recognise(cls, text, bos_token=None, eos_token=None):
        """From a template string (tokenizer.chat_template); Unsupported for any other
        template."""
        t = chat_template_struct()
        raw = text.encode()
        _check(_m().mg_chat_template_recognise(raw, len(raw), C.byref(t)),
               "mg_chat_template_recognise")
        _check(_m().mg_chat_set_special_tokens(
            C.byref(t), bos_token.encode() if bos_token else None,
            eos_token.encode() if eos_token else None), "mg_chat_set_special_tokens")
        return cls(t)

    @property
    def format(self):
        return CHAT_FORMATS.get(self._t.format, self._t.format)

    def writes_bos(self, count):
        """Whether a rendering of `count` messages starts with the BOS token's text (then
        encode it with add_special=False)."""
        return bool(_m().mg_chat_writes_bos(C.byref(self._t), count))

    def render(self, messages, add_generation_prompt=True):
        """messages: (role, content) pairs or {"role": ..., "content": ...} dicts."""
        pairs = [(m["role"], m["content"]) if isinstance(m, dict) else tuple(m)
                 for m in messages]
        raw = [(r.encode(), c.encode()) for r, c in pairs]
        arr = (chat_message * max(len(raw), 1))(*[chat_message(r, c) for r, c in raw])
        st, text = _grow(lambda buf, cap, n: _m().mg_chat_render(
            C.byref(self._t), arr, len(raw), add_generation_prompt, buf, cap, n))
        _check(st, "mg_chat_render")
        return text.decode("utf-8")


class _Owned:
    """A handle of the model library that this object frees: `_destroy` names the C function;
    close() (or garbage collection) calls it once."""
    _destroy = None
    _what = "object"

    @property
    def handle(self):
        if not self._h:
            raise InvalidArgument(1, "the %s was closed" % self._what)
        return self._h

    def close(self):
        if self._h:
            getattr(_m(), self._destroy)(self._h)
            self._h = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass


class Tokenizer(_Owned):
    """tokenizer.h's mg_tok: byte-level or SentencePiece-style BPE from a GGUF file's metadata
    or a Hugging Face tokenizer.json, with the checkpoint's chat template where it has one.

    Tokenizer.open(path): a GGUF file, a tokenizer.json, or a directory holding tokenizer.json
    (and tokenizer_config.json's chat_template). chat_template is None when the checkpoint
    has none or one chat.h does not recognise; chat_problem then says which."""
    _destroy, _what = "mg_tok_destroy", "Tokenizer"

    def __init__(self, handle, chat_template=None, chat_problem=""):
        self._h = handle
        self.chat_template = chat_template
        self.chat_problem = chat_problem

    @classmethod
    def open(cls, path):
        m = _m()
        path = pathlib.Path(path)
        h = P()
        if path.is_dir() or path.suffix == ".json":
            json_path = path / "tokenizer.json" if path.is_dir() else path
            _check_tok(m.mg_tok_from_json(str(json_path).encode(), C.byref(h)),
                       "mg_tok_from_json")
            tok = cls(h.value)
            tok._chat_from_config(json_path.parent / "tokenizer_config.json")
            return tok
        t = chat_template_struct()
        has = b_(False)
        problem = C.create_string_buffer(256)
        _check(m.mg_gguf_text_open(str(path).encode(), C.byref(h), C.byref(t), C.byref(has),
                                   problem, 256), "mg_gguf_text_open")
        return cls(h.value, ChatTemplate(t) if has.value else None,
                   problem.value.decode("utf-8", "replace"))

    def _chat_from_config(self, config_path):
        if not config_path.exists():
            self.chat_problem = "no tokenizer_config.json beside tokenizer.json"
            return
        cfg = json.loads(config_path.read_text())
        text = cfg.get("chat_template")
        if not isinstance(text, str):
            self.chat_problem = "tokenizer_config.json has no chat_template string"
            return

        def token_text(v):
            return v.get("content") if isinstance(v, dict) else v

        try:
            self.chat_template = ChatTemplate.recognise(text, token_text(cfg.get("bos_token")),
                                                        token_text(cfg.get("eos_token")))
        except Error as e:
            self.chat_problem = e.message

    @property
    def vocab_size(self):
        return _m().mg_tok_vocab_size(self.handle)

    @property
    def bos(self):
        """The BOS id, or None."""
        v = _m().mg_tok_bos(self.handle)
        return None if v < 0 else v

    @property
    def eos(self):
        """The end-of-sequence id, or None."""
        v = _m().mg_tok_eos(self.handle)
        return None if v < 0 else v

    def is_special(self, token):
        return bool(_m().mg_tok_is_special(self.handle, token))

    def token_text(self, token):
        """The token's string as the vocabulary writes it (e.g. "Ġthe"), None out of range."""
        t = _m().mg_tok_token_text(self.handle, token)
        return None if t is None else t.decode("utf-8", "replace")

    def token_id(self, text):
        """The id of a token given its exact string, None when there is none."""
        v = _m().mg_tok_token_id(self.handle, text.encode())
        return None if v < 0 else v

    def encode(self, text, add_special=True, parse_special=True):
        """Text to ids (tokenizer.h's mg_tok_encode); invalid UTF-8 is refused."""
        raw = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        n = sz(0)
        cap = max(16, len(raw) + 8)
        while True:
            ids = (C.c_int32 * cap)()
            st = _m().mg_tok_encode(self.handle, raw, len(raw), add_special, parse_special,
                                    ids, cap, C.byref(n))
            if st == 1 and n.value > cap:
                cap = n.value
                continue
            _check_tok(st, "mg_tok_encode")
            return list(ids[:n.value])

    def decode(self, ids, skip_special=False):
        arr, count = _ids(ids)
        st, text = _grow(lambda buf, cap, n: _m().mg_tok_decode(
            self.handle, arr, count, skip_special, buf, cap, n))
        _check_tok(st, "mg_tok_decode")
        return text.decode("utf-8", "replace")

    def stream(self, skip_special=True):
        """A streaming decoder: put(id) returns the text it completes (only whole UTF-8
        characters), finish() what is still held back."""
        return TokenStream(self, skip_special)


class TokenStream(_Owned):
    """Tokenizer.stream()'s decoder (mg_tok_stream)."""
    _destroy, _what = "mg_tok_stream_destroy", "TokenStream"

    def __init__(self, tokenizer, skip_special):
        self.tokenizer = tokenizer
        h = P()
        _check_tok(_m().mg_tok_stream_create(tokenizer.handle, skip_special, C.byref(h)),
                   "mg_tok_stream_create")
        self._h = h.value

    def put(self, token):
        st, text = _grow(lambda buf, cap, n: _m().mg_tok_stream_put(self.handle, token, buf,
                                                                     cap, n))
        _check_tok(st, "mg_tok_stream_put")
        return text.decode("utf-8")

    def finish(self):
        st, text = _grow(lambda buf, cap, n: _m().mg_tok_stream_finish(self.handle, buf, cap, n))
        _check_tok(st, "mg_tok_stream_finish")
        return text.decode("utf-8")


def prompt_ids(tokenizer, prompt=None, chat=None, messages=None):
    """The ids `metrale-gpu run` feeds for --prompt TEXT (encoded as it is, with the
    tokenizer's own special tokens added) or --chat TEXT / messages (rendered by the
    checkpoint's chat template with a generation prompt, then encoded without adding a BOS the
    rendering already writes)."""
    if (prompt is not None) + (chat is not None) + (messages is not None) != 1:
        raise InvalidArgument(1, "prompt_ids: give one of prompt, chat and messages")
    if prompt is not None:
        return tokenizer.encode(prompt, add_special=True)
    if chat is not None:
        messages = [("user", chat)]
    if tokenizer.chat_template is None:
        raise InvalidArgument(1, "the checkpoint has no chat template this runtime renders (%s);"
                              " give the text as it is with prompt=" % tokenizer.chat_problem)
    text = tokenizer.chat_template.render(messages, add_generation_prompt=True)
    writes_bos = tokenizer.chat_template.writes_bos(len(messages))
    return tokenizer.encode(text, add_special=not writes_bos)


def generate_text(backend, model_path, prompt=None, *, chat=None, messages=None,
                  max_tokens=256, on_text=None, **sampling):
    """Text in, text out: the checkpoint's tokenizer and chat template (prompt_ids), generate()
    with its end-of-sequence id as the stop id and `sampling` (temperature, top_p, seed, ...),
    streamed through on_text(piece) as whole UTF-8 characters; returns the text (special tokens
    left out)."""
    tok = Tokenizer.open(model_path)
    try:
        ids = prompt_ids(tok, prompt, chat, messages)
        stream = tok.stream(skip_special=True)
        pieces = []

        def emit(_request, _index, token):
            piece = stream.put(token)
            if piece:
                pieces.append(piece)
                if on_text:
                    on_text(piece)

        stop = [tok.eos] if tok.eos is not None else []
        generate(backend, [ids], model_path=model_path, max_tokens=max_tokens, stop_ids=stop,
                 on_token=emit, **sampling)
        tail = stream.finish()
        stream.close()
        if tail:
            pieces.append(tail)
            if on_text:
                on_text(tail)
        return "".join(pieces)
    finally:
        tok.close()
