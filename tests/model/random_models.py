"""Small random-weight checkpoints of every architecture the model layer reads, in every form its
readers take, with teacher-forced logits from independent implementations.

Usage: random_models.py OUT_DIR [--reference mlx|transformers] [--only NAME]

Each model of MODELS has awkward sizes on purpose: a hidden size that is no power of two, GQA
groups of 3, head_dim 48 or 80 (explicit, not hidden / heads), a vocabulary that is no multiple
of 8, several layers, a rope_theta and rms_norm_eps away from the defaults, tied and untied
embeddings, Llama 3.1's scaled RoPE, Qwen2's biases, Qwen3's head norms and Qwen3-MoE's experts
(5 of them, top 2: an odd count). For each, under OUT_DIR/<name>/:

  hf/        config.json written by transformers' own configuration class (pinned version), and
             model.safetensors with random weights (BF16, one model in F32, so that the F32
             reader runs too); the reference's logits of CASES teacher-forced random sequences
             in the layout of compare.py (case<i>.txt, case<i>.f32, cases).
  gguf/      where the model has a GGUF form: model.gguf written by the `gguf` package's
             writer with llama.cpp's conventions (architecture llama, qwen2 or qwen3; for llama
             the Q and K rows permuted for interleaved RoPE exactly as llama.cpp's converter
             does: HF row h * D/2 + i of a head goes to row 2 i + h), its matrices Q8_0 or F16,
             and ref/ the logits of the network the file holds (the HF weights decoded by the
             gguf package's own dequantize, the rows in HF order).
  mlx<bits>/ where the model has an MLX form: model/ quantized by mlx-lm's own convert path
             (quantize_model, group 32 or 64), and the logits of that quantized model.
  nvfp4_<c>/ where the model has NVFP4 forms (NVFP4_FORMS): model/ an NVFP4 checkpoint in the
             ModelOpt or compressed-tensors convention, every layer linear quantized here by
             the rule of include/metrale/nvfp4.h (written in numpy below, not the runtime's
             code), the LM head too or not; dequant/ the same network with the exactly
             dequantized weights as an F32 Hugging Face directory, and the reference's logits
             of it.

The reference: mlx-lm's model classes (mlx_lm.utils.load_model of the directory, in float32) by
default, which runs on the CPU in CI; --reference transformers runs transformers'
AutoModelForCausalLM in float32 instead (where PyTorch is installed: the GPU machine, or a
CPU with PyTorch's wheels), and --reuse computes it for directories already written, over the
same sequences, into ref_transformers/ and hf_transformers/. Neither is this runtime's code.
"""
import argparse
import json
import math
import shutil
import sys
from pathlib import Path

import numpy as np

CASES = 2
PROMPT, CONTINUATION = 7, 9

