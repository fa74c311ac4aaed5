#!/usr/bin/env python3
"""Reference files for tests/test_tokenizer.c, made with the Hugging Face `tokenizers`
package (the independent reference) and `gguf` (to read SmolLM2's real vocabulary).

    make_reference.py SMOLLM2_GGUF OUT_DIR

Writes into OUT_DIR:
  index.txt            one tokenizer per line:
                         json NAME             C loads NAME.json, checks NAME.ref
                         desc NAME REF KIND PRE ADD_BOS ADD_SPACE_PREFIX BOS EOS UNK
                                               C builds from NAME.desc (mg_tok_create),
                                               checks REF.ref
  corpus.txt           one test string per line, hex of its UTF-8
  NAME.json            the tokenizer.json
  NAME.ref             E IDX ADD_SPECIAL PARSE_SPECIAL N ID...   ids of corpus string IDX
                       D IDX SKIP_SPECIAL ROUNDTRIP HEX          decode of E IDX 1 1's ids;
                                                                 ROUNDTRIP 1 when decode of
                                                                 E IDX 0 1 equals the string
                       R N ID... HEX0 HEX1                       decode of arbitrary ids,
                                                                 skip_special 0 and 1
  NAME.desc            T TYPE HEX (a token, index = id), M HEX (a merge), S SCORE
"""
import json
import os
import random
import sys

from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers
from tokenizers import pre_tokenizers, processors, trainers

GPT2_RE = r"'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"
LLAMA3_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}|"
             r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")
QWEN2_RE = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}|"
            r" ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

CORPUS = [
    "", "a", " ", "  ", "\n", "Hello world", "Hello, world! How are you?", " leading space",
    "trailing space ", "  two leading", "multiple   spaces   between", "tabs\tand\ttabs",
    "\t\tindent", "line1\nline2\n", "windows\r\nline\r\n", "\n\n\nmany newlines",
    "mixed \t \n whitespace  \n\n  end   ", "  \r\n\t x", "I'm you're he's we've they'll I'd it's",
    "I'M YOU'RE HE'S WE'VE THEY'LL I'D", "don't Don't DON'T dOn'T", "'s 's' quote' ''",
    "\u017ftop '\u017f 'S 'Re", "numbers 1 12 123 1234 12345 1234567890",
    "3.14159 2,718 1e-10 -42 +7", "year 2024, phone +1-555-0100", "9" * 50,
    "\u4e2d\u6587\u6d4b\u8bd5\uff1a\u4f60\u597d\uff0c\u4e16\u754c\uff01",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8\u3001\u30ab\u30bf\u30ab\u30ca",
    "\ud55c\uad6d\uc5b4 \ud14d\uc2a4\ud2b8",
    "\u0627\u0644\u0639\u0631\u0628\u064a\u0629: \u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0939\u093f\u0928\u094d\u0926\u0940 \u092e\u0947\u0902 \u092a\u093e\u0920",
    "\u0420\u0443\u0441\u0441\u043a\u0438\u0439 \u0442\u0435\u043a\u0441\u0442: \u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440!",
    "\u0395\u03bb\u03bb\u03b7\u03bd\u03b9\u03ba\u03ac",
    "emoji \U0001F600\U0001F603\U0001F604 \U0001F389",
    "family \U0001F468\u200d\U0001F469\u200d\U0001F467\u200d\U0001F466 and flags \U0001F1EB\U0001F1F7\U0001F1EF\U0001F1F5",
    "skin \U0001F44D\U0001F3FD heart \u2764\ufe0f",
    "def foo(x):\n    return x * 2  # comment\n",
    "int main(void) { printf(\"%d\\n\", 42); }",
    "<html><body class=\"a\">text</body></html>", "{\"key\": [1, 2, 3], \"k2\": null}",
    "<|im_start|>user\nHi<|im_end|>\n<|im_start|>assistant\n", "text<|endoftext|>more",
    "<|im_start|><|im_end|>", "<s>Hello</s>", "<s> spaced </s>", "a<unk>b",
    "partial <|im_sta rt|>", "call [TOOL] now[TOOL]x", "<|begin_of_text|>Hi",
    "\u00dcn\u00efc\u00f6d\u00e9 \u00e0\u00e7c\u00e9nts na\u00efve caf\u00e9",
    "\u00a0nbsp\u2003emspace\u3000ideographic", "zero\u200bwidth",
    "combining e\u0301 a\u0308", "math \u2211\u222b\u221a\u221e \u2260 \u2264", "!!!???...",
    "\uff11\uff12\uff13 full-width \u0663\u0664\u0665 arabic-indic", "\u216b\u2163 roman \u00bd",
    "a" * 300, "word " * 50, " " * 40 + "x", "\u2581already\u2581metaspace",
    "bytes \x00\x01\x7f\u0080\u00ad end", "\ufffd replacement", "fill <mask>  here",
    "<mask>", " \t<mask>\n x", "a\u3000<mask>\u3000b",
]

