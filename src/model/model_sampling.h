/*
 * model_sampling.h - private to src/model: sampled decoding in the forward model
 * (mg_fwd_set_sampling, model.h). model.c calls these around each pass: upload before the pass
 * is launched (or a captured graph replayed), launch right after the pass's own kernels (inside
 * the capture, so that a replay samples too), destroy with the model.
 */
#ifndef METRALE_MODEL_SAMPLING_H
#define METRALE_MODEL_SAMPLING_H

#include "model_internal.h"

/* Whether sampling is on (mg_fwd_set_sampling with parameters). */
bool mg_fwd_sampling_on(const mg_fwd *m);
/* Each request's step (the index of the token the pass draws) and penalty history, uploaded
 * with its parameters; nothing when sampling is off. */
mg_status mg_fwd_sampling_upload(mg_fwd *m);
/* mg_sample over the pass's logits into step_ids (replacing argmax's ids) on `s`; nothing when
 * sampling is off. Capturable. */
mg_status mg_fwd_sampling_launch(mg_fwd *m, mg_stream *s);
/* A failing mg_error_report when one of ids[0..batch) is a code of the sampler (< 0). */
mg_status mg_fwd_sampling_check_ids(const mg_fwd *m, const int32_t *ids);
void mg_fwd_sampling_destroy(mg_fwd *m);

#endif
