/*
 * metrale/comm.h - communicators over several devices: all-reduce, all-gather,
 * reduce-scatter, broadcast and send/recv of device buffers, ordered on streams.
 *
 * A communicator is one rank of a group of `size` ranks, each rank one backend (one device).
 * On CUDA the collectives are NCCL's, loaded at first use with dlopen ("libnccl.so.2", or the
 * file named by env METRALE_NCCL_PATH, e.g. PyTorch's bundled copy); without it, creating a
 * communicator fails with MG_ERR_UNAVAILABLE and the loader's reason. On the CPU backend the
 * same calls run across CPU backends of one process (the reference the CUDA results are
 * checked against).
 *
 * Two ways to create the ranks:
 *
 *   // every rank in this process, e.g. both GPUs of a machine:
 *   mg_backend *b[2];  mg_backend_open(MG_BACKEND_CUDA, 0, &b[0]); ...(1, &b[1]);
 *   mg_comm *c[2];     mg_comm_create_local(b, 2, NULL, c);
 *
 *   // one rank per process: rank 0 makes an id and sends its bytes to the others
 *   mg_comm_id id;     if (rank == 0) mg_comm_get_id(MG_BACKEND_CUDA, &id);  ...share id...
 *   mg_comm *c;        mg_comm_create_rank(b, &id, size, rank, NULL, &c);
 *
 *   mg_comm_all_reduce(c, s, x, x, n, MG_DTYPE_BF16, MG_COMM_SUM);   // in place
 *   mg_comm_wait(c, s);   // waits for the stream, but never longer than the timeout
 *
 * One thread issuing calls for several ranks (as with create_local) wraps them in
 * mg_comm_group_begin / mg_comm_group_end, as NCCL requires: each rank's call returns before
 * its peers' calls are made. Without a group, a call of one rank may wait for its peers (the
 * CPU backend does; NCCL may too while connecting), so ranks driven without a group need a
 * thread each. On the CPU backend a collective runs when its stream executes it, so one thread
 * replaying graphs of several ranks puts the replays (mg_graph_launch) in a group too.
 *
 * What a caller may rely on:
 *  - Every argument is checked before anything is enqueued; a bad one is
 *    MG_ERR_INVALID_ARGUMENT naming it. All ranks must make the same calls in the same order
 *    with the same counts, dtype, op and root (mismatches are caught on the CPU backend, and
 *    undefined on NCCL, as there).
 *  - The collectives do not synchronize the host with the device: they may be captured into a
 *    graph (mg_graph_begin_capture on the stream of every rank) and replayed. On CUDA the first
 *    collective of a communicator may connect peers; make one call before capturing.
 *  - No call blocks forever. Creation waits at most the communicator's timeout for its peers;
 *    mg_comm_wait waits at most the timeout for the stream while watching the communicator's
 *    asynchronous error. When either runs out, or a peer failed, the communicator is aborted
 *    (its outstanding work is cancelled) and the call returns MG_ERR_DEVICE with the reason;
 *    every later call on it returns MG_ERR_DEVICE too. Only mg_comm_destroy remains.
 *  - Device buffers: send and recv of a collective may be the same buffer (in place) for
 *    all-reduce and broadcast, and for all-gather / reduce-scatter when the rank's slice of the
 *    larger buffer is the smaller one (NCCL's in-place rule); any other overlap is refused.
 */
#ifndef METRALE_COMM_H
#define METRALE_COMM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/dtype.h"
#include "metrale/export.h"
#include "metrale/gpu.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct mg_comm mg_comm; /* one rank of a communicator */

/* Ranks per communicator, at most. */
#define MG_COMM_MAX_RANKS 64

/* The rendezvous a process-spanning communicator is created from: plain bytes the caller
 * copies to every rank (a file, a socket, a pipe). */
#define MG_COMM_ID_BYTES 128
typedef struct mg_comm_id {
    uint8_t bytes[MG_COMM_ID_BYTES];
} mg_comm_id;