TRAIN_TEXT = """The quick brown fox jumps over the lazy dog. It's a sunny day, isn't it?
We've been waiting for hours; they'll arrive soon. I'd like 12 apples and 345 oranges.
def main():
    for i in range(10):
        print(f"value {i}: {i * i}")
    return 0
int add(int a, int b) { return a + b; }
The year 2024 had 366 days. Numbers like 3.14159 and 2.71828 are famous constants.
Hello world! Hello there. How are you doing today? I'm fine, thanks for asking.
Привет, как дела? Это тестовый текст на русском языке.
这是一个中文句子，用于训练分词器。
مرحبا بكم في هذا الاختبار
    indented line with    spaces	and tabs
""" * 20


def hexs(s):
    return s.encode("utf-8").hex() if isinstance(s, str) else s.hex()


def write_ref(tok, name, out, rng):
    lines = []
    for idx, s in enumerate(CORPUS):
        for add in (0, 1):
            for parse in (0, 1):
                tok.encode_special_tokens = not parse
                ids = tok.encode(s, add_special_tokens=bool(add)).ids
                lines.append("E %d %d %d %d %s" % (idx, add, parse, len(ids), " ".join(map(str, ids))))
        tok.encode_special_tokens = False
        ids = tok.encode(s, add_special_tokens=True).ids
        plain = tok.encode(s, add_special_tokens=False).ids
        rt = 1 if tok.decode(plain, skip_special_tokens=False) == s else 0
        for skip in (0, 1):
            lines.append("D %d %d %d %s" % (idx, skip, rt, hexs(tok.decode(ids, skip_special_tokens=bool(skip)))))
    n = tok.get_vocab_size(with_added_tokens=True)
    for _ in range(200):
        ids = [rng.randrange(n) for _ in range(rng.randint(1, 8))]
        d0 = tok.decode(ids, skip_special_tokens=False)
        d1 = tok.decode(ids, skip_special_tokens=True)
        lines.append("R %d %s %s %s" % (len(ids), " ".join(map(str, ids)), hexs(d0) or "-", hexs(d1) or "-"))
    with open(os.path.join(out, name + ".ref"), "w") as f:
        f.write("\n".join(lines) + "\n")


def save(tok_json, name, out, rng, index):
    text = json.dumps(tok_json, ensure_ascii=False)
    tok = Tokenizer.from_str(text)
    with open(os.path.join(out, name + ".json"), "w", encoding="utf-8") as f:
        f.write(text)
    write_ref(tok, name, out, rng)
    index.append("json " + name)
    return tok


