"""Writes the seed corpus of fuzz_gguf (tests/fuzz/corpus_gguf/) with the `gguf` package's own
writer: a tiny llama checkpoint with every tensor type the loader takes, a byte-level BPE
tokenizer and SmolLM2's chat template. Run with the .venv-model interpreter (tests/model/setup.sh);
the files are committed, so this only runs when the seeds are to change."""
import sys
from pathlib import Path

import numpy as np
from gguf import GGUFWriter, GGMLQuantizationType
from gguf.quants import quantize

out = Path(sys.argv[1] if len(sys.argv) > 1 else Path(__file__).parent / "corpus_gguf")
out.mkdir(parents=True, exist_ok=True)
rng = np.random.default_rng(1)
TEMPLATE = ("{% for message in messages %}{% if loop.first and messages[0]['role'] != 'system' %}"
            "{{ '<|im_start|>system\nYou are a tiny model<|im_end|>\n' }}{% endif %}"
            "{{'<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>' + '\n'}}"
            "{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")


def tiny(path, types):
    w = GGUFWriter(str(path), "llama")
    w.add_block_count(1)
    w.add_embedding_length(32)
    w.add_feed_forward_length(64)
    w.add_head_count(2)
    w.add_head_count_kv(1)
    w.add_key_length(32)
    w.add_value_length(32)
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
    shapes = {"token_embd.weight": (vocab, 32), "output_norm.weight": (32,),
              "blk.0.attn_norm.weight": (32,), "blk.0.ffn_norm.weight": (32,),
              "blk.0.attn_q.weight": (64, 32), "blk.0.attn_k.weight": (32, 32),
              "blk.0.attn_v.weight": (32, 32), "blk.0.attn_output.weight": (32, 64),
              "blk.0.ffn_gate.weight": (64, 32), "blk.0.ffn_up.weight": (64, 32),
              "blk.0.ffn_down.weight": (32, 64)}
    for i, (name, shape) in enumerate(shapes.items()):
        x = rng.standard_normal(shape).astype(np.float32)
        t = types[i % len(types)] if len(shape) == 2 else GGMLQuantizationType.F32
        if t in (GGMLQuantizationType.F32,):
            w.add_tensor(name, x)
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
print("\n".join(sorted(f"{p.name} {p.stat().st_size}" for p in out.iterdir())))
