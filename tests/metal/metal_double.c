/*
 * metal_double.c - a test double of the Objective-C runtime and the Metal framework, loaded
 * by the Metal backend in place of libobjc and Metal.framework (env METRALE_METAL_OBJC_LIBRARY
 * and METRALE_METAL_FRAMEWORK both name this library). It implements the messages the backend
 * sends and checks the rules Metal imposes on their order, recording every breach:
 *   - an encoder is ended before another is made on its command buffer and before commit;
 *   - a command buffer is committed before anything waits for it, and committed once;
 *   - no message goes to a released object, and no buffer a committed command buffer uses
 *     has been released when that command buffer runs;
 *   - autoreleased objects are made inside an autorelease pool (Apple's runtime leaks them
 *     otherwise).
 * Buffers are host memory. A committed command buffer runs at once, in order: blits and
 * fills are memcpy/memset; each dispatch is run by the CPU reference kernel of the same name
 * (module "metrale") in a private copy of libmetrale_gpu.so, with the arguments rebuilt from
 * what was bound and the parameter list of the kernel in the MSL source the backend compiled
 * (buffer pointers, `constant uint &` and the like as scalars), so a signature that disagrees
 * with the host's launch builder fails the run.
 *
 * What this cannot show: that the MSL compiles on a Mac or computes what the CPU kernel does,
 * and anything about timing or concurrency on a GPU. objc_msgSend is objc_msgSend_x86_64.S.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "metal_double.h"
#include "metrale/gpu.h"
#include "metrale/launch.h"
#include "metrale/ops.h"

typedef unsigned long nsuint;
typedef struct {
    nsuint width, height, depth;
} mtl_size;
typedef struct {
    nsuint location, length;
} ns_range;
typedef void (*imp)(void);

/* ------------------------------------------------------------------ objects */

typedef enum kind {
    K_CLASS_NSSTRING,
    K_STRING,
    K_ERROR,
    K_DEVICE,
    K_BUFFER,
    K_QUEUE,
    K_CB,
    K_COMPUTE,
    K_BLIT,
    K_LIBRARY,
    K_FUNCTION,
    K_PIPELINE,
    K_EVENT,
    K_KIND_COUNT
} kind;
static const char *const kind_names[] = {
    "NSString(class)", "NSString",      "NSError",        "device",      "buffer",
    "queue",           "commandBuffer", "computeEncoder", "blitEncoder", "library",
    "function",        "pipeline",      "sharedEvent"};

typedef struct obj {
    kind k;
    int id;
    int refs;
    bool dead;
    struct obj *made_before; /* every object ever made, newest first (made_last) */
} obj;

typedef struct string_obj {
    obj o;
    char *utf8;
} string_obj;
typedef struct error_obj {
    obj o;
    string_obj *text;
} error_obj;
typedef struct buffer_obj {
    obj o;
    void *mem;
    size_t len;
} buffer_obj;
typedef struct library_obj {
    obj o;
    char *source;
} library_obj;

#define MAX_PARAMS 31
typedef enum param_kind { P_NONE, P_BUFFER, P_U32, P_I32, P_U64, P_F32, P_BYTES } param_kind;
typedef struct function_obj {
    obj o;
    char name[128];
    int params; /* highest [[buffer(i)]] + 1 */
    param_kind kinds[MAX_PARAMS];
} function_obj;
typedef struct pipeline_obj {
    obj o;
    function_obj fn;
} pipeline_obj;
typedef struct event_obj {
    obj o;
    uint64_t signaled;
} event_obj;

typedef struct binding {
    int kind; /* 0 none, 1 buffer, 2 bytes */
    buffer_obj *buffer;
    nsuint offset;
    unsigned char *bytes;
    nsuint len;
} binding;

typedef enum op_kind { OP_DISPATCH, OP_COPY, OP_FILL, OP_SIGNAL, OP_WAIT } op_kind;
typedef struct op {
    op_kind k;
    pipeline_obj *pipeline;
    binding args[MAX_PARAMS];
    nsuint tg_bytes;
    mtl_size groups, threads;
    buffer_obj *src, *dst;
    nsuint src_off, dst_off, size;
    uint8_t value;
    event_obj *event;
    uint64_t event_value;
} op;

typedef struct cb_obj {
    obj o;
    bool committed, completed;
    bool unretained; /* commandBufferWithUnretainedReferences: holds nothing it uses */
    nsuint status;   /* 0 not enqueued ... 4 completed, 5 error */
    obj *open_encoder;
    op *ops;
    size_t op_count, op_cap;
    buffer_obj **held; /* retained until completion, as `commandBuffer` does */
    size_t held_count, held_cap;
    error_obj *error;
    double end_time;
} cb_obj;

typedef struct encoder_obj {
    obj o;
    cb_obj *cb;
    bool ended;
    pipeline_obj *pipeline;
    binding args[MAX_PARAMS];
    nsuint tg_bytes;
} encoder_obj;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;
static int next_id = 1;
/* Objects are kept for the life of the process (see release); the list keeps them reachable,
 * so LeakSanitizer does not report them as leaks of the code under test. */