typedef struct mg_comm_options {
    /* How long creation and mg_comm_wait may wait for peers and the device, in milliseconds.
     * 0: env METRALE_COMM_TIMEOUT_MS when set, else 60000. */
    uint32_t timeout_ms;
} mg_comm_options;

typedef enum mg_comm_reduce {
    MG_COMM_SUM = 0,
    MG_COMM_MAX = 1,
} mg_comm_reduce;

/* "sum", "max"; "?" otherwise. */
MG_API const char *mg_comm_reduce_name(mg_comm_reduce op);

/* Whether communicators can be created for backends of `kind` here (CUDA: NCCL loads);
 * when not, `reason` (if not NULL) says why. Never sets mg_last_error. */
MG_API bool mg_comm_available(mg_backend_kind kind, char *reason, size_t reason_bytes);

/* A fresh id for mg_comm_create_rank. CUDA: NCCL's unique id (it names a listening socket of
 * this process, so make it in the process of rank 0). CPU: an id for ranks in this process
 * only (the CPU backend has no cross-process transport: ranks of another process time out). */
MG_API mg_status mg_comm_get_id(mg_backend_kind kind, mg_comm_id *out);

/* Creates rank `rank` of `size` on backend `b`, meeting the other ranks through `id`. Waits
 * (at most the timeout) until every rank has joined. One communicator rank per backend per
 * id. */
MG_API mg_status mg_comm_create_rank(mg_backend *b, const mg_comm_id *id, int size, int rank,
                                     const mg_comm_options *options, mg_comm **out);

/* Creates a communicator over `count` backends of this process, all of one kind, distinct
 * devices; comms_out[i] is rank i on backends[i]. On failure nothing is left created. */
MG_API mg_status mg_comm_create_local(mg_backend *const *backends, int count,
                                      const mg_comm_options *options, mg_comm **comms_out);

/* Releases the rank. Work it enqueued must be complete (mg_comm_wait), and graphs that
 * captured its calls must not be replayed again. After an abort (a timeout, a failed peer)
 * it releases what is left. NULL is a no-op. */
MG_API mg_status mg_comm_destroy(mg_comm *c);

/* Cancels the communicator's outstanding work and marks it failed (every later call returns
 * MG_ERR_DEVICE); for a caller that gives up on its peers. Its peers see an error or time
 * out. */
MG_API mg_status mg_comm_abort(mg_comm *c);

MG_API int mg_comm_rank(const mg_comm *c); /* -1 for NULL */
MG_API int mg_comm_size(const mg_comm *c); /* -1 for NULL */
MG_API mg_backend *mg_comm_backend(const mg_comm *c);

/* Whether `dtype` can be communicated (and reduced) on `c`: BF16, F16 and F32 always; FP8 E4M3
 * on the CPU backend, and on CUDA with NCCL 2.24 or newer on sm_90 or newer. */
MG_API bool mg_comm_supports_dtype(mg_comm *c, mg_dtype dtype);

/* ------------------------------------------------------------------ collectives
 * `count` is in elements (>= 1). Every rank passes the same count, dtype, op and root.
 * Dtypes: MG_DTYPE_BF16, MG_DTYPE_F16, MG_DTYPE_F32, MG_DTYPE_FP8_E4M3 (see
 * mg_comm_supports_dtype). Reductions round the exact sum (or max) of the ranks' values to the
 * dtype on the CPU backend; NCCL may round after each step (up to size - 1 roundings). */

/* recv[i] = op over ranks of send[i], i < count, on every rank. */
MG_API mg_status mg_comm_all_reduce(mg_comm *c, mg_stream *s, mg_devptr send, mg_devptr recv,
                                    size_t count, mg_dtype dtype, mg_comm_reduce op);
/* recv[r * send_count + i] = send of rank r [i]: recv holds size * send_count elements. */
MG_API mg_status mg_comm_all_gather(mg_comm *c, mg_stream *s, mg_devptr send, mg_devptr recv,
                                    size_t send_count, mg_dtype dtype);
