/* pensieve-generate driven from outside with bad input: empty numbers, a
 * directory as the model, --top1 with a large -n, an architecture string
 * holding NUL and control bytes; and the stats line on a line of its own
 * when stdout and stderr share one file. Runs the built program on the
 * synthetic model in a temporary directory. */
#include <pensieve/gguf.h>

#include "tap.h"

#include <fcntl.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define PROGRAM "apps/pensieve-generate"

static char dir[64], model[128], bad_arch[128], out_path[128], err_path[128];
static char out[1 << 16], err[1 << 16];
static size_t err_len;

static size_t slurp(const char *path, char *buf, size_t cap)
{
    FILE *f = fopen(path, "rb");
    size_t n = f ? fread(buf, 1, cap - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    return n;
}

/* Run the program with NULL-terminated arguments; stdout and stderr go to
 * separate files, or both to the first with `shared`. The exit status. */
static int run(int shared, ...)
{
    const char *argv[32] = {PROGRAM};
    int argc = 1;
    va_list ap;
    va_start(ap, shared);
    while (argc < 31 && (argv[argc] = va_arg(ap, const char *)) != NULL)
        argc++;
    va_end(ap);
    argv[argc] = NULL;
    fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        int o = open(out_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        int e = shared ? o : open(err_path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
        if (o < 0 || e < 0 || dup2(o, 1) < 0 || dup2(e, 2) < 0)
            _exit(126);
        execv(PROGRAM, (char *const *)argv);
        _exit(127);
    }
    int status = -1;
    if (pid < 0 || waitpid(pid, &status, 0) != pid)
        return -1;
    slurp(out_path, out, sizeof out);
    err_len = shared ? 0 : slurp(err_path, err, sizeof err);
    if (shared)
        err[0] = '\0';
    return WIFEXITED(status) ? WEXITSTATUS(status) : -1;
}

/* The synthetic model with general.architecture "llama" overwritten by
 * five other bytes. */
static int write_bad_arch(const char *arch5)
{
    pv_synth_config c;
    pv_synth_config_default(&c);
    uint8_t *img;
    uint64_t size;
    if (pv_synth_to_memory(&c, &img, &size) != PV_OK)
        return 0;
    static const char key[] = "general.architecture";
    int patched = 0;
    for (uint64_t i = 0; !patched && i + sizeof key + 16 < size; i++) {
        if (memcmp(img + i, key, sizeof key - 1) == 0 && img[i + sizeof key - 1] == 8 &&
            img[i + sizeof key - 1 + 4] == 5 && memcmp(img + i + sizeof key - 1 + 12, "llama", 5) == 0) {
            memcpy(img + i + sizeof key - 1 + 12, arch5, 5);
            patched = 1;
        }
    }
    FILE *f = fopen(bad_arch, "wb");
    int good = patched && f && fwrite(img, 1, size, f) == size;
    if (f)
        good = fclose(f) == 0 && good;
    free(img);
    return good;
}

/* On failure, show what the program printed, one diagnostic line each. */
static int check(int cond, const char *what, int rc)
{
    ok(cond, "%s (exit %d)", what, rc);
    for (const char *part = out; !cond && part; part = part == out ? err : NULL) {
        static char copy[sizeof out];
        char *save = NULL;
        memcpy(copy, part, sizeof copy);
        for (char *line = strtok_r(copy, "\n", &save); line; line = strtok_r(NULL, "\n", &save))
            tap_diag("%s: %s", part == out ? "stdout" : "stderr", line);
    }
    return cond;
}

/* Whether the text holds a control byte other than a newline. */
static int has_control(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (((unsigned char)s[i] < 0x20 && s[i] != '\n') || s[i] == 0x7f)
            return 1;
    return 0;
}

int main(void)
{
    if (access(PROGRAM, X_OK) != 0)
        return tap_skip_all(PROGRAM " is not built");
    snprintf(dir, sizeof dir, "/tmp/pv-generate-XXXXXX");
    if (!mkdtemp(dir)) {
        ok(0, "temporary directory");
        return tap_done();
    }
    snprintf(model, sizeof model, "%s/synth.gguf", dir);
    snprintf(bad_arch, sizeof bad_arch, "%s/bad-arch.gguf", dir);
    snprintf(out_path, sizeof out_path, "%s/stdout", dir);
    snprintf(err_path, sizeof err_path, "%s/stderr", dir);
    pv_synth_config c;
    pv_synth_config_default(&c);
    if (!ok(pv_synth_write(&c, model) == PV_OK, "synthetic model written to %s", model))
        return tap_done();

    int rc = run(0, "--model", model, "--prompt", "hello", "-n", "", NULL);
    check(rc == 2 && strstr(err, "-n ''"), "-n '' is refused", rc);
    rc = run(0, "--model", model, "--prompt", "hello", "--seed", "", NULL);
    check(rc == 2 && strstr(err, "--seed ''"), "--seed '' is refused", rc);
    rc = run(0, "--model", model, "--prompt", "hello", "--ctx", " 64", NULL);
    check(rc == 2 && strstr(err, "--ctx ' 64'"), "--ctx ' 64' is refused", rc);
    rc = run(0, "--model", model, "--prompt", "hello", "--temperature", "", NULL);
    check(rc == 2 && strstr(err, "--temperature ''"), "--temperature '' is refused", rc);

    rc = run(0, "--model", dir, "--prompt", "hello", NULL);
    check(rc == 1 && strstr(err, "is a directory") && !strstr(err, "No such device"),
          "a directory as --model: 'is a directory'", rc);

    rc = run(0, "--model", model, "--prompt", "hello world", "--top1", "-n", "300", "--ctx", "64",
             NULL);
    check(rc == 0 && strstr(out, "top1:"), "--top1 with -n 300 over --ctx 64 runs", rc);

    rc = run(1, "--model", model, "--prompt", "hello", "-n", "4", NULL);
    const char *stats = strstr(out, "prompt ");
    check(rc == 0 && stats && (stats == out || stats[-1] == '\n') && strstr(stats, "tokens/s"),
          "stdout and stderr in one file: the stats line starts a line", rc);

    if (ok(write_bad_arch("ll\0\x1b\x07"), "model with architecture 'll\\0\\x1b\\x07' written")) {
        rc = run(0, "--model", bad_arch, "--prompt", "hello", NULL);
        check(rc == 1 && strstr(err, "'ll\\0\\x1b\\x07'") && !has_control(err, err_len),
              "its architecture is shown escaped: 'll\\0\\x1b\\x07'", rc);
    }
    unlink(model);
    unlink(bad_arch);
    unlink(out_path);
    unlink(err_path);
    rmdir(dir);
    return tap_done();
}