static obj *made_last;
static int live[K_KIND_COUNT];

/* ------------------------------------------------------------------ the record */

#define LOG_MAX 65536
static char *log_entries[LOG_MAX];
static size_t log_count;
static char violations[8192];
static size_t violation_count;

static void violation(const char *fmt, ...) {
    char text[512];
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(text, sizeof text, fmt, ap);
    va_end(ap);
    pthread_mutex_lock(&lock);
    violation_count++;
    size_t used = strlen(violations);
    snprintf(violations + used, sizeof violations - used, "%s\n", text);
    pthread_mutex_unlock(&lock);
}

static void log_message(const obj *o, const char *sel) {
    char text[160];
    snprintf(text, sizeof text, "%s#%d %s", kind_names[o->k], o->id, sel);
    pthread_mutex_lock(&lock);
    if (log_count < LOG_MAX)
        log_entries[log_count++] = strdup(text);
    pthread_mutex_unlock(&lock);
}

size_t metal_double_violations(char *buf, size_t bytes) {
    pthread_mutex_lock(&lock);
    if (buf && bytes)
        snprintf(buf, bytes, "%s", violations);
    size_t n = violation_count;
    pthread_mutex_unlock(&lock);
    return n;
}

void metal_double_reset(void) {
    pthread_mutex_lock(&lock);
    for (size_t i = 0; i < log_count; i++)
        free(log_entries[i]);
    log_count = 0;
    violations[0] = 0;
    violation_count = 0;
    pthread_mutex_unlock(&lock);
}

size_t metal_double_log_count(void) {
    pthread_mutex_lock(&lock);
    size_t n = log_count;
    pthread_mutex_unlock(&lock);
    return n;
}

const char *metal_double_log_entry(size_t i) {
    pthread_mutex_lock(&lock);
    const char *e = i < log_count ? log_entries[i] : NULL;
    pthread_mutex_unlock(&lock);
    return e;
}

int metal_double_live(const char *kind_name) {
    pthread_mutex_lock(&lock);
    int n = -1;
    for (int k = 0; k < K_KIND_COUNT; k++)
        if (strcmp(kind_names[k], kind_name) == 0)
            n = live[k];
    pthread_mutex_unlock(&lock);
    return n;
}

/* ------------------------------------------------------------------ lifetime */

static void *make(kind k, size_t bytes) {
    obj *o = calloc(1, bytes);
    if (!o)
        abort(); /* a test double out of memory has nothing sensible to report */
    o->k = k;
    o->refs = 1;
    pthread_mutex_lock(&lock);
    o->id = next_id++;
    o->made_before = made_last;
    made_last = o;
    live[k]++;
    pthread_mutex_unlock(&lock);
    return o;
}

static void retain(obj *o) {
    pthread_mutex_lock(&lock);
    o->refs++;
    pthread_mutex_unlock(&lock);
}

/* Objects are never freed (a message to a released one must be caught, not crash); a
 * released buffer's memory is scribbled so a read of it cannot pass unnoticed. */
static void release(obj *o) {
    pthread_mutex_lock(&lock);
    bool over = o->refs <= 0;
    if (!over && --o->refs == 0) {
        o->dead = true;
        live[o->k]--;
    }
    pthread_mutex_unlock(&lock);
    if (over)
        violation("release of %s#%d, already released", kind_names[o->k], o->id);
    else if (o->dead && o->k == K_BUFFER)
        memset(((buffer_obj *)o)->mem, 0xA5, ((buffer_obj *)o)->len);
}

/* The autorelease pools of this thread. */
static _Thread_local obj *pool_items[4096];
static _Thread_local size_t pool_depth, pool_count;

void *objc_autoreleasePoolPush(void) {
    pool_depth++;
    return (void *)(uintptr_t)(pool_count + 1);
}

void objc_autoreleasePoolPop(void *marker) {
    size_t keep = (size_t)(uintptr_t)marker - 1;
    while (pool_count > keep)
        release(pool_items[--pool_count]);
    if (pool_depth)
        pool_depth--;
}

static void *autoreleased(void *p, const char *what) {
    obj *o = p;
    if (!pool_depth || pool_count == sizeof pool_items / sizeof pool_items[0])
        violation("%s made autoreleased with no autorelease pool in place (leaked on a Mac)", what);
    else
        pool_items[pool_count++] = o;
    return o;
}

/* ------------------------------------------------------------------ the CPU library */

