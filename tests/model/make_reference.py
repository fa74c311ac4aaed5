"""Teacher-forced logits of SmolLM2-135M-Instruct from an independent implementation.

Usage: make_reference.py GGUF OUT_DIR [CASES]

1. Converts the GGUF file to a Hugging Face directory (OUT_DIR/hf: config.json and an F32
   model.safetensors) with the `gguf` package's own decoders (gguf.quants.dequantize), undoing
   llama.cpp's Q/K row permutation (Hugging Face row h*D/2 + i of a head is GGUF row 2i + h).
2. Loads that directory with mlx-lm's Llama classes (mlx_lm.utils.load_model) in float32.
3. For each prompt: its ids (a byte-level BPE built from the file's vocabulary and merges with
   the `tokenizers` package), a greedy continuation of mlx-lm's own, then one forward pass over
   prompt + continuation; writes OUT_DIR/case<i>.txt with the prompt ids, the continuation ids
   and the logits of every position from the last prompt token on (the ones that predict the
   continuation and one more), float32 little-endian in OUT_DIR/case<i>.f32, and the prompt's
   text with the continuation's (decoded by the same `tokenizers` tokenizer) in
   OUT_DIR/case<i>.text.json.
4. The other two forms of the same network for the runtime's other readers: OUT_DIR/hf_bf16 (the
   Hugging Face directory in BF16, written by mlx) and OUT_DIR/mlx4/model (mlx-lm's own 4-bit
   quantization of it, group 32), with mlx-lm's teacher-forced logits of that quantized model
   over the same sequences in OUT_DIR/mlx4/case<i>.*.
"""
import json
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize

PROMPTS = [
    "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face"
    "<|im_end|>\n<|im_start|>user\nWhat is the capital of France?<|im_end|>\n"
    "<|im_start|>assistant\n",
    "The history of the printing press begins in 1440, when Johannes Gutenberg",
    "def fibonacci(n):\n    \"\"\"Return the n-th Fibonacci number.\"\"\"\n",
    "Water boils at 100 degrees Celsius at sea level. At higher altitudes,",
]
CONTINUATION = 12


def field(reader, key):
    f = reader.fields[key]
    if len(f.types) == 1 and f.types[0].name == "STRING":
        return bytes(f.parts[f.data[0]]).decode()
    return f.parts[f.data[0]][0].item()


