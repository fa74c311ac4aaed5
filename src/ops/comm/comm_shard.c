/* comm_shard.c - mg_comm_shard (metrale/comm.h): a rank's piece of a weight matrix in host
 * memory, the column-parallel / row-parallel split that tensor-parallel layers use. */
#include <string.h>

#include "metrale/comm.h"

#include "error.h"

mg_status mg_comm_shard(const void *src, size_t rows, size_t row_bytes, mg_comm_shard_axis axis,
                        uint32_t parts, int rank, int ranks, void *dst) {
    if (!src || !dst)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_comm_shard: %s is NULL", src ? "dst" : "src");
    if (ranks < 1 || ranks > MG_COMM_MAX_RANKS)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_comm_shard: ranks %d outside 1..%d", ranks,
                        MG_COMM_MAX_RANKS);
    if (rank < 0 || rank >= ranks)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_comm_shard: rank %d outside 0..%d", rank,
                        ranks - 1);
    const size_t n = (size_t)ranks, r = (size_t)rank;
    const char *in = src;
    char *out = dst;
    if (axis == MG_COMM_SHARD_ROWS) {
        if (!parts || rows % parts || (rows / parts) % n)
            return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                            "mg_comm_shard: rows %zu do not make %u blocks that divide by %d ranks",
                            rows, parts, ranks);
        const size_t block = rows / parts, piece = block / n;
        /* in place, each piece moves to a lower address than it starts at, in order */
        for (size_t p = 0; p < parts; p++)
            memmove(out + p * piece * row_bytes, in + (p * block + r * piece) * row_bytes,
                    piece * row_bytes);
        return MG_OK;
    }
    if (axis != MG_COMM_SHARD_COLUMNS)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_comm_shard: axis %d", (int)axis);
    if (parts != 1)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT, "mg_comm_shard: parts %u: columns take 1", parts);
    if (row_bytes % n)
        return MG_ERROR(MG_ERR_INVALID_ARGUMENT,
                        "mg_comm_shard: row_bytes %zu do not divide by %d ranks", row_bytes, ranks);
    const size_t width = row_bytes / n;
    for (size_t i = 0; i < rows; i++)
        memmove(out + i * width, in + i * row_bytes + r * width, width);
    return MG_OK;
}