static struct {
    mg_status (*backend_open)(mg_backend_kind, int, mg_backend **);
    mg_status (*host_register)(mg_backend *, void *, size_t, mg_devptr *);
    mg_status (*kernel_lookup)(mg_backend *, const char *, const char *, mg_kernel **);
    mg_status (*launch_run)(mg_backend *, mg_kernel *, mg_stream *, const mg_launch *);
    void (*launch_init)(mg_launch *, mg_dim3, mg_dim3, uint32_t);
    void (*arg_ptr)(mg_launch *, mg_devptr);
    void (*arg_u32)(mg_launch *, uint32_t);
    void (*arg_i32)(mg_launch *, int32_t);
    void (*arg_u64)(mg_launch *, uint64_t);
    void (*arg_f32)(mg_launch *, float);
    void (*arg_bytes)(mg_launch *, const void *, size_t);
    const char *(*last_error)(void);
    bool (*op_supported)(mg_backend *, mg_op);
    mg_backend *cpu;
} ref;
static pthread_once_t ref_once = PTHREAD_ONCE_INIT;
static char ref_problem[512];

static void ref_load(void) {
    /* RTLD_LOCAL: a private copy beside the one the backend under test belongs to. */
    void *lib = dlopen(METRALE_DOUBLE_REFERENCE_LIBRARY, RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        snprintf(ref_problem, sizeof ref_problem, "dlopen %s: %s", METRALE_DOUBLE_REFERENCE_LIBRARY,
                 dlerror());
        return;
    }
#define SYM(field, name) *(void **)&ref.field = dlsym(lib, name)
    SYM(backend_open, "mg_backend_open");
    SYM(host_register, "mg_host_register");
    SYM(kernel_lookup, "mg_kernel_lookup");
    SYM(launch_run, "mg_launch_run");
    SYM(launch_init, "mg_launch_init");
    SYM(arg_ptr, "mg_launch_arg_ptr");
    SYM(arg_u32, "mg_launch_arg_u32");
    SYM(arg_i32, "mg_launch_arg_i32");
    SYM(arg_u64, "mg_launch_arg_u64");
    SYM(arg_f32, "mg_launch_arg_f32");
    SYM(arg_bytes, "mg_launch_arg_bytes");
    SYM(last_error, "mg_last_error");
    SYM(op_supported, "mg_op_supported");
#undef SYM
    if (ref.backend_open(MG_BACKEND_CPU, 0, &ref.cpu) != MG_OK) {
        snprintf(ref_problem, sizeof ref_problem, "opening the CPU backend: %s", ref.last_error());
        return;
    }
    /* Asking whether an op runs registers every op's CPU kernels in that copy. */
    ref.op_supported(ref.cpu, MG_OP_SILU_MUL);
}

/* ------------------------------------------------------------------ MSL signatures */

static param_kind scalar_kind(const char *param) {
    char type[64] = "";
    const char *p = param;
    for (;;) {
        while (*p == ' ' || *p == '\n' || *p == '\t')
            p++;
        size_t n = strcspn(p, " \n\t&");
        if (n == 0)
            break;
        snprintf(type, sizeof type, "%.*s", (int)n, p);
        if (strcmp(type, "constant") && strcmp(type, "const") && strcmp(type, "device"))
            break;
        p += n;
    }
    if (!strcmp(type, "uint") || !strcmp(type, "uint32_t"))
        return P_U32;
    if (!strcmp(type, "int") || !strcmp(type, "int32_t"))
        return P_I32;
    if (!strcmp(type, "ulong") || !strcmp(type, "uint64_t"))
        return P_U64;
    if (!strcmp(type, "float"))
        return P_F32;
    return P_BYTES;
}

static bool is_space(char c) {
    return c == ' ' || c == '\t' || c == '\n' || c == '\r';
}

/* Whether `word` ends right before `end` (spaces skipped) as a whole token; *start gets where
 * it begins. */
static bool word_before(const char *source, const char *end, const char *word, const char **start) {
    while (end > source && is_space(end[-1]))
        end--;
    size_t n = strlen(word);
    if ((size_t)(end - source) < n || strncmp(end - n, word, n) != 0)
        return false;
    const char *begin = end - n;
    if (begin > source && !is_space(begin[-1]) && begin[-1] != ';' && begin[-1] != '}')
        return false;
    *start = begin;
    return true;
}

/* The first character after "(" of `kernel void NAME (` in source (any spacing between the
 * tokens, as a formatter leaves them), or NULL. */
static const char *find_kernel(const char *source, const char *name) {
    size_t n = strlen(name);
    for (const char *at = strstr(source, name); at; at = strstr(at + 1, name)) {
        const char *after = at + n, *v, *k;
        while (is_space(*after))
            after++;
        bool token = at == source || is_space(at[-1]);
        if (token && *after == '(' && word_before(source, at, "void", &v) &&
            word_before(source, v, "kernel", &k))
            return after + 1;
    }
    return NULL;
}

