/*
 * op_registry.h - private to src/ops: how an op front finds its providers (metrale/ops.h).
 *
 * Each op lists its providers once, in order of preference, in an mg_op_def; src/ops/
 * registry.c lists the ops (one line each). A provider struct of an op embeds mg_op_provider
 * as its first member, so the front gets its own table back from mg_op_choose:
 *
 *   typedef struct mg_gemm_provider { mg_op_provider base; mg_status (*run)(...); } ...;
 *   const mg_op_provider *p;
 *   if (!(st = mg_op_choose(b, MG_OP_GEMM_BF16, &call, "mg_gemm", &p)))
 *       st = ((const mg_gemm_provider *)p)->run(...);
 */
#ifndef METRALE_OP_REGISTRY_H
#define METRALE_OP_REGISTRY_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/launch.h"
#include "metrale/ops.h"

/* A provider that runs our own kernels by name works on any backend that ships them. */
#define MG_OP_ANY_BACKEND MG_BACKEND_AUTO

typedef struct mg_op_provider {
    const char *name;        /* "reference", "cublaslt", "flashinfer", "kernels", ... */
    mg_backend_kind backend; /* the backend kind it runs on, or MG_OP_ANY_BACKEND */
    /* Whether it can run on `b` at all; on false writes the reason. NULL: always. Must not
     * set mg_last_error. */
    bool (*available)(mg_backend *b, char *reason, size_t reason_bytes);
    /* Whether it supports one call (`call` is the op's own checked call description); on
     * false writes the reason. NULL: every call its front accepts. Both hooks run on every
     * call: they must be cheap and must not set mg_last_error. */
    bool (*supports)(mg_backend *b, const void *call, char *reason, size_t reason_bytes);
    /* A provider that launches our kernels of module "metrale" by name: the names it needs
     * (NULL-terminated; NULL: none). It is available only where the backend ships every one,
     * tested before `available`, so its own hook need not ask. */
    const char *const *kernels;
    /* The CPU kernels it launches (NULL: none): registered once per process, for every
     * provider of every op, when the first CPU backend opens (mg_op_register_cpu_kernels), so
     * they are there for op calls, provider queries and kernels launched by name alike. */
    void (*register_cpu_kernels)(void);
} mg_op_provider;

/* The provider of a kernel-by-name op, "kernels", on any backend that ships the kernels named
 * (string literals), e.g. MG_OP_KERNELS_PROVIDER(mg_silu_mul_cpu_kernels_register,
 * MG_SILU_MUL_KERNEL); the CPU backend ships them once `register_cpu` has run. */
#define MG_OP_KERNEL_NAMES(...) ((const char *const[]){__VA_ARGS__, NULL})
#define MG_OP_KERNELS_PROVIDER(register_cpu, ...)                                                  \
    MG_OP_KERNELS_PROVIDER_SUPPORTS(register_cpu, NULL, __VA_ARGS__)
/* The same with a `supports` hook: the calls it refuses although the kernels are there. */
#define MG_OP_KERNELS_PROVIDER_SUPPORTS(register_cpu, supports_call, ...)                          \
    {                                                                                              \
        .name = "kernels", .backend = MG_OP_ANY_BACKEND, .supports = (supports_call),              \
        .kernels = MG_OP_KERNEL_NAMES(__VA_ARGS__), .register_cpu_kernels = (register_cpu)         \
    }

typedef struct mg_op_def {
    mg_op op;
    const char *name;
    const mg_op_provider *const *providers; /* NULL-terminated, in order of preference */
} mg_op_def;

/* The registry (src/ops/registry.c): indexed by mg_op. */
extern const mg_op_def *const mg_op_defs[MG_OP_COUNT];

/* The provider that runs `call` of `op` on `b`: the forced one, or the first available that
 * supports the call. MG_ERR_UNSUPPORTED (message: `fn`, backend, each provider's reason)
 * when none does. `b` must be live: the caller entered (mg_op_enter) and the choice does not
 * look the handle up again. */
mg_status mg_op_choose(mg_backend *b, mg_op op, const void *call, const char *fn,
                       const mg_op_provider **out);

/* Whether `b` (live) ships kernel `name` of module "metrale"; the reason otherwise. For a
 * supports hook whose calls need a kernel the provider's `kernels` list does not name (one
 * variant of many). Cached after the first lookup; never sets mg_last_error. */
bool mg_op_ships_kernel(mg_backend *b, const char *name, char *reason, size_t reason_bytes);

/* The provider forced for `op` on `b` (mg_op_force_provider), NULL when the choice is automatic.
 * Cheap; never sets mg_last_error. For a provider's supports hook that accepts more calls when
 * a caller asked for it by name than when it competes in the automatic choice. */
const mg_op_provider *mg_op_forced(mg_backend *b, mg_op op);

/* Registers the CPU kernels of every provider (register_cpu_kernels), once per process; cheap
 * after the first call. The backend registry (src/backends/registry.c) calls it whenever it
 * has opened a CPU backend, before handing out the handle, so no op front, provider check or
 * kernel lookup by name on a CPU backend needs to. */
void mg_op_register_cpu_kernels(void);

/* Statistics (metrale/ops.h), updated by the fronts and providers. No-ops on a closed
 * backend. */
void mg_op_count_call(mg_backend *b, mg_op op, const mg_op_provider *p, bool caller_workspace);
void mg_op_count_plans(mg_backend *b, mg_op op, int64_t delta);
void mg_op_count_workspace(mg_backend *b, mg_op op, int64_t delta_bytes);

#endif