def read_gguf(path):
    from gguf import GGUFReader
    r = GGUFReader(path)

    def arr(key, conv):
        f = r.fields[key]
        return [conv(f.parts[i]) for i in f.data]

    def scalar(key, default):
        f = r.fields.get(key)
        return default if f is None else f.parts[f.data[0]][0]

    tokens = arr("tokenizer.ggml.tokens", lambda p: bytes(p).decode("utf-8"))
    merges = arr("tokenizer.ggml.merges", lambda p: bytes(p).decode("utf-8"))
    types = arr("tokenizer.ggml.token_type", lambda p: int(p[0]))
    pre = bytes(r.fields["tokenizer.ggml.pre"].parts[-1]).decode("utf-8")
    bos = int(scalar("tokenizer.ggml.bos_token_id", -1))
    eos = int(scalar("tokenizer.ggml.eos_token_id", -1))
    add_bos = int(bool(scalar("tokenizer.ggml.add_bos_token", False)))
    return tokens, merges, types, pre, bos, eos, add_bos


def write_desc(out, name, tokens, types, merges=(), scores=None):
    with open(os.path.join(out, name + ".desc"), "w") as f:
        for i, (t, ty) in enumerate(zip(tokens, types)):
            f.write("T %d %s\n" % (ty, hexs(t) or "-"))
        for m in merges:
            f.write("M %s\n" % hexs(m))
        for s in scores or ():
            f.write("S %r\n" % s)


def smollm2(gguf_path, out, rng, index):
    tokens, merges, types, pre, bos, eos, add_bos = read_gguf(gguf_path)
    assert pre == "smollm", pre
    vocab = {t: i for i, t in enumerate(tokens)}
    model = models.BPE(vocab=vocab, merges=[tuple(m.split(" ", 1)) for m in merges],
                       unk_token=None, fuse_unk=False, byte_fallback=False)
    tok = Tokenizer(model)
    tok.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    tok.decoder = decoders.ByteLevel()
    tok.post_processor = processors.ByteLevel(trim_offsets=False)
    control = [AddedToken(t, special=True, normalized=False) for t, ty in zip(tokens, types) if ty == 3]
    assert len(control) == 17, len(control)
    tok.add_special_tokens(control)
    save(json.loads(tok.to_str()), "smollm2", out, rng, index)
    write_desc(out, "smollm2_gguf", tokens, types, merges)
    index.append("desc smollm2_gguf smollm2 byte smollm %d 0 %d %d -1" % (add_bos, bos, eos))


SPECIALS = ["<|endoftext|>", "<|im_start|>", "<|im_end|>", "<|begin_of_text|>"]


def train_byte_level(pre, out, name, rng, index, ignore_merges=False, template=False,
                     legacy_merges=False, strip_token=False):
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre
    tok.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=900, min_frequency=2, show_progress=False,
                                  special_tokens=SPECIALS,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    tok.train_from_iterator([TRAIN_TEXT], trainer=trainer)
    tok.add_tokens([AddedToken("[TOOL]", special=False, normalized=False)])
    if strip_token:
        tok.add_special_tokens([AddedToken("<mask>", special=True, lstrip=True, rstrip=True,
                                           normalized=False)])
    if template:
        tok.post_processor = processors.Sequence([
            processors.ByteLevel(trim_offsets=False),
            processors.TemplateProcessing(single="<|begin_of_text|> $A",
                                          special_tokens=[("<|begin_of_text|>", 3)])])
    d = json.loads(tok.to_str())
    d["model"]["ignore_merges"] = ignore_merges
    if legacy_merges:
        d["model"]["merges"] = [" ".join(m) if isinstance(m, list) else m for m in d["model"]["merges"]]
    save(d, name, out, rng, index)