/* Fills fn's parameter kinds from `kernel void NAME(...)` in source; false when absent. */
static bool parse_signature(const char *source, function_obj *fn) {
    const char *p = find_kernel(source, fn->name);
    if (!p)
        return false;
    int depth = 0;
    char param[512];
    size_t len = 0;
    for (;; p++) {
        char ch = *p;
        if (!ch)
            return false;
        bool end = depth == 0 && (ch == ',' || ch == ')');
        if (!end) {
            if (ch == '(' || ch == '[')
                depth++;
            if (ch == ')' || ch == ']')
                depth--;
            if (len + 1 < sizeof param)
                param[len++] = ch;
            continue;
        }
        param[len] = 0;
        const char *idx = strstr(param, "[[buffer(");
        if (idx) {
            int i = atoi(idx + 9);
            if (i >= 0 && i < MAX_PARAMS) {
                fn->kinds[i] = strchr(param, '*') ? P_BUFFER : scalar_kind(param);
                if (i + 1 > fn->params)
                    fn->params = i + 1;
            }
        }
        len = 0;
        if (ch == ')')
            return true;
    }
}

/* ------------------------------------------------------------------ running a command buffer */

static double now_seconds(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + (double)ts.tv_nsec * 1e-9;
}

static string_obj *new_string(const char *text) {
    string_obj *s = make(K_STRING, sizeof *s);
    s->utf8 = strdup(text);
    return s;
}

static error_obj *new_error(const char *text) {
    error_obj *e = make(K_ERROR, sizeof *e);
    e->text = new_string(text);
    return e;
}

static bool check_alive(buffer_obj *b, const cb_obj *cb) {
    if (b && b->o.dead) {
        violation("commandBuffer#%d ran with buffer#%d already released", cb->o.id, b->o.id);
        return false;
    }
    return true;
}

static mg_status run_dispatch(const op *d, char *why, size_t why_bytes) {
    pthread_once(&ref_once, ref_load);
    if (ref_problem[0]) {
        snprintf(why, why_bytes, "%s", ref_problem);
        return MG_ERR_INTERNAL;
    }
    const function_obj *fn = &d->pipeline->fn;
    mg_launch l;
    ref.launch_init(
        &l,
        (mg_dim3){(uint32_t)d->groups.width, (uint32_t)d->groups.height, (uint32_t)d->groups.depth},
        (mg_dim3){(uint32_t)d->threads.width, (uint32_t)d->threads.height,
                  (uint32_t)d->threads.depth},
        (uint32_t)d->tg_bytes);
    for (int i = 0; i < fn->params; i++) {
        const binding *b = &d->args[i];
        param_kind pk = fn->kinds[i];
        size_t want = pk == P_U64 ? 8 : 4;
        if (pk == P_BUFFER) {
            if (b->kind == 2) {
                snprintf(why, why_bytes, "%s: argument %d is a pointer, bound with setBytes",
                         fn->name, i);
                return MG_ERR_INVALID_ARGUMENT;
            }
            ref.arg_ptr(&l, b->kind == 1 && b->buffer
                                ? (mg_devptr)(uintptr_t)((char *)b->buffer->mem + b->offset)
                                : 0);
            continue;
        }
        if (b->kind == 1 || (pk != P_BYTES && pk != P_NONE && (b->kind != 2 || b->len != want))) {
            snprintf(why, why_bytes,
                     "%s: argument %d is a %zu-byte scalar in the MSL, bound as %s of %lu bytes",
                     fn->name, i, want, b->kind == 1 ? "a buffer" : "bytes", (unsigned long)b->len);
            return MG_ERR_INVALID_ARGUMENT;
        }
        uint32_t u32 = 0;
        uint64_t u64 = 0;
        float f32 = 0;
        if (b->kind == 2 && b->len == 4) {
            memcpy(&u32, b->bytes, 4);
            memcpy(&f32, b->bytes, 4);
        }
        if (b->kind == 2 && b->len == 8)
            memcpy(&u64, b->bytes, 8);
        switch (pk) {
        case P_U32:
            ref.arg_u32(&l, u32);
            break;
        case P_I32:
            ref.arg_i32(&l, (int32_t)u32);
            break;
        case P_U64:
            ref.arg_u64(&l, u64);
            break;
        case P_F32:
            ref.arg_f32(&l, f32);
            break;
        default:
            ref.arg_bytes(&l, b->kind == 2 ? b->bytes : NULL, b->kind == 2 ? b->len : 0);
        }
    }
    mg_kernel *k;
    mg_status st = ref.kernel_lookup(ref.cpu, "metrale", fn->name, &k);
    if (!st)
        st = ref.launch_run(ref.cpu, k, NULL, &l);
    if (st)
        snprintf(why, why_bytes, "%s", ref.last_error());
    return st;
}

