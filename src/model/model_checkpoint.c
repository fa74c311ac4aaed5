/* model_checkpoint.c - a real checkpoint, GGUF file or Hugging Face / MLX directory, behind one
 * seam (model_checkpoint.h). */
#include "model_checkpoint.h"

#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "model_gguf.h"
#include "model_hf.h"

struct mg_fwd_checkpoint {
    mg_gguf *gguf; /* a GGUF file, or */
    mg_fwd_hf *hf; /* a directory */
};

mg_status mg_fwd_checkpoint_open(const char *path, mg_fwd_preset *arch, char *name,
                                 size_t name_size, mg_fwd_checkpoint **out) {
    *out = NULL;
    struct stat sb;
    if (stat(path, &sb))
        return mg_error_report(errno == ENOENT ? MG_ERR_NOT_FOUND : MG_ERR_INVALID_ARGUMENT,
                               "checkpoint %s: %s", path, strerror(errno));
    mg_fwd_checkpoint *c = calloc(1, sizeof *c);
    if (!c)
        return mg_error_report(MG_ERR_OUT_OF_MEMORY, "out of host memory");
    mg_status st;
    if (S_ISDIR(sb.st_mode))
        st = mg_fwd_hf_open(path, arch, name, name_size, &c->hf);
    else if (!(st = mg_gguf_open(path, &c->gguf)))
        st = mg_fwd_gguf_arch(c->gguf, path, arch, name, name_size);
    if (st) {
        mg_fwd_checkpoint_close(c);
        return st;
    }
    *out = c;
    return MG_OK;
}

void mg_fwd_checkpoint_close(mg_fwd_checkpoint *c) {
    if (!c)
        return;
    mg_gguf_close(c->gguf);
    mg_fwd_hf_close(c->hf);
    free(c);
}

double mg_fwd_checkpoint_weight_bytes(const mg_fwd_checkpoint *c, const mg_fwd_preset *arch) {
    return c->gguf ? mg_fwd_gguf_weight_bytes(c->gguf, arch) : mg_fwd_hf_weight_bytes(c->hf);
}

mg_status mg_fwd_checkpoint_load(mg_backend *b, mg_fwd_checkpoint *c, const mg_fwd_preset *arch,
                                 mg_devptr *layer_w, mg_devptr *extra,
                                 mg_fwd_checkpoint_weights *out) {
    return c->gguf ? mg_fwd_gguf_load(b, c->gguf, arch, layer_w, extra, out)
                   : mg_fwd_hf_load(b, c->hf, arch, layer_w, extra, out);
}