def spm(out, rng, index):
    """SentencePiece-style BPE: Metaspace, byte fallback, <unk>/<s>/</s>, in three set-ups."""
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                 split=False)
    trainer = trainers.BpeTrainer(vocab_size=700, min_frequency=2, show_progress=False,
                                  limit_alphabet=120)
    tok.train_from_iterator([TRAIN_TEXT], trainer=trainer)
    trained = json.loads(tok.to_str())["model"]
    order = sorted(trained["vocab"].items(), key=lambda kv: kv[1])
    tokens = ["<unk>", "<s>", "</s>"] + ["<0x%02X>" % b for b in range(256)]
    tokens += [t for t, _ in order if t not in tokens]
    vocab = {t: i for i, t in enumerate(tokens)}
    merges = [tuple(m) if isinstance(m, list) else tuple(m.split(" ", 1)) for m in trained["merges"]]
    llama_dec = decoders.Sequence([decoders.Replace("\u2581", " "), decoders.ByteFallback(),
                                   decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    bos_template = processors.TemplateProcessing(single="<s> $A", special_tokens=[("<s>", 1)])
    specials = [AddedToken(t, special=True, normalized=False) for t in ("<unk>", "<s>", "</s>")]

    def build(merge_list, normalizer, pre, dec):
        t = Tokenizer(models.BPE(vocab=dict(vocab), merges=list(merge_list), unk_token="<unk>",
                                 fuse_unk=True, byte_fallback=True))
        if normalizer is not None:
            t.normalizer = normalizer
        if pre is not None:
            t.pre_tokenizer = pre
        t.decoder = dec
        t.post_processor = bos_template
        t.add_special_tokens(specials)
        return json.loads(t.to_str())

    legacy_norm = normalizers.Sequence([normalizers.Prepend("\u2581"), normalizers.Replace(" ", "\u2581")])
    save(build(merges, None, pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="first",
                                                      split=False), llama_dec), "spm", out, rng, index)
    save(build(merges, legacy_norm, None, llama_dec), "spm_legacy", out, rng, index)
    save(build(merges, None, pre_tokenizers.Metaspace(replacement="\u2581", prepend_scheme="always",
                                                      split=True),
               decoders.Metaspace(replacement="\u2581", prepend_scheme="always")),
         "spm_split", out, rng, index)
    # Merging by score (a GGUF "llama" model has scores, no merges): the equivalent merge list
    # is every pair whose concatenation is a token, best-scoring result first (score = -id).
    complete = []
    for t, i in vocab.items():
        if i < 3 + 256:
            continue
        for k in range(1, len(t)):
            a, b = t[:k], t[k:]
            if a in vocab and b in vocab:
                complete.append((i, vocab[a], (a, b)))
    complete.sort()
    save(build([m for _, _, m in complete], legacy_norm, None, llama_dec), "spm_score_ref", out, rng,
         index)
    types = [2, 3, 3] + [6] * 256 + [1] * (len(tokens) - 259)
    write_desc(out, "spm_score", tokens, types, (), [-float(i) for i in range(len(tokens))])
    index.append("desc spm_score spm_score_ref spm - 1 1 1 2 0")


def main():
    gguf_path, out = sys.argv[1], sys.argv[2]
    os.makedirs(out, exist_ok=True)
    rng = random.Random(1234)
    index = []
    with open(os.path.join(out, "corpus.txt"), "w") as f:
        for s in CORPUS:
            f.write((hexs(s) or "-") + "\n")
    smollm2(gguf_path, out, rng, index)
    bl = pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)
    train_byte_level(pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True), out, "gpt2",
                     rng, index, legacy_merges=True)
    train_byte_level(pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True), out,
                     "gpt2_prefix", rng, index, strip_token=True)
    train_byte_level(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(LLAMA3_RE), "isolated"), bl]),
                     out, "llama3", rng, index, ignore_merges=True, template=True)
    train_byte_level(pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(QWEN2_RE), "isolated"), bl]),
                     out, "qwen2", rng, index)
    train_byte_level(pre_tokenizers.Sequence([pre_tokenizers.Digits(individual_digits=False),
                                              pre_tokenizers.Split(Regex(GPT2_RE), "isolated"), bl]),
                     out, "digits_split", rng, index)
    spm(out, rng, index)
    with open(os.path.join(out, "index.txt"), "w") as f:
        f.write("\n".join(index) + "\n")
    print("tokenizer reference: %d tokenizers, %d strings" % (len(index), len(CORPUS)))


if __name__ == "__main__":
    main()