def convert(path, out):
    r = GGUFReader(path)
    arch = field(r, "general.architecture")
    assert arch == "llama", arch
    heads = field(r, "llama.attention.head_count")
    kv_heads = field(r, "llama.attention.head_count_kv")
    hidden = field(r, "llama.embedding_length")
    head_dim = hidden // heads
    tensors = {}
    for t in r.tensors:
        w = dequantize(t.data, t.tensor_type).astype(np.float32)
        shape = [int(d) for d in reversed(t.shape.tolist())]
        tensors[t.name] = w.reshape(shape)

    def unpermute(w, n):
        return w.reshape(n, head_dim // 2, 2, -1).swapaxes(1, 2).reshape(n * head_dim, -1)

    hf = {
        "model.embed_tokens.weight": tensors["token_embd.weight"],
        "model.norm.weight": tensors["output_norm.weight"],
    }
    layers = field(r, "llama.block_count")
    names = {"attn_norm": "input_layernorm", "ffn_norm": "post_attention_layernorm",
             "attn_q": "self_attn.q_proj", "attn_k": "self_attn.k_proj",
             "attn_v": "self_attn.v_proj", "attn_output": "self_attn.o_proj",
             "ffn_gate": "mlp.gate_proj", "ffn_up": "mlp.up_proj", "ffn_down": "mlp.down_proj"}
    for l in range(layers):
        for g, h in names.items():
            w = tensors[f"blk.{l}.{g}.weight"]
            if g == "attn_q":
                w = unpermute(w, heads)
            if g == "attn_k":
                w = unpermute(w, kv_heads)
            hf[f"model.layers.{l}.{h}.weight"] = np.ascontiguousarray(w)
    config = {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama",
        "hidden_size": hidden, "intermediate_size": field(r, "llama.feed_forward_length"),
        "num_attention_heads": heads, "num_key_value_heads": kv_heads, "head_dim": head_dim,
        "num_hidden_layers": layers,
        "rms_norm_eps": field(r, "llama.attention.layer_norm_rms_epsilon"),
        "rope_theta": field(r, "llama.rope.freq_base"),
        "vocab_size": int(tensors["token_embd.weight"].shape[0]),
        "max_position_embeddings": field(r, "llama.context_length"),
        "tie_word_embeddings": "output.weight" not in tensors,
        "torch_dtype": "float32",
    }
    out.mkdir(parents=True, exist_ok=True)
    from safetensors.numpy import save_file
    save_file(hf, str(out / "model.safetensors"))
    (out / "config.json").write_text(json.dumps(config, indent=1))
    return r


def tokenizer_of(r):
    from tokenizers import Tokenizer, models, pre_tokenizers, decoders, AddedToken
    f = r.fields["tokenizer.ggml.tokens"]
    tokens = [bytes(f.parts[i]).decode() for i in f.data]
    f = r.fields["tokenizer.ggml.merges"]
    merges = [tuple(bytes(f.parts[i]).decode().split(" ", 1)) for i in f.data]
    types = r.fields["tokenizer.ggml.token_type"]
    kinds = [int(types.parts[i][0]) for i in types.data]
    tok = Tokenizer(models.BPE({t: i for i, t in enumerate(tokens)}, merges))
    tok.pre_tokenizer = pre_tokenizers.Sequence(
        [pre_tokenizers.Digits(individual_digits=True),
         pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.add_special_tokens([AddedToken(t, special=True)
                            for t, k in zip(tokens, kinds) if k == 3])
    return tok


def write_case(out, c, prompt, seq, logits):
    rows = logits[len(prompt) - 1:]
    out.mkdir(parents=True, exist_ok=True)
    (out / f"case{c}.txt").write_text(
        "prompt " + ",".join(map(str, prompt)) + "\n"
        "continuation " + ",".join(map(str, seq[len(prompt):])) + "\n"
        f"rows {rows.shape[0]}\nvocab {rows.shape[1]}\n")
    rows.astype("<f4").tofile(out / f"case{c}.f32")


def other_forms(out, cases):
    """The BF16 and MLX 4-bit directories, and mlx-lm's logits of the 4-bit model."""
    import mlx.core as mx
    from mlx_lm.utils import load_model, quantize_model, save_config, save_model
    hf = out / "hf"
    bf = out / "hf_bf16"
    bf.mkdir(parents=True, exist_ok=True)
    weights = mx.load(str(hf / "model.safetensors"))
    mx.save_safetensors(str(bf / "model.safetensors"),
                        {k: v.astype(mx.bfloat16) for k, v in weights.items()},
                        metadata={"format": "pt"})
    config = json.loads((hf / "config.json").read_text())
    (bf / "config.json").write_text(json.dumps(dict(config, torch_dtype="bfloat16"), indent=1))
    model, cfg = load_model(hf)
    model.set_dtype(mx.float16)  # FP16 scales and biases, as the runtime reads them
    model, cfg = quantize_model(model, cfg, 32, 4)
    cfg["torch_dtype"] = "float16"
    q = out / "mlx4" / "model"
    q.mkdir(parents=True, exist_ok=True)
    save_model(q, model)
    save_config(cfg, q / "config.json")
    model, _ = load_model(q)
    model.set_dtype(mx.float32)  # the reference computes in float32 (the FP16 values are exact)
    for c, (prompt, seq) in enumerate(cases):
        logits = np.array(model(mx.array([seq]))[0].astype(mx.float32))
        write_case(out / "mlx4", c, prompt, seq, logits)
    (out / "mlx4" / "cases").write_text(str(len(cases)))


def main():
    gguf_path, out = sys.argv[1], Path(sys.argv[2])
    cases = int(sys.argv[3]) if len(sys.argv) > 3 else len(PROMPTS)
    r = convert(gguf_path, out / "hf")
    tok = tokenizer_of(r)
    import mlx.core as mx
    from mlx_lm.utils import load_model
    model, _ = load_model(out / "hf")
    model.set_dtype(mx.float32)
    done = []
    for c, text in enumerate(PROMPTS[:cases]):
        prompt = tok.encode(text).ids
        seq = list(prompt)
        for _ in range(CONTINUATION):  # mlx-lm's greedy continuation, recomputed each token
            logits = model(mx.array([seq]))[0, -1]
            seq.append(int(mx.argmax(logits).item()))
        logits = np.array(model(mx.array([seq]))[0].astype(mx.float32))
        write_case(out, c, prompt, seq, logits)
        # the texts, for the tokenizer checks of the Python binding (tests/python/test_model.py)
        (out / f"case{c}.text.json").write_text(json.dumps(
            {"prompt": text, "continuation": tok.decode(seq[len(prompt):])}))
        done.append((prompt, seq))
        print(f"case {c}: {len(prompt)} prompt tokens, continuation "
              f"{tok.decode(seq[len(prompt):])!r}")
    (out / "cases").write_text(str(cases))
    other_forms(out, done)


if __name__ == "__main__":
    main()