# (mlx-lm's Qwen2 takes head_dim as hidden / heads, as the released Qwen2 models have it.)
# name, transformers config class, its arguments, weight dtype, GGUF form (matrix type or None),
# MLX forms ((bits, group), ...).
MODELS = [
    ("llama_untied", "LlamaConfig",
     dict(hidden_size=192, intermediate_size=288, num_attention_heads=6, num_key_value_heads=2,
          head_dim=80, num_hidden_layers=3, vocab_size=1003, rope_theta=50000.0,
          rms_norm_eps=2e-5, tie_word_embeddings=False, max_position_embeddings=512),
     "float32", "Q8_0", ((8, 32),)),
    ("mistral_tied", "MistralConfig",
     dict(hidden_size=192, intermediate_size=384, num_attention_heads=12, num_key_value_heads=4,
          head_dim=48, num_hidden_layers=2, vocab_size=517, rope_theta=1000000.0,
          rms_norm_eps=3e-6, tie_word_embeddings=True, max_position_embeddings=1024),
     "bfloat16", "F16", ((4, 64),)),
    ("qwen2_untied", "Qwen2Config",
     dict(hidden_size=288, intermediate_size=320, num_attention_heads=6, num_key_value_heads=2,
          head_dim=48, num_hidden_layers=3, vocab_size=771, rope_theta=20000.0,
          rms_norm_eps=1e-5, tie_word_embeddings=False, max_position_embeddings=1024),
     "bfloat16", "Q8_0", ((4, 32),)),
    ("qwen3_tied", "Qwen3Config",
     dict(hidden_size=192, intermediate_size=224, num_attention_heads=6, num_key_value_heads=2,
          head_dim=80, num_hidden_layers=3, vocab_size=1201, rope_theta=250000.0,
          rms_norm_eps=1e-6, tie_word_embeddings=True, max_position_embeddings=1024),
     "bfloat16", "Q8_0", ((8, 32),)),
    ("qwen3_moe_untied", "Qwen3MoeConfig",
     dict(hidden_size=192, intermediate_size=256, moe_intermediate_size=96, num_experts=5,
          num_experts_per_tok=2, norm_topk_prob=True, num_attention_heads=6,
          num_key_value_heads=2, head_dim=48, num_hidden_layers=2, vocab_size=611,
          rope_theta=30000.0, rms_norm_eps=1e-5, tie_word_embeddings=False,
          max_position_embeddings=1024),
     "bfloat16", None, ()),
    # (last: each model's random draw is seeded by its index, so the earlier ones keep theirs)
    # Llama 3.1's scaled RoPE with a short original context, so that the scaled and smoothed
    # frequency bands turn these short sequences by clearly different angles
    ("llama31_scaled", "LlamaConfig",
     dict(hidden_size=160, intermediate_size=256, num_attention_heads=5, num_key_value_heads=1,
          head_dim=64, num_hidden_layers=2, vocab_size=509, rope_theta=500000.0,
          rms_norm_eps=1e-5, tie_word_embeddings=True, max_position_embeddings=512,
          rope_scaling=dict(rope_type="llama3", factor=8.0, low_freq_factor=1.0,
                            high_freq_factor=4.0, original_max_position_embeddings=64)),
     "bfloat16", "Q8_0", ((8, 32),)),
]
# NVFP4 forms: model -> (form, convention, the LM head quantized, where the quantization is
# described: config.json's quantization_config or ModelOpt's hf_quant_config.json alone, whether
# activation scales are written (W4A4 configs; the runtime checks them and runs W4A16)).
NVFP4_FORMS = {
    "llama_untied": (("nvfp4_modelopt", "modelopt", False, "config", True),),
    "mistral_tied": (("nvfp4_ct", "compressed-tensors", False, "config", False),),
    "qwen2_untied": (("nvfp4_ct", "compressed-tensors", True, "config", True),),
    "qwen3_tied": (("nvfp4_modelopt", "modelopt", False, "hf_quant_config", True),),
}
ARCHITECTURES = {"LlamaConfig": "LlamaForCausalLM", "MistralConfig": "MistralForCausalLM",
                 "Qwen2Config": "Qwen2ForCausalLM", "Qwen3Config": "Qwen3ForCausalLM",
                 "Qwen3MoeConfig": "Qwen3MoeForCausalLM"}
GGUF_ARCH = {"LlamaConfig": "llama", "MistralConfig": "llama", "Qwen2Config": "qwen2",
             "Qwen3Config": "qwen3"}


def write_config(cls_name, kw, dtype, path):
    """config.json as transformers writes it (rope_parameters nested, transformers 5), plus the
    top-level rope_theta (and rope_scaling) that older configs have and mlx-lm's Llama and Qwen2
    read; Qwen3's
    stays nested only (mlx-lm reads rope_parameters there), so both forms are exercised."""
    import transformers
    cfg = getattr(transformers, cls_name)(**kw)
    cfg.architectures = [ARCHITECTURES[cls_name]]
    d = cfg.to_dict()
    d["torch_dtype"] = dtype
    if cls_name != "Qwen3Config":
        d["rope_theta"] = kw["rope_theta"]
    if "rope_scaling" in kw:  # the older key, which mlx-lm's Llama reads, beside the nested one
        d["rope_scaling"] = kw["rope_scaling"]
    if "num_experts" in kw:  # transformers 5 writes num_local_experts; mlx-lm reads this
        d["num_experts"] = kw["num_experts"]
    (path / "config.json").write_text(json.dumps(d, indent=1, default=str))
    return d


