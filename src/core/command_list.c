/* command_list.c - recorded stream work (command_list.h). */
#include "command_list.h"

#include <stdlib.h>
#include <string.h>

#include "error.h"

void mg_command_release(mg_command *cmd, const mg_command_hooks *hooks) {
    free(cmd->owned);
    cmd->owned = NULL;
    if (cmd->event)
        hooks->event_release(cmd->event);
    cmd->event = NULL;
}

mg_status mg_command_take_ownership(mg_command *cmd, const mg_command_hooks *hooks) {
    if (cmd->kind == MG_CMD_COPY_H2D && !cmd->retained && cmd->bytes) {
        void *copy = malloc(cmd->bytes);
        if (!copy)
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY,
                            "%s: out of host memory staging %zu bytes for the capture", cmd->call,
                            cmd->bytes);
        memcpy(copy, cmd->host_src, cmd->bytes);
        cmd->owned = copy;
        cmd->host_src = copy;
    } else if (cmd->kind == MG_CMD_LAUNCH) {
        mg_launch *copy = malloc(sizeof *copy);
        if (!copy)
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory recording a launch of %s",
                            cmd->call, hooks->kernel_name(cmd->kernel));
        memcpy(copy, cmd->launch, sizeof *copy);
        cmd->owned = copy;
        cmd->launch = copy;
    }
    if (cmd->event)
        hooks->event_retain(cmd->event);
    return MG_OK;
}

mg_status mg_command_clone(const mg_command *from, mg_command *to, const mg_command_hooks *hooks) {
    *to = *from; /* host_src and launch point at `from`'s own copies: copied again here */
    to->owned = NULL;
    return mg_command_take_ownership(to, hooks);
}

mg_status mg_command_list_append(mg_command_list *list, const mg_command *cmd) {
    if (list->count == list->capacity) {
        size_t cap = list->capacity ? list->capacity * 2 : 16;
        mg_command *grown = realloc(list->items, cap * sizeof *grown);
        if (!grown)
            return MG_ERROR(MG_ERR_OUT_OF_MEMORY, "%s: out of host memory recording node %zu",
                            cmd->call, list->count);
        list->items = grown;
        list->capacity = cap;
    }
    list->items[list->count++] = *cmd;
    return MG_OK;
}

mg_status mg_command_list_record(mg_command_list *list, mg_command cmd,
                                 const mg_command_hooks *hooks) {
    mg_status st = mg_command_take_ownership(&cmd, hooks);
    if (!st && (st = mg_command_list_append(list, &cmd)))
        mg_command_release(&cmd, hooks);
    return st;
}

void mg_command_list_clear(mg_command_list *list, const mg_command_hooks *hooks) {
    for (size_t i = 0; i < list->count; i++)
        mg_command_release(&list->items[i], hooks);
    free(list->items);
    *list = (mg_command_list){0};
}

bool mg_command_list_same_topology(const mg_command_list *current, const mg_command_list *next) {
    if (current->count != next->count)
        return false;
    for (size_t i = 0; i < current->count; i++) {
        const mg_command *a = &current->items[i], *b = &next->items[i];
        if (a->kind != b->kind || a->kernel != b->kernel)
            return false;
    }
    return true;
}

size_t mg_command_list_launches(const mg_command_list *list) {
    size_t launches = 0;
    for (size_t i = 0; i < list->count; i++)
        launches += list->items[i].kind == MG_CMD_LAUNCH;
    return launches;
}
