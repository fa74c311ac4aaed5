"""Writes the seed corpus of fuzz_gguf (tests/fuzz/corpus_gguf/) with the `gguf` package's own
writer: a tiny llama checkpoint with every tensor type the loader takes, a byte-level BPE
tokenizer and SmolLM2's chat template. Run with the .venv-model interpreter (tests/model/setup.sh);
the files are committed, so this only runs when the seeds are to change."""
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, GGMLQuantizationType
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import quantize

out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "corpus_gguf")
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(1)
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\nYou are a tiny model<|im_end|>\n' }}{% endif %}"
            "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def k_blocks(shape, t):
    """Random K-quant blocks (the gguf package has no K-quant quantizer): random codes and
    sub-block scales, FP16 super-block scales small enough that the weights stay below ~1."""
    elems, size = GGML_QUANT_SIZES[t]
    raw = rng.integers(0, 256, size=(shape[0], shape[1] // elems, size), dtype=np.uint8)
    for off in (208,) if t == GGMLQuantizationType.Q6_K else (0, 2):
        d = np.float16(2.0 ** -11)
        raw[:, :, off:off + 2] = np.frombuffer(d.tobytes(), dtype=np.uint8)
    return raw.reshape(shape[0], -1)


def tiny(path, types, hidden=32):
    """hidden 32, or 256 for the K-quants (whose blocks are 256 long)."""
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(hidden)
    w.add_feed_forward_length(2 * hidden if hidden == 32 else hidden)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_key_length(hidden)
    w.add_value_length(hidden)
    w.add_layer_norm_rms_eps(1e-5)
    w.add_rope_freq_base(10000.0)
    w.add_context_length(2048)
    tokens = ["<|endoftext|>", "<|im_start|>", "<|im_end|>"] + [chr(c) for c in range(33, 127)]
    tokens += ["He", "ll", "Hell", "Hello"]
    w.add_tokenizer_model("gpt2")
    w.add_tokenizer_pre("smollm")
    w.add_token_list(tokens)
    w.add_token_types([3, 3, 3] + [1] * (len(tokens) - 3))
    w.add_token_merges(["H e", "l l", "He ll", "Hell o"])
    w.add_bos_token_id(1)
    w.add_eos_token_id(2)
    w.add_chat_template(TEMPLATE)
    vocab = len(tokens)
    h, f = hidden, 2 * hidden if hidden == 32 else hidden
    shapes = {"token_embd.weight": (vocab, h), "output_norm.weight": (h,),
              "blk.0.attn_norm.weight": (h,), "blk.0.ffn_norm.weight": (h,),
              "blk.0.attn_q.weight": (2 * h, h), "blk.0.attn_k.weight": (h, h),
              "blk.0.attn_v.weight": (h, h), "blk.0.attn_output.weight": (h, 2 * h),
              "blk.0.ffn_gate.weight": (f, h), "blk.0.ffn_up.weight": (f, h),
              "blk.0.ffn_down.weight": (h, f)}
    for i, (name, shape) in enumerate(shapes.items()):
        x = rng.standard_normal(shape).astype(np.float32)
        t = types[i % len(types)] if len(shape) == 2 else GGMLQuantizationType.F32
        if t in (GGMLQuantizationType.F32,):
            w.add_tensor(name, x)
        elif t in (T.Q4_K, T.Q5_K, T.Q6_K):
            q = k_blocks(shape, t)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=t)
        elif t == GGMLQuantizationType.F16:
            w.add_tensor(name, x.astype(np.float16))
        else:
            q = quantize(x, t)
            w.add_tensor(name, q, raw_shape=q.shape, raw_dtype=t)
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


T = GGMLQuantizationType
tiny(out / "tiny_q4_1.gguf", [T.Q4_1])
tiny(out / "tiny_mixed_blocks.gguf", [T.Q4_0, T.Q8_0, T.Q4_1])
tiny(out / "tiny_f16.gguf", [T.F16])
tiny(out / "tiny_kquants.gguf", [T.Q4_K, T.Q5_K, T.Q6_K], hidden=256)  # last: same seeds above
print("\n".join(sorted(f"{p.name} {p.stat().st_size}" for p in out.iterdir())))
