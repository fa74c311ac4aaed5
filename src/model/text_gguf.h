/*
 * text_gguf.h - private to src/model: a GGUF file's text interface: its tokenizer (the
 * tokenizer.ggml.* keys as an mg_tok_desc, tokenizer.h) and its chat template
 * (tokenizer.chat_template, recognised by chat.h).
 *
 * tokenizer.ggml.model "gpt2" is byte-level BPE with tokenizer.ggml.pre naming the
 * pre-tokenizer; "llama" is SentencePiece-style BPE (scores, byte fallback). Token types,
 * merges, scores and the bos / eos / unknown / padding ids and add_bos_token /
 * add_eos_token / add_space_prefix are read where present. Any other model, a key of the wrong
 * type or a count that disagrees with the token list is a one-line error (mg_last_error).
 */
#ifndef METRALE_MODEL_TEXT_GGUF_H
#define METRALE_MODEL_TEXT_GGUF_H

#include "chat.h"
#include "gguf.h"
#include "tokenizer.h"

mg_status mg_gguf_tokenizer(const mg_gguf *g, const char *path, mg_tok **out);

/* The text interface of the checkpoint at `path` (opened and closed here): its tokenizer in
 * *tok, and its chat template in *chat (*has_chat false, and *chat zeroed, when the file has
 * none or one chat.h does not recognise; *chat_problem then says which, for a message). A
 * recognised template carries the tokenizer's BOS and EOS token texts (mg_chat_set_special_
 * tokens), so its rendering is what the checkpoint's template gives with them. */
mg_status mg_gguf_text_open(const char *path, mg_tok **tok, mg_chat_template *chat, bool *has_chat,
                            char *chat_problem, size_t problem_size);

#endif