static void run(cb_obj *cb) {
    char why[768] = "";
    mg_status st = MG_OK;
    for (size_t i = 0; i < cb->op_count && !st; i++) {
        op *o = &cb->ops[i];
        switch (o->k) {
        case OP_DISPATCH:
            for (int a = 0; a < MAX_PARAMS; a++)
                if (o->args[a].kind == 1 && !check_alive(o->args[a].buffer, cb))
                    return;
            st = run_dispatch(o, why, sizeof why);
            break;
        case OP_COPY:
            if (!check_alive(o->src, cb) || !check_alive(o->dst, cb))
                return;
            if (o->src_off + o->size > o->src->len || o->dst_off + o->size > o->dst->len) {
                violation("copyFromBuffer outside a buffer (commandBuffer#%d)", cb->o.id);
                return;
            }
            memmove((char *)o->dst->mem + o->dst_off, (char *)o->src->mem + o->src_off, o->size);
            break;
        case OP_FILL:
            if (!check_alive(o->dst, cb))
                return;
            if (o->dst_off + o->size > o->dst->len) {
                violation("fillBuffer outside a buffer (commandBuffer#%d)", cb->o.id);
                return;
            }
            memset((char *)o->dst->mem + o->dst_off, o->value, o->size);
            break;
        case OP_SIGNAL:
            __atomic_store_n(&o->event->signaled, o->event_value, __ATOMIC_RELEASE);
            break;
        case OP_WAIT:
            if (__atomic_load_n(&o->event->signaled, __ATOMIC_ACQUIRE) < o->event_value)
                violation("commandBuffer#%d waits for sharedEvent#%d value %llu that nothing "
                          "committed signals",
                          cb->o.id, o->event->o.id, (unsigned long long)o->event_value);
            break;
        }
    }
    cb->end_time = now_seconds();
    if (st) {
        cb->status = 5;
        cb->error = new_error(why);
    } else {
        cb->status = 4;
    }
    cb->completed = true;
    for (size_t i = 0; i < cb->held_count; i++)
        release(&cb->held[i]->o);
    cb->held_count = 0;
}

static void hold(cb_obj *cb, buffer_obj *b) {
    if (!b || cb->unretained) /* the caller must keep b alive until completion */
        return;
    if (cb->held_count == cb->held_cap) {
        cb->held_cap = cb->held_cap ? 2 * cb->held_cap : 16;
        cb->held = realloc(cb->held, cb->held_cap * sizeof *cb->held);
        if (!cb->held)
            abort();
    }
    retain(&b->o);
    cb->held[cb->held_count++] = b;
}

static op *add_op(cb_obj *cb, op_kind k) {
    if (cb->op_count == cb->op_cap) {
        cb->op_cap = cb->op_cap ? 2 * cb->op_cap : 16;
        cb->ops = realloc(cb->ops, cb->op_cap * sizeof *cb->ops);
        if (!cb->ops)
            abort();
    }
    op *o = &cb->ops[cb->op_count++];
    memset(o, 0, sizeof *o);
    o->k = k;
    return o;
}

/* ------------------------------------------------------------------ methods */

#define SELF(type) type *self = (type *)self_
static void m_release(obj *self_, const char *sel) {
    (void)sel;
    release(self_);
}
static obj *m_retain(obj *self_, const char *sel) {
    (void)sel;
    retain(self_);
    return self_;
}
static obj *m_string_alloc(obj *self_, const char *sel) {
    (void)self_, (void)sel;
    string_obj *s = make(K_STRING, sizeof *s);
    return &s->o;
}
static obj *m_string_init(obj *self_, const char *sel, const char *utf8) {
    SELF(string_obj);
    (void)sel;
    self->utf8 = strdup(utf8 ? utf8 : "");
    return &self->o;
}
static const char *m_utf8(obj *self_, const char *sel) {
    SELF(string_obj);
    (void)sel;
    return self->utf8;
}
static obj *m_error_description(obj *self_, const char *sel) {
    SELF(error_obj);
    (void)sel;
    retain(&self->text->o);
    return autoreleased(self->text, "localizedDescription");
}
static obj *m_device_name(obj *self_, const char *sel) {
    (void)self_, (void)sel;
    return autoreleased(new_string("Metal test double (runs the CPU reference kernels)"), "name");
}
static obj *m_new_queue(obj *self_, const char *sel) {
    (void)self_, (void)sel;
    return make(K_QUEUE, sizeof(obj));
}
static obj *m_new_buffer(obj *self_, const char *sel, nsuint length, nsuint options) {
    (void)self_, (void)sel;
    if (options != 0)
        violation("newBufferWithLength:options: with options %lu, not shared storage", options);
    buffer_obj *b = make(K_BUFFER, sizeof *b);
    b->len = length;
    b->mem = aligned_alloc(256, (length + 255) & ~(size_t)255);
    if (!b->mem)
        abort();
    memset(b->mem, 0, length);
    pthread_once(&ref_once, ref_load);
    mg_devptr unused;
    if (!ref_problem[0] && ref.host_register(ref.cpu, b->mem, length, &unused) != MG_OK)
        violation("the double could not register buffer#%d: %s", b->o.id, ref.last_error());
    return &b->o;
}
static obj *m_new_library(obj *self_, const char *sel, string_obj *source, obj *options,
                          obj **error) {
    (void)self_, (void)sel, (void)options;
    if (!source || !source->utf8 || !strstr(source->utf8, "#include <metal_stdlib>")) {
        if (error)
            *error = autoreleased(new_error("the source is not MSL"), "NSError");
        return NULL;
    }
    library_obj *l = make(K_LIBRARY, sizeof *l);
    l->source = strdup(source->utf8);
    return &l->o;
}
static obj *m_new_function(obj *self_, const char *sel, string_obj *name) {
    SELF(library_obj);
    (void)sel;
    function_obj probe = {0};
    snprintf(probe.name, sizeof probe.name, "%s", name->utf8);
    if (!parse_signature(self->source, &probe))
        return NULL;
    function_obj *f = make(K_FUNCTION, sizeof *f);
    obj header = f->o;
    *f = probe;
    f->o = header;
    return &f->o;
}
static obj *m_new_pipeline(obj *self_, const char *sel, function_obj *fn, obj **error) {
    (void)self_, (void)sel, (void)error;
    pipeline_obj *p = make(K_PIPELINE, sizeof *p);
    obj header = p->o;
    p->fn = *fn;
    p->o = header;
    return &p->o;
}
static obj *m_new_event(obj *self_, const char *sel) {
    (void)self_, (void)sel;
    return make(K_EVENT, sizeof(event_obj));
}
static uint64_t m_working_set(obj *self_, const char *sel) {
    (void)self_, (void)sel;
    return 8ull << 30;
}
static nsuint m_allocated(obj *self_, const char *sel) {
    (void)self_, (void)sel;
    return 0;
}
static signed char m_unified(obj *self_, const char *sel) {
    (void)self_, (void)sel;
    return 1;
}
static nsuint m_tg_memory(obj *self_, const char *sel) {
    (void)self_, (void)sel;
    return 32768;
}
static nsuint m_max_threads(obj *self_, const char *sel) {
    (void)self_, (void)sel;
    return 1024;
}
static void *m_contents(obj *self_, const char *sel) {
    SELF(buffer_obj);
    (void)sel;
    return self->mem;
}
static obj *m_command_buffer(obj *self_, const char *sel) {
    (void)self_, (void)sel;
    return autoreleased(make(K_CB, sizeof(cb_obj)), "commandBuffer");
}
/* Metal's faster form: the command buffer retains nothing, so a buffer its work uses must
 * outlive it by the caller's own bookkeeping; one released before the work runs is a breach
 * (caught when it runs). The backend does not use it; the sequence test plants that breach. */
