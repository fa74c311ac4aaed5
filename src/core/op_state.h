/*
 * op_state.h - private: what an op keeps per backend (a library handle, a plan cache, a
 * workspace per stream), in one typed slot the core creates on first use and destroys with
 * the backend. The core knows no op: an op describes its state with an mg_op_state_type and
 * asks for it with mg_op_state_get.
 *
 *   static const mg_op_state_type lt_state_type = {
 *       .name = "gemm_cublaslt", .create = lt_create, .destroy = lt_destroy,
 *       .stream_destroyed = lt_stream_destroyed};
 *   lt_state *st;
 *   mg_status s = mg_op_state_get(b, &lt_state_type, (void **)&st);
 *
 * What an op may rely on:
 *  - create runs once per (backend, type), on the first mg_op_state_get, under a lock that
 *    makes concurrent first calls wait for it; a failed create is retried by the next call.
 *  - destroy runs in mg_backend_close after every stream's work has completed (unless the
 *    backend faulted) and before the op cache and the backend's memory are released, in the
 *    reverse order of creation. The public handle is live during the call, so destroy may
 *    free memory through the public API.
 *  - stream_destroyed (optional) runs in mg_stream_destroy after the stream's work has
 *    completed and before its op-cache scratch is freed.
 *  - create runs under the backend's op-state lock, so it must not ask for op state itself;
 *    destroy and stream_destroyed run without it and may call mg_op_state_get / _peek.
 */
#ifndef METRALE_OP_STATE_H
#define METRALE_OP_STATE_H

#include "metrale/gpu.h"

typedef struct mg_op_state_type {
    const char *name; /* for error messages */
    mg_status (*create)(mg_backend *b, void **state_out);
    void (*destroy)(mg_backend *b, void *state);
    void (*stream_destroyed)(mg_backend *b, void *state, mg_stream *s); /* optional */
} mg_op_state_type;

/* The state of `type` for backend `b`, created on first use. MG_ERR_INVALID_ARGUMENT for a
 * NULL, closed or faulted backend; create's status when it fails. */
mg_status mg_op_state_get(mg_backend *b, const mg_op_state_type *type, void **out);
/* The state if it exists, NULL otherwise; never creates, never sets an error. */
void *mg_op_state_peek(mg_backend *b, const mg_op_state_type *type);

/* For the core: at close, destroy every state (reverse creation order); at stream
 * destruction, tell every state. */
void mg_op_state_release_all(mg_backend *b);
void mg_op_state_stream_destroyed(mg_backend *b, mg_stream *s);

#endif