def random_weights(kw, qwen2, qwen3, seed):
    """Hugging Face tensor names and float32 values: unit-scale activations through the layers
    (matrices N(0, 1/K), norms 1 + U(-0.2, 0.2)), so the logits are neither flat nor huge."""
    rng = np.random.default_rng(seed)
    H, I, V = kw["hidden_size"], kw["intermediate_size"], kw["vocab_size"]
    D, Hq, Hk = kw["head_dim"], kw["num_attention_heads"], kw["num_key_value_heads"]

    def mat(n, k, gain=1.0):
        return (rng.standard_normal((n, k)) * gain / np.sqrt(k)).astype(np.float32)

    def norm(n):
        return (1.0 + rng.uniform(-0.2, 0.2, n)).astype(np.float32)

    # the embedding at 0.3: as the tied LM head it gives logits of a few units, as real models'
    w = {"model.embed_tokens.weight": (rng.standard_normal((V, H)) * 0.3).astype(np.float32),
         "model.norm.weight": norm(H)}
    if not kw["tie_word_embeddings"]:
        w["lm_head.weight"] = mat(V, H, 3.0)
    for l in range(kw["num_hidden_layers"]):
        p = f"model.layers.{l}."
        w[p + "input_layernorm.weight"] = norm(H)
        w[p + "post_attention_layernorm.weight"] = norm(H)
        w[p + "self_attn.q_proj.weight"] = mat(Hq * D, H, 1.5)
        w[p + "self_attn.k_proj.weight"] = mat(Hk * D, H, 1.5)
        w[p + "self_attn.v_proj.weight"] = mat(Hk * D, H)
        w[p + "self_attn.o_proj.weight"] = mat(H, Hq * D)
        if "num_experts" in kw:  # Qwen3-MoE: a router and experts as the hub's files hold them
            E, Im = kw["num_experts"], kw["moe_intermediate_size"]
            w[p + "mlp.gate.weight"] = mat(E, H, 3.0)
            for e in range(E):
                w[p + f"mlp.experts.{e}.gate_proj.weight"] = mat(Im, H)
                w[p + f"mlp.experts.{e}.up_proj.weight"] = mat(Im, H)
                w[p + f"mlp.experts.{e}.down_proj.weight"] = mat(H, Im)
        else:
            w[p + "mlp.gate_proj.weight"] = mat(I, H)
            w[p + "mlp.up_proj.weight"] = mat(I, H)
            w[p + "mlp.down_proj.weight"] = mat(H, I)
        if qwen2:
            for n, rows in (("q", Hq * D), ("k", Hk * D), ("v", Hk * D)):
                w[p + f"self_attn.{n}_proj.bias"] = (rng.standard_normal(rows) * 0.5).astype(
                    np.float32)
        if qwen3:
            w[p + "self_attn.q_norm.weight"] = norm(D)
            w[p + "self_attn.k_norm.weight"] = norm(D)
    return w


def save_hf(w, dtype, path):
    import mlx.core as mx
    t = mx.bfloat16 if dtype == "bfloat16" else mx.float32
    mx.save_safetensors(str(path / "model.safetensors"),
                        {k: mx.array(v).astype(t) for k, v in w.items()},
                        metadata={"format": "pt"})


def sequences(vocab, seed):
    rng = np.random.default_rng(seed)
    return [rng.integers(0, vocab, PROMPT + CONTINUATION).tolist() for _ in range(CASES)]


def write_case(out, c, seq, logits):
    rows = logits[PROMPT - 1:]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"case{c}.txt").write_text(
        "prompt " + ",".join(map(str, seq[:PROMPT])) + "\n"
        "continuation " + ",".join(map(str, seq[PROMPT:])) + "\n"
        f"rows {rows.shape[0]}\nvocab {rows.shape[1]}\n")
    rows.astype("<f4").tofile(out / f"case{c}.f32")