static obj *m_command_buffer_unretained(obj *self_, const char *sel) {
    (void)self_, (void)sel;
    cb_obj *cb = make(K_CB, sizeof(cb_obj));
    cb->unretained = true;
    return autoreleased(cb, "commandBufferWithUnretainedReferences");
}
static obj *new_encoder(cb_obj *cb, kind k, const char *what) {
    if (cb->committed)
        violation("%s on commandBuffer#%d after commit", what, cb->o.id);
    if (cb->open_encoder && !((encoder_obj *)cb->open_encoder)->ended)
        violation("%s on commandBuffer#%d while encoder#%d is not ended", what, cb->o.id,
                  cb->open_encoder->id);
    encoder_obj *e = make(k, sizeof *e);
    e->cb = cb;
    cb->open_encoder = &e->o;
    return autoreleased(e, what);
}
static obj *m_compute_encoder(obj *self_, const char *sel) {
    (void)sel;
    return new_encoder((cb_obj *)self_, K_COMPUTE, "computeCommandEncoder");
}
static obj *m_blit_encoder(obj *self_, const char *sel) {
    (void)sel;
    return new_encoder((cb_obj *)self_, K_BLIT, "blitCommandEncoder");
}
static void m_commit(obj *self_, const char *sel) {
    SELF(cb_obj);
    (void)sel;
    if (self->committed) {
        violation("commandBuffer#%d committed twice", self->o.id);
        return;
    }
    if (self->open_encoder && !((encoder_obj *)self->open_encoder)->ended)
        violation("commandBuffer#%d committed while encoder#%d is not ended", self->o.id,
                  self->open_encoder->id);
    self->committed = true;
    run(self);
}
static void m_wait(obj *self_, const char *sel) {
    SELF(cb_obj);
    (void)sel;
    if (!self->committed)
        violation("waitUntilCompleted on commandBuffer#%d, never committed (hangs on a Mac)",
                  self->o.id);
}
static nsuint m_status(obj *self_, const char *sel) {
    SELF(cb_obj);
    (void)sel;
    return self->status;
}
static obj *m_cb_error(obj *self_, const char *sel) {
    SELF(cb_obj);
    (void)sel;
    if (!self->error)
        return NULL;
    retain(&self->error->o);
    return autoreleased(self->error, "error");
}
static double m_end_time(obj *self_, const char *sel) {
    SELF(cb_obj);
    (void)sel;
    return self->end_time;
}
static void m_signal(obj *self_, const char *sel, event_obj *e, uint64_t value) {
    SELF(cb_obj);
    (void)sel;
    if (self->open_encoder && !((encoder_obj *)self->open_encoder)->ended)
        violation("encodeSignalEvent on commandBuffer#%d inside an open encoder", self->o.id);
    op *o = add_op(self, OP_SIGNAL);
    o->event = e;
    o->event_value = value;
}
static void m_wait_event(obj *self_, const char *sel, event_obj *e, uint64_t value) {
    SELF(cb_obj);
    (void)sel;
    if (self->open_encoder && !((encoder_obj *)self->open_encoder)->ended)
        violation("encodeWaitForEvent on commandBuffer#%d inside an open encoder", self->o.id);
    op *o = add_op(self, OP_WAIT);
    o->event = e;
    o->event_value = value;
}
static uint64_t m_signaled(obj *self_, const char *sel) {
    (void)sel;
    return __atomic_load_n(&((event_obj *)self_)->signaled, __ATOMIC_ACQUIRE);
}
static void m_end_encoding(obj *self_, const char *sel) {
    SELF(encoder_obj);
    (void)sel;
    if (self->ended)
        violation("endEncoding twice on encoder#%d", self->o.id);
    self->ended = true;
}
static bool encoder_usable(encoder_obj *e, const char *what) {
    if (e->ended || e->cb->committed) {
        violation("%s on encoder#%d after it ended", what, e->o.id);
        return false;
    }
    return true;
}
static void m_set_pipeline(obj *self_, const char *sel, pipeline_obj *p) {
    SELF(encoder_obj);
    (void)sel;
    if (encoder_usable(self, "setComputePipelineState"))
        self->pipeline = p;
}
static void m_set_buffer(obj *self_, const char *sel, buffer_obj *b, nsuint offset, nsuint index) {
    SELF(encoder_obj);
    (void)sel;
    if (!encoder_usable(self, "setBuffer") || index >= MAX_PARAMS)
        return;
    if (b && offset > b->len)
        violation("setBuffer offset %lu past the %zu-byte buffer#%d", offset, b->len, b->o.id);
    free(self->args[index].bytes);
    self->args[index] = (binding){.kind = 1, .buffer = b, .offset = offset};
    hold(self->cb, b);
}
static void m_set_bytes(obj *self_, const char *sel, const void *data, nsuint len, nsuint index) {
    SELF(encoder_obj);
    (void)sel;
    if (!encoder_usable(self, "setBytes") || index >= MAX_PARAMS)
        return;
    if (len == 0 || len > 4096)
        violation("setBytes of %lu bytes (Metal takes 1 to 4096)", len);
    free(self->args[index].bytes);
    self->args[index] = (binding){.kind = 2, .bytes = malloc(len ? len : 1), .len = len};
    memcpy(self->args[index].bytes, data, len);
}
static void m_set_tg(obj *self_, const char *sel, nsuint len, nsuint index) {
    SELF(encoder_obj);
    (void)sel;
    if (len % 16 || index != 0)
        violation("setThreadgroupMemoryLength %lu at %lu (a multiple of 16 at 0 expected)", len,
                  index);
    self->tg_bytes = len;
}
static void m_dispatch(obj *self_, const char *sel, mtl_size groups, mtl_size threads) {
    SELF(encoder_obj);
    (void)sel;
    if (!encoder_usable(self, "dispatchThreadgroups"))
        return;
    if (!self->pipeline) {
        violation("dispatchThreadgroups on encoder#%d without a pipeline", self->o.id);
        return;
    }
    op *o = add_op(self->cb, OP_DISPATCH);
    o->pipeline = self->pipeline;
    o->groups = groups;
    o->threads = threads;
    o->tg_bytes = self->tg_bytes;
    for (int i = 0; i < MAX_PARAMS; i++) {
        o->args[i] = self->args[i];
        if (self->args[i].kind == 2) { /* each dispatch keeps its own copy of the bytes */
            o->args[i].bytes = malloc(self->args[i].len ? self->args[i].len : 1);
            memcpy(o->args[i].bytes, self->args[i].bytes, self->args[i].len);
        }
    }
}
static void m_copy(obj *self_, const char *sel, buffer_obj *src, nsuint src_off, buffer_obj *dst,
                   nsuint dst_off, nsuint size) {
    SELF(encoder_obj);
    (void)sel;
    if (!encoder_usable(self, "copyFromBuffer"))
        return;
    op *o = add_op(self->cb, OP_COPY);
    o->src = src;
    o->dst = dst;
    o->src_off = src_off;
    o->dst_off = dst_off;
    o->size = size;
    hold(self->cb, src);
    hold(self->cb, dst);
}
static void m_fill(obj *self_, const char *sel, buffer_obj *dst, ns_range range, uint8_t value) {
    SELF(encoder_obj);
    (void)sel;
    if (!encoder_usable(self, "fillBuffer"))
        return;
    op *o = add_op(self->cb, OP_FILL);
    o->dst = dst;
    o->dst_off = range.location;
    o->size = range.length;
    o->value = value;
    hold(self->cb, dst);
}

