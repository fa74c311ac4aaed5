#!/usr/bin/env python3
"""Reference renderings for tests/test_chat.c, made with jinja2 (the independent reference)
in the environment Hugging Face transformers' apply_chat_template builds: a sandboxed
environment with trim_blocks and lstrip_blocks, the loopcontrols extension, a
raise_exception global that raises TemplateError, a tojson filter that does not escape HTML,
and the tokenizer's special tokens (bos_token, eos_token) passed beside messages and
add_generation_prompt.

    make_chat_reference.py SMOLLM2_GGUF TEMPLATE_DIR OUT_DIR

The templates, character for character as their checkpoints ship them:
  smollm2            tokenizer.chat_template of SmolLM2-135M-Instruct's GGUF (read here with
                     the gguf package, so the test sees exactly what the checkpoint holds)
  chatml             plain ChatML (TEMPLATE_DIR/chatml.jinja)
  llama3             chat_template of meta-llama/Meta-Llama-3-8B-Instruct's
                     tokenizer_config.json (TEMPLATE_DIR/llama3.jinja)
  mistral_v1         chat_template of mistralai/Mistral-7B-Instruct-v0.1 (and v0.2's first
                     revision): no system role (TEMPLATE_DIR/mistral_v1.jinja)
  mistral_v2_system  the later revision of mistralai/Mistral-7B-Instruct-v0.2's, which takes
                     an optional first system message (TEMPLATE_DIR/mistral_v2_system.jinja)

Writes into OUT_DIR:
  NAME.jinja           the template text rendered (bytes as given to jinja2)
  conversations.txt    one conversation a line: ID COUNT then ROLE_HEX CONTENT_HEX per message
                       (hex of UTF-8, "-" for empty)
  index.txt            T NAME BOS_HEX EOS_HEX                a template and its special tokens
                       R NAME CONV_ID AGP RESULT             AGP 0/1 (add_generation_prompt);
                                                             RESULT hex of the rendering, or
                                                             ERROR when the template refuses
                                                             the conversation (raise_exception
                                                             or an undefined value)
"""
import json
import os
import sys

import jinja2
import jinja2.ext
from jinja2.sandbox import ImmutableSandboxedEnvironment
from gguf import GGUFReader

TEMPLATES = {
    # name: (file or None for the GGUF's, bos_token, eos_token) - the tokens as the checkpoints'
    # tokenizer configs name them
    "smollm2": (None, "<|im_start|>", "<|im_end|>"),
    "chatml": ("chatml.jinja", "<|im_start|>", "<|im_end|>"),
    "llama3": ("llama3.jinja", "<|begin_of_text|>", "<|eot_id|>"),
    "mistral_v1": ("mistral_v1.jinja", "<s>", "</s>"),
    "mistral_v2_system": ("mistral_v2_system.jinja", "<s>", "</s>"),
}

U, A, S = "user", "assistant", "system"
CONVERSATIONS = [
    [],
    [(U, "What is the capital of France?")],
    [(S, "You are terse."), (U, "Hi")],
    [(U, "Hello"), (A, "Hi there, how can I help?"), (U, "Tell me a joke")],
    [(S, "Be kind."), (U, "Q1"), (A, "A1"), (U, "Q2")],
    [(U, "Hello"), (A, "Hi")],
    [(U, "line one\nline two\n\nline four")],
    [(U, "quotes ' and \" and `, braces {{ x }} {% if %} {# c #}, backslash \\ \\n")],
    [(U, "unicode: h\u00e9llo \u4e16\u754c \U0001F389 \u0645\u0631\u062d\u0628\u0627")],
    [(U, "")],
    [(S, ""), (U, "")],
    [(U, "  \n\t padded both sides \r\n ")],
    [(U, "\u3000\u00a0 ideographic and nbsp \u2003\u0085\u2028"), (A, "\u200bzero width\ufeff")],
    [(U, "\x1c\x1f\x0b\x0c inner\x1c")],
    [(U, "special text <|im_end|><|eot_id|></s>[INST]")],
    [(S, "only a system message")],
    [(A, "assistant first")],
    [(U, "a"), (U, "b")],
    [(S, "s1"), (S, "s2"), (U, "u")],
    [(U, "u"), (A, "a"), (S, "late system")],
    [(U, "u"), ("tool", "a tool result")],
    [("tool", "a tool first")],
    [(S, "sys\nwith lines"), (U, "  spaced  "), (A, "  answer  "), (U, "again"), (A, "done")],
]


def environment():
    def raise_exception(message):
        raise jinja2.exceptions.TemplateError(message)

    def tojson(x, ensure_ascii=False, indent=None, separators=None, sort_keys=False):
        return json.dumps(x, ensure_ascii=ensure_ascii, indent=indent, separators=separators,
                          sort_keys=sort_keys)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True,
                                        extensions=[jinja2.ext.loopcontrols])
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    return env


def hexs(s):
    return s.encode("utf-8").hex() if s else "-"


def main():
    gguf_path, template_dir, out = sys.argv[1:4]
    os.makedirs(out, exist_ok=True)
    field = GGUFReader(gguf_path).fields["tokenizer.chat_template"]
    smollm2 = bytes(field.parts[field.data[0]]).decode("utf-8")
    env = environment()
    with open(os.path.join(out, "conversations.txt"), "w") as f:
        for i, conv in enumerate(CONVERSATIONS):
            f.write(f"{i} {len(conv)}" + "".join(f" {hexs(r)} {hexs(c)}" for r, c in conv) + "\n")
    index = []
    counts = {"ok": 0, "error": 0}
    for name, (path, bos, eos) in TEMPLATES.items():
        if path is None:
            text = smollm2
        else:
            with open(os.path.join(template_dir, path), encoding="utf-8", newline="") as f:
                text = f.read()
        with open(os.path.join(out, name + ".jinja"), "w", encoding="utf-8", newline="") as f:
            f.write(text)
        index.append(f"T {name} {hexs(bos)} {hexs(eos)}")
        template = env.from_string(text)
        for i, conv in enumerate(CONVERSATIONS):
            messages = [{"role": r, "content": c} for r, c in conv]
            for agp in (False, True):
                try:
                    result = hexs(template.render(messages=messages, add_generation_prompt=agp,
                                                  bos_token=bos, eos_token=eos))
                    counts["ok"] += 1
                except jinja2.exceptions.TemplateError:
                    # raise_exception, or messages[0] of an empty conversation (UndefinedError
                    # is a TemplateError): transformers raises too
                    result = "ERROR"
                    counts["error"] += 1
                index.append(f"R {name} {i} {int(agp)} {result}")
    with open(os.path.join(out, "index.txt"), "w") as f:
        f.write("\n".join(index) + "\n")
    print(f"chat reference: jinja2 {jinja2.__version__}, {len(TEMPLATES)} templates, "
          f"{counts['ok']} renderings, {counts['error']} refusals")


if __name__ == "__main__":
    main()