def reference(model_dir, seqs, out, kind):
    """Float32 logits of every position of each sequence, from mlx-lm or transformers."""
    if kind == "transformers":
        import torch
        from transformers import AutoModelForCausalLM
        dev = "cuda" if torch.cuda.is_available() else "cpu"
        model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).to(dev)
        model.eval()
        for c, seq in enumerate(seqs):
            with torch.no_grad():
                logits = model(torch.tensor([seq], device=dev)).logits[0].float().cpu().numpy()
            write_case(out, c, seq, logits)
    else:
        import mlx.core as mx
        from mlx_lm.utils import load_model
        model, _ = load_model(Path(model_dir))
        model.set_dtype(mx.float32)
        for c, seq in enumerate(seqs):
            logits = np.array(model(mx.array([seq]))[0].astype(mx.float32))
            write_case(out, c, seq, logits)
    (out / "cases").write_text(str(len(seqs)))


def llama_permute(w, heads):
    """llama.cpp's convert_hf_to_gguf permutation of Q/K rows for its interleaved RoPE."""
    rows, cols = w.shape
    return w.reshape(heads, 2, rows // heads // 2, cols).swapaxes(1, 2).reshape(rows, cols)


def llama3_rope_factors(kw):
    """rope_freqs.weight as llama.cpp's convert_hf_to_gguf writes Llama 3.1's scaling: one
    divisor per frequency (its RoPE turns by base^(-2i/d) / factor_i), from the HF config."""
    r, d = kw["rope_scaling"], kw["head_dim"]
    old, lo, hi = r["original_max_position_embeddings"], r["low_freq_factor"], r["high_freq_factor"]
    factors = []
    for i in range(0, d, 2):
        wavelen = 2 * math.pi * kw["rope_theta"] ** (i / d)
        if wavelen < old / hi:
            factors.append(1.0)
        elif wavelen > old / lo:
            factors.append(r["factor"])
        else:
            smooth = (old / wavelen - lo) / (hi - lo)
            factors.append(1 / ((1 - smooth) / r["factor"] + smooth))
    return np.array(factors, dtype=np.float32)


def write_gguf(cls_name, kw, w, matrix_type, path):
    """model.gguf as llama.cpp lays it out; returns the weights the file holds, in HF names and
    row order, decoded by the gguf package (the network its reference runs)."""
    from gguf import GGMLQuantizationType as T, GGUFWriter
    from gguf.quants import dequantize, quantize
    arch = GGUF_ARCH[cls_name]
    g = GGUFWriter(str(path / "model.gguf"), arch)
    g.add_name(path.parent.name)
    g.add_block_count(kw["num_hidden_layers"])
    g.add_context_length(kw["max_position_embeddings"])
    g.add_embedding_length(kw["hidden_size"])
    g.add_feed_forward_length(kw["intermediate_size"])
    g.add_head_count(kw["num_attention_heads"])
    g.add_head_count_kv(kw["num_key_value_heads"])
    g.add_key_length(kw["head_dim"])
    g.add_value_length(kw["head_dim"])
    g.add_rope_dimension_count(kw["head_dim"])
    g.add_layer_norm_rms_eps(kw["rms_norm_eps"])
    g.add_rope_freq_base(kw["rope_theta"])
    names = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm",
             "self_attn.q_proj": "attn_q", "self_attn.k_proj": "attn_k",
             "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
             "mlp.gate_proj": "ffn_gate", "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
             "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm"}
    held = {}
    scaling = kw.get("rope_scaling") or {}
    if scaling.get("rope_type") == "llama3":
        g.add_tensor("rope_freqs.weight", llama3_rope_factors(kw))
    qt = getattr(T, matrix_type)
    for hf_name, x in w.items():
        base, kind = hf_name.rsplit(".", 1)
        if base == "model.embed_tokens":
            name = "token_embd"
        elif base == "model.norm":
            name = "output_norm"
        elif base == "lm_head":
            name = "output"
        else:
            l, rest = base[len("model.layers."):].split(".", 1)
            name = f"blk.{l}.{names[rest]}"
        stored = x
        if arch == "llama" and base.endswith("q_proj"):
            stored = llama_permute(x, kw["num_attention_heads"])
        if arch == "llama" and base.endswith("k_proj"):
            stored = llama_permute(x, kw["num_key_value_heads"])
        if x.ndim == 2 and qt not in (T.F32, T.F16):
            q = quantize(stored, qt)
            g.add_tensor(f"{name}.{kind}", q, raw_shape=q.shape, raw_dtype=qt)
            decoded = dequantize(q, qt).reshape(stored.shape)
        elif x.ndim == 2 and qt == T.F16:
            g.add_tensor(f"{name}.{kind}", stored.astype(np.float16))
            decoded = stored.astype(np.float16).astype(np.float32)
        else:
            g.add_tensor(f"{name}.{kind}", stored)
            decoded = stored
        if stored is not x:  # back to HF row order for the reference
            heads = kw["num_attention_heads" if base.endswith("q_proj") else
                       "num_key_value_heads"]
            D = kw["head_dim"]
            decoded = decoded.reshape(heads, D // 2, 2, -1).swapaxes(1, 2).reshape(x.shape)
        held[hf_name] = decoded.astype(np.float32)
    g.write_header_to_file()
    g.write_kv_data_to_file()
    g.write_tensors_to_file()
    g.close()
    return held


def write_mlx(hf, bits, group, out):
    """mlx-lm's quantization of the HF directory (what `mlx_lm.convert -q` does), FP16 scales."""
    import mlx.core as mx
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model
    model, cfg = load_model(hf)
    model.set_dtype(mx.float16)
    model, cfg = quantize_model(model, cfg, group, bits)
    cfg["torch_dtype"] = "float16"
    out.mkdir(parents=True, exist_ok=True)
    save_model(out, model)
    save_config(cfg, out / "config.json")


E2M1 = np.array([0, 0.5, 1, 1.5, 2, 3, 4, 6], dtype=np.float32)


def e4m3_values():
    """The value of every E4M3 code 0x00..0x7e (0x7f is NaN): subnormals m * 2^-9, normals
    (8 + m) * 2^(e - 10)."""
    c = np.arange(127)
    e, m = c >> 3, c & 7
    return np.where(e == 0, m * 2.0 ** -9, (8 + m) * 2.0 ** (e - 10.0))


def nvfp4_quantize(x, glob):
    """include/metrale/nvfp4.h's rule for x [N, K] (float32) with the FP32 multiplier `glob`:
    packed codes [N, K/2] (low nibble even k), E4M3 scale codes [N, K/16], and the exact
    dequantization (e2m1 * e4m3) * glob in single precision. (On BF16 inputs its codes and
    scales matched the library's mg_nvfp4_quantize bit for bit on 128,832 values, 2026-12-06;
    the test relies only on the dequantization, which is the format's definition.)"""
    f32 = np.float32
    n, k = x.shape
    blocks = x.reshape(n, k // 16, 16)
    amax = np.abs(blocks).max(axis=2).astype(f32)
    s = (amax / f32(6)) / f32(glob)
    table = e4m3_values()
    hi = np.clip(np.searchsorted(table, s.astype(np.float64)), 1, 126)
    lo = hi - 1
    dlo, dhi = s - table[lo], table[hi] - s
    code = np.where((dhi < dlo) | ((dhi == dlo) & (hi % 2 == 0)), hi, lo)
    code = np.where(s >= 448, 126, np.where(s > 0, code, 0)).astype(np.uint8)
    d = (table[code].astype(f32) * f32(glob)).astype(f32)
    with np.errstate(divide="ignore", invalid="ignore"):
        m = (np.abs(blocks) / d[:, :, None]).astype(f32)
    q = np.select([m <= 0.25, m < 0.75, m <= 1.25, m < 1.75, m <= 2.5, m < 3.5, m <= 5],
                  [0, 1, 2, 3, 4, 5, 6], 7).astype(np.uint8)
    q = np.where(code[:, :, None] == 0, 0, q)
    q = np.where((blocks < 0) & (q != 0), q | 8, q).reshape(n, k)
    packed = (q[:, 0::2] | (q[:, 1::2] << 4)).astype(np.uint8)
    value = np.where(q & 8, -1, 1).astype(f32) * E2M1[q & 7]
    deq = ((value.reshape(n, k // 16, 16) * table[code].astype(f32)[:, :, None]).astype(f32) *
           f32(glob)).astype(f32).reshape(n, k)
    return packed, code, deq


def write_safetensors(tensors, path):
    """A safetensors file of (dtype name, numpy array) entries, written directly: numpy has no
    float8 type for the block scales (stored as their E4M3 bytes)."""
    header, blobs, offset = {"__metadata__": {"format": "pt"}}, [], 0
    for name, (dtype, a) in tensors.items():
        raw = np.ascontiguousarray(a).tobytes()
        header[name] = {"dtype": dtype, "shape": list(a.shape),
                        "data_offsets": [offset, offset + len(raw)]}
        blobs.append(raw)
        offset += len(raw)
    text = json.dumps(header).encode()
    text += b" " * (-len(text) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little"))
        f.write(text)
        for b in blobs:
            f.write(b)


def float_entry(x, dtype):
    if dtype == "float32":
        return ("F32", x.astype("<f4"))
    bits = x.astype("<f4").view("<u4")  # the values are BF16 already: the top halves exactly
    return ("BF16", (bits >> 16).astype("<u2"))


def write_nvfp4(hf, w, dtype, convention, head, where, act_scales, out):
    """The NVFP4 checkpoint of weights `w` (model/) and its exact dequantization as F32
    (dequant/); returns the dequantized directory. Every layer linear is quantized with the
    global amax / 2688 of its own tensor, so the k and v (and gate and up) globals differ."""
    f32 = np.float32
    model, deq_dir = out / "model", out / "dequant"
    model.mkdir(parents=True)
    deq_dir.mkdir()
    cfg = json.loads((hf / "config.json").read_text())
    (deq_dir / "config.json").write_text(json.dumps(cfg, indent=1))
    tensors, deq, globals_ = {}, {}, {}
    for name, x in w.items():
        base = name[:-len(".weight")]
        quantize = (x.ndim == 2 and name.endswith(".weight") and
                    (".layers." in name or (head and base == "lm_head")))
        if not quantize:
            tensors[name] = float_entry(x, dtype)
            deq[name] = x.astype(f32)
            continue
        amax = f32(np.abs(x).max())
        if convention == "modelopt":
            glob = amax / f32(2688)
            stored = glob
        else:  # compressed-tensors stores the reciprocal; the runtime multiplies by 1 / it
            stored = f32(2688) / amax
            glob = f32(1) / stored
        packed, scales, d = nvfp4_quantize(x.astype(f32), glob)
        globals_[base] = glob
        deq[name] = d
        scalar = np.array([stored], dtype="<f4")
        act = np.array([f32(0.02 + 0.001 * len(tensors))], dtype="<f4")  # checked, not used
        if convention == "modelopt":
            tensors[base + ".weight"] = ("U8", packed)
            tensors[base + ".weight_scale"] = ("F8_E4M3", scales)
            tensors[base + ".weight_scale_2"] = ("F32", scalar.reshape(()))
            if act_scales:
                tensors[base + ".input_scale"] = ("F32", act.reshape(()))
        else:
            tensors[base + ".weight_packed"] = ("U8", packed)
            tensors[base + ".weight_scale"] = ("F8_E4M3", scales)
            tensors[base + ".weight_global_scale"] = ("F32", scalar)
            if act_scales:
                tensors[base + ".input_global_scale"] = ("F32", 1 / act)
    for l in range(cfg["num_hidden_layers"]):  # the case the joined kv weight cannot hold
        p = f"model.layers.{l}.self_attn."
        assert globals_[p + "k_proj"] != globals_[p + "v_proj"], "k and v globals must differ"
    write_safetensors(tensors, model / "model.safetensors")
    from safetensors.numpy import save_file
    save_file(deq, str(deq_dir / "model.safetensors"))
    ignore = [] if head else ["lm_head"]
    nvfp4_args = dict(num_bits=4, type="float", group_size=16, strategy="tensor_group",
                      symmetric=True, dynamic=False)
    if convention == "modelopt":
        quant = {"quant_algo": "NVFP4", "group_size": 16, "kv_cache_quant_algo": None,
                 "exclude_modules": ignore}
        if where == "config":
            cfg["quantization_config"] = dict(quant, quant_method="modelopt", ignore=ignore,
                                              producer={"name": "modelopt"})
        else:
            (model / "hf_quant_config.json").write_text(json.dumps(
                {"producer": {"name": "modelopt"}, "quantization": quant}, indent=1))
    else:
        cfg["quantization_config"] = {
            "quant_method": "compressed-tensors", "format": "nvfp4-pack-quantized",
            "quantization_status": "compressed", "ignore": ignore, "kv_cache_scheme": None,
            "config_groups": {"group_0": {
                "targets": ["Linear"], "format": "nvfp4-pack-quantized",
                "weights": nvfp4_args, "output_activations": None,
                "input_activations": dict(nvfp4_args, dynamic="local") if act_scales else None}}}
    (model / "config.json").write_text(json.dumps(cfg, indent=1))
    return deq_dir


def read_sequences(ref):
    seqs = []
    for c in range(int((ref / "cases").read_text())):
        meta = dict(l.split(" ", 1) for l in (ref / f"case{c}.txt").read_text().splitlines())
        seqs.append([int(x) for x in (meta["prompt"] + "," + meta["continuation"]).split(",")])
    return seqs


def reuse(out, kind):
    for name in (out / "models").read_text().split():
        root = out / name
        pairs = [(root / "hf", root / "hf")]
        if (root / "gguf" / "decoded").is_dir():
            pairs.append((root / "gguf" / "decoded", root / "gguf" / "ref"))
        for form, *_ in NVFP4_FORMS.get(name, ()):  # the dequantized F32 directories
            if (root / form / "dequant").is_dir():
                pairs.append((root / form / "dequant", root / form))
        for model_dir, ref in pairs:
            reference(model_dir, read_sequences(ref), ref.parent / f"{ref.name}_{kind}", kind)
            print(f"{name}: {model_dir.relative_to(out)} -> {ref.name}_{kind}")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("out", type=Path)
    ap.add_argument("--reference", default="mlx", choices=["mlx", "transformers"])
    ap.add_argument("--only", default="")
    ap.add_argument("--reuse", action="store_true",
                    help="OUT_DIR holds the models already: only compute the reference's logits "
                         "of its Hugging Face, decoded GGUF and dequantized NVFP4 directories, "
                         "into ref_<reference>/ beside each (the GPU machine's transformers run)")
    a = ap.parse_args()
    if a.reuse:
        return reuse(a.out, a.reference)
    names = []
    for i, (name, cls_name, kw, dtype, gguf_type, mlx_forms) in enumerate(MODELS):
        if a.only and a.only != name:
            continue
        root = a.out / name
        shutil.rmtree(root, ignore_errors=True)
        hf = root / "hf"
        hf.mkdir(parents=True)
        write_config(cls_name, kw, dtype, hf)
        w = random_weights(kw, cls_name == "Qwen2Config", cls_name.startswith("Qwen3"), 100 + i)
        save_hf(w, dtype, hf)
        if dtype == "bfloat16":  # the reference runs on exactly the values the file holds
            import mlx.core as mx
            w = {k: np.array(mx.array(v).astype(mx.bfloat16).astype(mx.float32))
                 for k, v in w.items()}
        seqs = sequences(kw["vocab_size"], 200 + i)
        reference(hf, seqs, hf, a.reference)
        forms = ["hf"]
        if gguf_type:
            gd = root / "gguf"
            gd.mkdir()
            held = write_gguf(cls_name, kw, w, gguf_type, gd)
            decoded = gd / "decoded"
            decoded.mkdir()
            shutil.copy(hf / "config.json", decoded / "config.json")
            from safetensors.numpy import save_file
            save_file(held, str(decoded / "model.safetensors"))
            reference(decoded, seqs, gd / "ref", a.reference)
            forms.append("gguf")
        for bits, group in mlx_forms:
            md = root / f"mlx{bits}"
            write_mlx(hf, bits, group, md / "model")
            if a.reference == "mlx":  # transformers does not read MLX-quantized directories
                reference(md / "model", seqs, md, a.reference)
                forms.append(f"mlx{bits}")
        for form, convention, head, where, act_scales in NVFP4_FORMS.get(name, ()):
            nd = root / form
            deq_dir = write_nvfp4(hf, w, dtype, convention, head, where, act_scales, nd)
            reference(deq_dir, seqs, nd, a.reference)
            forms.append(form)
        (root / "forms").write_text(" ".join(forms))
        names.append(name)
        print(f"{name}: {' '.join(forms)}")
    (a.out / "models").write_text(" ".join(names))


if __name__ == "__main__":
    sys.exit(main())