typedef struct method {
    kind k;
    const char *sel;
    imp fn;
} method;

#define M(k, sel, fn)                                                                              \
    { k, sel, (imp)fn }
static const method methods[] = {
    M(K_CLASS_NSSTRING, "alloc", m_string_alloc),
    M(K_STRING, "initWithUTF8String:", m_string_init),
    M(K_STRING, "UTF8String", m_utf8),
    M(K_ERROR, "localizedDescription", m_error_description),
    M(K_DEVICE, "name", m_device_name),
    M(K_DEVICE, "newCommandQueue", m_new_queue),
    M(K_DEVICE, "newBufferWithLength:options:", m_new_buffer),
    M(K_DEVICE, "newLibraryWithSource:options:error:", m_new_library),
    M(K_DEVICE, "newComputePipelineStateWithFunction:error:", m_new_pipeline),
    M(K_DEVICE, "newSharedEvent", m_new_event),
    M(K_DEVICE, "recommendedMaxWorkingSetSize", m_working_set),
    M(K_DEVICE, "currentAllocatedSize", m_allocated),
    M(K_DEVICE, "hasUnifiedMemory", m_unified),
    M(K_DEVICE, "maxThreadgroupMemoryLength", m_tg_memory),
    M(K_LIBRARY, "newFunctionWithName:", m_new_function),
    M(K_PIPELINE, "maxTotalThreadsPerThreadgroup", m_max_threads),
    M(K_BUFFER, "contents", m_contents),
    M(K_QUEUE, "commandBuffer", m_command_buffer),
    M(K_QUEUE, "commandBufferWithUnretainedReferences", m_command_buffer_unretained),
    M(K_CB, "computeCommandEncoder", m_compute_encoder),
    M(K_CB, "blitCommandEncoder", m_blit_encoder),
    M(K_CB, "commit", m_commit),
    M(K_CB, "waitUntilCompleted", m_wait),
    M(K_CB, "status", m_status),
    M(K_CB, "error", m_cb_error),
    M(K_CB, "GPUEndTime", m_end_time),
    M(K_CB, "encodeSignalEvent:value:", m_signal),
    M(K_CB, "encodeWaitForEvent:value:", m_wait_event),
    M(K_EVENT, "signaledValue", m_signaled),
    M(K_COMPUTE, "endEncoding", m_end_encoding),
    M(K_COMPUTE, "setComputePipelineState:", m_set_pipeline),
    M(K_COMPUTE, "setBuffer:offset:atIndex:", m_set_buffer),
    M(K_COMPUTE, "setBytes:length:atIndex:", m_set_bytes),
    M(K_COMPUTE, "setThreadgroupMemoryLength:atIndex:", m_set_tg),
    M(K_COMPUTE, "dispatchThreadgroups:threadsPerThreadgroup:", m_dispatch),
    M(K_BLIT, "endEncoding", m_end_encoding),
    M(K_BLIT, "copyFromBuffer:sourceOffset:toBuffer:destinationOffset:size:", m_copy),
    M(K_BLIT, "fillBuffer:range:value:", m_fill),
};
#undef M

