/*
 * command_list.h - private: stream work recorded as a list of commands, for backends that
 * capture graphs by recording what a capturing stream is asked to do and replay the list
 * when the graph is launched (the CPU and Metal backends). The list knows the shape of each
 * command and how to make it independent of its caller; running a command is the backend's.
 * Names no op and no backend: kernels and events are the backend's opaque objects, reached
 * through the hooks below.
 */
#ifndef METRALE_COMMAND_LIST_H
#define METRALE_COMMAND_LIST_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "metrale/gpu.h"
#include "metrale/launch.h"

typedef enum mg_command_kind {
    MG_CMD_COPY_H2D,
    MG_CMD_COPY_D2H,
    MG_CMD_COPY_D2D,
    MG_CMD_COPY_2D,
    MG_CMD_MEMSET,
    MG_CMD_LAUNCH,
    MG_CMD_EVENT_RECORD,
    MG_CMD_WAIT_EVENT,
} mg_command_kind;

typedef struct mg_command {
    mg_command_kind kind;
    const char *call; /* the backend call that issued it, for messages (static storage) */
    mg_devptr dst, src;
    void *host_dst;
    const void *host_src;
    bool retained; /* h2d: the caller keeps host_src valid until the stream syncs */
    void *owned;   /* what the command owns: a snapshot of host_src or a launch copy */
    size_t bytes;  /* copies, memsets; the row width of a 2-D copy */
    size_t dst_pitch, src_pitch, height;
    uint8_t value;
    void *kernel; /* the backend's kernel object */
    const mg_launch *launch;
    void *event; /* the backend's event object */
} mg_command;

/* What the list needs of the backend's objects. A recorded event record or wait holds one
 * reference on its event (retained on recording, released with the command), so an event
 * destroyed while a graph still names it stays valid until the graph goes. */
typedef struct mg_command_hooks {
    void (*event_retain)(void *event);
    void (*event_release)(void *event);
    const char *(*kernel_name)(const void *kernel); /* "module:function", for messages */
} mg_command_hooks;

typedef struct mg_command_list {
    mg_command *items;
    size_t count, capacity;
} mg_command_list;

/* Makes `cmd` independent of its caller before it is stored: copies a pageable h2d source
 * (the caller may drop it on return) and the launch arguments, and takes the event
 * reference. On failure nothing is held and the message names cmd->call. */
mg_status mg_command_take_ownership(mg_command *cmd, const mg_command_hooks *hooks);
/* Frees what a stored command owns. */
void mg_command_release(mg_command *cmd, const mg_command_hooks *hooks);
/* `to` becomes an independent copy of the stored command `from` (a graph launched into a
 * capture records a copy of its nodes). */
mg_status mg_command_clone(const mg_command *from, mg_command *to, const mg_command_hooks *hooks);

/* Appends an owned command (the list takes it over); on failure the caller still owns it. */
mg_status mg_command_list_append(mg_command_list *list, const mg_command *cmd);
/* Takes ownership of `cmd` and appends it; on failure nothing is held. */
mg_status mg_command_list_record(mg_command_list *list, mg_command cmd,
                                 const mg_command_hooks *hooks);
/* Releases every command and empties the list. */
void mg_command_list_clear(mg_command_list *list, const mg_command_hooks *hooks);
/* True when `next` has the same nodes as `current` in the same order (kind and kernel), so
 * only parameters changed: what an in-place graph update accepts. */
bool mg_command_list_same_topology(const mg_command_list *current, const mg_command_list *next);
/* How many commands are kernel launches. */
size_t mg_command_list_launches(const mg_command_list *list);

#endif
