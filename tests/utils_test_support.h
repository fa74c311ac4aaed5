/*
 * utils_test_support.h - additions to test_util.h for the utility tests: CHECKF (a CHECK
 * with a formatted explanation) and running this test program again as a child process with
 * a chosen environment (for process-wide state cached once per process, like the switches).
 */
#ifndef METRALE_UTILS_TEST_SUPPORT_H
#define METRALE_UTILS_TEST_SUPPORT_H

#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "test_util.h"

extern char **environ;

/* CHECK with a formatted explanation, counted like test_util.h's CHECK. */
#define CHECKF(cond, ...)                                                                          \
    do {                                                                                           \
        test_checks++;                                                                             \
        if (!(cond)) {                                                                             \
            test_failures++;                                                                       \
            fprintf(stderr, "FAIL %s:%d: %s: ", __FILE__, __LINE__, #cond);                        \
            fprintf(stderr, __VA_ARGS__);                                                          \
            fputc('\n', stderr);                                                                   \
        }                                                                                          \
    } while (0)

/* Runs /proc/self/exe with `args` (NULL-terminated, argv[1..]) and an environment made of
 * the current one without any variable whose name starts with `drop_prefix`, plus `env_add`
 * ("NAME=value" strings, NULL-terminated; may be NULL). Returns the child's exit status, or
 * -1 when it could not run or died from a signal. */
static inline int test_run_self(const char *const *args, const char *drop_prefix,
                                const char *const *env_add) {
    size_t env_count = 0, add_count = 0, arg_count = 0;
    while (environ[env_count])
        env_count++;
    while (env_add && env_add[add_count])
        add_count++;
    while (args[arg_count])
        arg_count++;
    char **envp = calloc(env_count + add_count + 1, sizeof *envp);
    char **argv = calloc(arg_count + 2, sizeof *argv);
    if (!envp || !argv) {
        free(envp);
        free(argv);
        return -1;
    }
    size_t n = 0;
    size_t prefix_len = drop_prefix ? strlen(drop_prefix) : 0;
    for (size_t i = 0; i < env_count; i++)
        if (!prefix_len || strncmp(environ[i], drop_prefix, prefix_len) != 0)
            envp[n++] = environ[i];
    for (size_t i = 0; i < add_count; i++)
        envp[n++] = (char *)env_add[i];
    argv[0] = (char *)"/proc/self/exe";
    for (size_t i = 0; i < arg_count; i++)
        argv[i + 1] = (char *)args[i];
    fflush(NULL);
    pid_t pid = fork();
    if (pid == 0) {
        execve("/proc/self/exe", argv, envp);
        _exit(127);
    }
    free(envp);
    free(argv);
    if (pid < 0)
        return -1;
    int status = 0;
    if (waitpid(pid, &status, 0) != pid)
        return -1;
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

#endif