/* recv[i] = op over ranks of send[rank * recv_count + i]: send holds size * recv_count. */
MG_API mg_status mg_comm_reduce_scatter(mg_comm *c, mg_stream *s, mg_devptr send, mg_devptr recv,
                                        size_t recv_count, mg_dtype dtype, mg_comm_reduce op);
/* recv[i] = send of rank `root` [i] on every rank; `send` is read on the root only (others
 * may pass 0). */
MG_API mg_status mg_comm_broadcast(mg_comm *c, mg_stream *s, mg_devptr send, mg_devptr recv,
                                   size_t count, mg_dtype dtype, int root);
/* Point to point: `count` elements from this rank's `send` to rank `peer`'s matching
 * mg_comm_recv. Two ranks that both send and receive put the pair in a group. */
MG_API mg_status mg_comm_send(mg_comm *c, mg_stream *s, mg_devptr send, size_t count,
                              mg_dtype dtype, int peer);
MG_API mg_status mg_comm_recv(mg_comm *c, mg_stream *s, mg_devptr recv, size_t count,
                              mg_dtype dtype, int peer);

/* Groups the calls of this thread between begin and end (they nest; the outermost end
 * issues them): NCCL's group semantics on CUDA; on the CPU backend the calls of a group
 * contribute without waiting and the end waits (at most the timeout) for all of them. */
MG_API mg_status mg_comm_group_begin(void);
MG_API mg_status mg_comm_group_end(void);

/* Waits until the work enqueued on `s` (NULL: the default stream of c's backend) is done,
 * polling the communicator's asynchronous error; on a peer's failure or after the timeout,
 * aborts the communicator and returns MG_ERR_DEVICE naming the cause. Not while `s` is
 * capturing (MG_ERR_CAPTURING), nor inside a group of this thread (MG_ERR_INVALID_ARGUMENT:
 * the group's calls are issued at its end). */
MG_API mg_status mg_comm_wait(mg_comm *c, mg_stream *s);

/* MG_OK while the communicator is healthy; MG_ERR_DEVICE with the reason once a peer or NCCL
 * reported an error, or after an abort. Never blocks. */
MG_API mg_status mg_comm_check(mg_comm *c);

/* ------------------------------------------------------------------ tensor-parallel shards
 * The column-parallel / row-parallel split of a weight matrix over the ranks of a communicator,
 * in host memory.
 * `src` is row-major [rows, row_bytes] (row_bytes: a row's bytes, whatever the element).
 *
 *   MG_COMM_SHARD_ROWS: the rows are `parts` stacked blocks of rows / parts rows each (e.g. 2
 *     for a gate_up matrix, gate rows then up rows; 1 for a plain one), each block cut into
 *     `ranks` equal pieces; dst = piece `rank` of block 0, then of block 1, ...:
 *     [rows / ranks, row_bytes] (column-parallel: this rank's output features).
 *   MG_COMM_SHARD_COLUMNS: every row cut into `ranks` equal pieces of row_bytes / ranks bytes;
 *     dst = piece `rank` of each row: [rows, row_bytes / ranks] (row-parallel: this rank's
 *     input features). `parts` must be 1.
 *
 * dst may be src (the shard moves to the front of the buffer); other overlaps are undefined.
 * MG_ERR_INVALID_ARGUMENT naming the argument when ranks is not 1..MG_COMM_MAX_RANKS, rank is
 * outside it, or the rows (rows / parts) or row_bytes do not divide as the axis needs. */
typedef enum mg_comm_shard_axis {
    MG_COMM_SHARD_ROWS = 0,
    MG_COMM_SHARD_COLUMNS = 1,
} mg_comm_shard_axis;

MG_API mg_status mg_comm_shard(const void *src, size_t rows, size_t row_bytes,
                               mg_comm_shard_axis axis, uint32_t parts, int rank, int ranks,
                               void *dst);

#ifdef __cplusplus
}
#endif
#endif