static void m_ignored(void) {}
static unsigned long m_unknown(obj *self_, const char *sel) {
    violation("unrecognized selector %s sent to %s#%d", sel, kind_names[self_->k], self_->id);
    return 0;
}

/* Called by objc_msgSend with its receiver and selector: the method to jump to. */
imp metal_double_lookup(obj *receiver, const char *sel) {
    log_message(receiver, sel);
    if (receiver->dead && strcmp(sel, "release") != 0) {
        violation("%s sent to %s#%d after its release", sel, kind_names[receiver->k], receiver->id);
        return m_ignored;
    }
    if (!strcmp(sel, "retain"))
        return (imp)m_retain;
    if (!strcmp(sel, "release"))
        return (imp)m_release;
    for (size_t i = 0; i < sizeof methods / sizeof methods[0]; i++)
        if (methods[i].k == receiver->k && !strcmp(methods[i].sel, sel))
            return methods[i].fn;
    return (imp)m_unknown;
}

/* ------------------------------------------------------------------ C entry points */

static obj nsstring_class = {.k = K_CLASS_NSSTRING, .refs = 1 << 30};

/* Interned, as Apple's runtime does: one copy per name for the life of the process, kept
 * reachable from this list (lookup still compares by name). */
typedef struct selector_name {
    struct selector_name *next;
    char name[];
} selector_name;
static selector_name *selectors;

const char *sel_registerName(const char *name) {
    pthread_mutex_lock(&lock);
    selector_name *s = selectors;
    while (s && strcmp(s->name, name) != 0)
        s = s->next;
    if (!s) {
        const size_t len = strlen(name);
        s = malloc(sizeof *s + len + 1);
        if (!s)
            abort(); /* a test double out of memory has nothing sensible to report */
        memcpy(s->name, name, len + 1);
        s->next = selectors;
        selectors = s;
    }
    pthread_mutex_unlock(&lock);
    return s->name;
}

obj *objc_getClass(const char *name) {
    return strcmp(name, "NSString") == 0 ? &nsstring_class : NULL;
}

obj *MTLCreateSystemDefaultDevice(void) {
    if (getenv("METRALE_METAL_DOUBLE_NO_DEVICE"))
        return NULL;
    return make(K_DEVICE, sizeof(obj));
}
