/* Device profiles (include/pensieve/profile.h): one INI section per device,
 * read strictly (pvcore/ini.h) and merged into the file on save. */
#include <pensieve/profile.h>

#include "pvcore/ini.h"

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <sys/stat.h>
#include <unistd.h>

pv_status pv_profile_default_path(char *buf, size_t size)
{
    if (!buf || size == 0)
        return pv_error(PV_ERR_INVALID_ARG, "pv_profile_default_path: no buffer");
    const char *set = getenv("PV_PROFILE"), *xdg = getenv("XDG_CONFIG_HOME"), *home = getenv("HOME");
    int n;
    if (set && *set)
        n = snprintf(buf, size, "%s", set);
    else if (xdg && *xdg)
        n = snprintf(buf, size, "%s/pensieve/profiles.ini", xdg);
    else if (home && *home)
        n = snprintf(buf, size, "%s/.config/pensieve/profiles.ini", home);
    else
        return pv_error(PV_ERR_NOT_FOUND, "no default profile path: PV_PROFILE, XDG_CONFIG_HOME and HOME are unset");
    if (n < 0 || (size_t)n >= size)
        return pv_error(PV_ERR_INVALID_ARG, "the default profile path is longer than %zu bytes", size - 1);
    return PV_OK;
}

void pv_profile_section_name(const char *backend, const char *device, char *buf, size_t size)
{
    snprintf(buf, size, "%s: %s", backend ? backend : "", device ? device : "");
    for (char *c = buf; *c; c++)
        if (*c == '[' || *c == ']' || *c == ';' || *c == '#' || (unsigned char)*c < 0x20 || *c == 0x7f)
            *c = '_';
    /* the reader trims a section name: so must the writer */
    size_t n = strlen(buf);
    while (n && (buf[n - 1] == ' ' || buf[n - 1] == '\t'))
        buf[--n] = '\0';
}

/* ---- reading -------------------------------------------------------------------- */

static const char *const profile_keys[] = {"alpha", "beta", "c", "r2", "heldout_error", "chunk_tokens",
                                           "points", "shape", "date", "version"};
#define N_PROFILE_KEYS (sizeof profile_keys / sizeof profile_keys[0])

/* The walk over a file: every section is checked; the wanted one (if any)
 * is filled in. For saving, the byte ranges of the wanted section. */
typedef struct profile_read {
    const char *path;
    const char *want;      /* section name sought, or NULL */
    pv_profile *out;       /* filled when the wanted section is seen */
    int in_wanted, found;
    unsigned seen_on[N_PROFILE_KEYS];
    unsigned section_line;
    size_t first_section;  /* offset of the first section header (SIZE_MAX: none) */
    size_t wanted_begin, wanted_end; /* the wanted section's bytes */
    char sections[512];    /* names seen, for "not found" */
    pv_profile scratch;    /* where other sections' values go, to be checked */
} profile_read;

static int parse_number(const char *text, double lo, double hi, double *out)
{
    char *end;
    errno = 0;
    double v = strtod(text, &end);
    if (end == text || *end != '\0' || errno == ERANGE || !isfinite(v) || v < lo || v > hi)
        return 0;
    *out = v;
    return 1;
}

/* "context:seconds:spread" items separated by spaces. */
static int parse_points(char *text, pv_profile *p)
{
    p->n_points = 0;
    char *save = NULL;
    for (char *item = strtok_r(text, " \t", &save); item; item = strtok_r(NULL, " \t", &save)) {
        if (p->n_points == PV_PROFILE_MAX_POINTS)
            return 0;
        char *c1 = strchr(item, ':'), *c2 = c1 ? strchr(c1 + 1, ':') : NULL;
        if (!c2)
            return 0;
        *c1 = *c2 = '\0';
        pv_cost_point *pt = &p->points[p->n_points++];
        if (!parse_number(item, 0, 1e12, &pt->context) || !parse_number(c1 + 1, 1e-15, 1e6, &pt->seconds) ||
            !parse_number(c2 + 1, 0, 1e6, &pt->spread))
            return 0;
    }
    return p->n_points > 0;
}

static pv_status section_end(profile_read *rd, size_t offset)
{
    if (rd->in_wanted)
        rd->wanted_end = offset;
    if (!rd->section_line)
        return PV_OK;
    static const int required[] = {0, 1, 2, 5}; /* alpha, beta, c, chunk_tokens */
    for (size_t i = 0; i < sizeof required / sizeof required[0]; i++)
        if (!rd->seen_on[required[i]])
            return pv_error(PV_ERR_FORMAT, "%s:%u: section lacks key %s", rd->path, rd->section_line,
                            profile_keys[required[i]]);
    return PV_OK;
}

static pv_status on_section(void *ctx, unsigned line, size_t offset, const char *name)
{
    profile_read *rd = ctx;
    pv_status st = section_end(rd, offset);
    if (st != PV_OK)
        return st;
    if (rd->first_section == SIZE_MAX)
        rd->first_section = offset;
    if (!strchr(name, ':'))
        return pv_error(PV_ERR_FORMAT, "%s:%u: section [%.64s] is not \"backend: device\"", rd->path, line, name);
    size_t used = strlen(rd->sections);
    snprintf(rd->sections + used, sizeof rd->sections - used, "%s[%.60s]", used ? ", " : "", name);
    rd->section_line = line;
    memset(rd->seen_on, 0, sizeof rd->seen_on);
    rd->in_wanted = rd->want && strcmp(name, rd->want) == 0;
    if (rd->in_wanted) {
        if (rd->found)
            return pv_error(PV_ERR_FORMAT, "%s:%u: section [%.64s] appears twice", rd->path, line, name);
        rd->found = 1;
        rd->wanted_begin = offset;
    }
    pv_profile *p = rd->in_wanted && rd->out ? rd->out : &rd->scratch;
    memset(p, 0, sizeof *p);
    p->heldout_error = -1;
    const char *colon = strchr(name, ':');
    snprintf(p->backend, sizeof p->backend, "%.*s", (int)(colon - name), name);
    const char *dev = colon + 1;
    while (*dev == ' ')
        dev++;
    snprintf(p->device, sizeof p->device, "%s", dev);
    return PV_OK;
}

#define KERNEL_PREFIX "kernel."

/* The form of kernel.<bucket> = <params> (pvcore knows no backend, so not
 * what they mean): 1 bucket wrong, 2 params wrong, 0 good. */
static int kernel_entry_form(const char *bucket, const char *params)
{
    const size_t len = strlen(bucket);
    if (!len || len >= sizeof ((pv_profile *)0)->kernels[0].bucket ||
        strspn(bucket, "abcdefghijklmnopqrstuvwxyz0123456789.") != len)
        return 1;
    if (strlen(params) >= sizeof ((pv_profile *)0)->kernels[0].params ||
        strspn(params, "ABCDEFGHIJKLMNOPQRSTUVWXYZ0123456789_= ") != strlen(params) || !strchr(params, '='))
        return 2;
    return 0;
}

static pv_status on_kernel_key(profile_read *rd, pv_profile *p, unsigned line, const char *section,
                               const char *key, const char *val)
{
    const char *bucket = key + strlen(KERNEL_PREFIX);
    const int wrong = kernel_entry_form(bucket, val);
    if (wrong == 1)
        return pv_error(PV_ERR_FORMAT, "%s:%u: key [%.64s] %.80s: the bucket is not lower-case words and dots "
                        "under %zu characters",
                        rd->path, line, section, key, sizeof p->kernels[0].bucket);
    if (wrong == 2)
        return pv_error(PV_ERR_FORMAT, "%s:%u: key [%.64s] %.80s = \"%.64s\" is not NAME=VALUE pairs under %zu "
                        "characters",
                        rd->path, line, section, key, val, sizeof p->kernels[0].params);
    for (uint32_t i = 0; i < p->n_kernels; i++)
        if (strcmp(p->kernels[i].bucket, bucket) == 0)
            return pv_error(PV_ERR_FORMAT, "%s:%u: key [%.64s] %.80s is set again (first on line %u)", rd->path,
                            line, section, key, p->kernels[i].line);
    if (p->n_kernels == PV_PROFILE_MAX_KERNELS)
        return pv_error(PV_ERR_FORMAT, "%s:%u: key [%.64s] %.80s: more than %d kernel.* keys", rd->path, line,
                        section, key, PV_PROFILE_MAX_KERNELS);
    struct pv_profile_kernel *k = &p->kernels[p->n_kernels++];
    snprintf(k->bucket, sizeof k->bucket, "%s", bucket);
    snprintf(k->params, sizeof k->params, "%s", val);
    k->line = line;
    return PV_OK;
}

static pv_status on_key(void *ctx, unsigned line, const char *section, const char *key, const char *val)
{
    profile_read *rd = ctx;
    pv_profile *p = rd->in_wanted && rd->out ? rd->out : &rd->scratch;
    if (strncmp(key, KERNEL_PREFIX, strlen(KERNEL_PREFIX)) == 0)
        return on_kernel_key(rd, p, line, section, key, val);
    size_t k = 0;
    while (k < N_PROFILE_KEYS && strcasecmp(key, profile_keys[k]) != 0)
        k++;
    if (k == N_PROFILE_KEYS)
        return pv_error(PV_ERR_FORMAT,
                        "%s:%u: unknown key [%.64s] %.64s (known: alpha, beta, c, r2, heldout_error, "
                        "chunk_tokens, points, shape, date, version, kernel.<bucket>)",
                        rd->path, line, section, key);
    if (rd->seen_on[k])
        return pv_error(PV_ERR_FORMAT, "%s:%u: key [%.64s] %s is set again (first on line %u)", rd->path, line,
                        section, profile_keys[k], rd->seen_on[k]);
    rd->seen_on[k] = line;
    double d = 0;
    int good = 1;
    char copy[4096]; /* points: 32 items of some 25 characters */
    switch (k) {
    case 0: good = parse_number(val, 0, 1e6, &p->alpha); break;
    case 1: good = parse_number(val, 0, 1e6, &p->beta); break;
    case 2: good = parse_number(val, 0, 1e6, &p->c); break;
    case 3: good = parse_number(val, -1e6, 1, &p->r2); break;
    case 4: good = parse_number(val, 0, 1e6, &p->heldout_error); break;
    case 5:
        good = parse_number(val, 1, 4096, &d) && d == floor(d);
        p->chunk_tokens = (uint32_t)d;
        break;
    case 6:
        good = strlen(val) < sizeof copy;
        if (good) {
            memcpy(copy, val, strlen(val) + 1);
            good = parse_points(copy, p);
        }
        break;
    case 7: good = snprintf(p->shape, sizeof p->shape, "%s", val) < (int)sizeof p->shape; break;
    case 8: good = snprintf(p->date, sizeof p->date, "%s", val) < (int)sizeof p->date; break;
    default: good = snprintf(p->version, sizeof p->version, "%s", val) < (int)sizeof p->version; break;
    }
    if (!good)
        return pv_error(PV_ERR_FORMAT, "%s:%u: key [%.64s] %s = \"%.64s\" is not %s", rd->path, line, section,
                        profile_keys[k], val,
                        k <= 4   ? "a number in range (alpha, beta, c, heldout_error >= 0; r2 <= 1)"
                        : k == 5 ? "an integer in [1, 4096]"
                        : k == 6 ? "a list of up to 32 context:seconds:spread items"
                                 : "short enough");
    return PV_OK;
}

/* Reads and checks the whole file; rd->want's section goes to rd->out. */
static pv_status read_profiles(const char *path, profile_read *rd, char **text_out, size_t *size_out)
{
    size_t size = 0;
    pv_status st = PV_OK;
    char *text = pv_ini_read_file(path, "profile file", &size, &st);
    if (!text)
        return st;
    /* the parser writes NULs into its copy; the saver needs the bytes as they were */
    char *work = malloc(size + 1);
    if (!work) {
        free(text);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "%s: no memory to parse the profile file", path);
    }
    memcpy(work, text, size + 1);
    rd->path = path;
    rd->first_section = SIZE_MAX;
    static const pv_ini_handler handler = {.section = on_section, .key = on_key};
    st = pv_ini_parse(path, work, size, &handler, rd);
    if (st == PV_OK)
        st = section_end(rd, size);
    free(work);
    if (st != PV_OK || !text_out) {
        free(text);
        return st;
    }
    *text_out = text;
    *size_out = size;
    return PV_OK;
}

pv_status pv_profile_load(const char *path, const char *backend, const char *device, pv_profile *out)
{
    if (!path || !backend || !device || !out)
        return pv_error(PV_ERR_INVALID_ARG, "pv_profile_load: path, backend, device and out must not be NULL");
    char name[192];
    pv_profile_section_name(backend, device, name, sizeof name);
    profile_read *rd = calloc(1, sizeof *rd);
    if (!rd)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_profile_load: no memory");
    pv_profile p;
    rd->want = name;
    rd->out = &p;
    pv_status st = read_profiles(path, rd, NULL, NULL);
    if (st == PV_OK && !rd->found)
        st = pv_error(PV_ERR_NOT_FOUND, "%s: no profile for [%s] (sections: %s)", path, name,
                      rd->sections[0] ? rd->sections : "none");
    if (st == PV_OK)
        *out = p;
    free(rd);
    return st;
}

/* ---- writing -------------------------------------------------------------------- */

static int write_section(FILE *f, const char *name, const pv_profile *p)
{
    fprintf(f, "[%s]\n", name);
    fprintf(f, "alpha = %.9g\nbeta = %.9g\nc = %.9g\nr2 = %.6f\n", p->alpha, p->beta, p->c, p->r2);
    if (p->heldout_error >= 0)
        fprintf(f, "heldout_error = %.4f\n", p->heldout_error);
    fprintf(f, "chunk_tokens = %u\n", p->chunk_tokens);
    if (p->n_points) {
        fputs("points =", f);
        for (uint32_t i = 0; i < p->n_points; i++)
            fprintf(f, " %.0f:%.6g:%.3g", p->points[i].context, p->points[i].seconds, p->points[i].spread);
        fputc('\n', f);
    }
    if (p->shape[0])
        fprintf(f, "shape = %s\n", p->shape);
    if (p->date[0])
        fprintf(f, "date = %s\n", p->date);
    if (p->version[0])
        fprintf(f, "version = %s\n", p->version);
    for (uint32_t i = 0; i < p->n_kernels; i++)
        fprintf(f, KERNEL_PREFIX "%s = %s\n", p->kernels[i].bucket, p->kernels[i].params);
    return ferror(f) ? -1 : 0;
}

/* mkdir -p of path's directory. */
static pv_status make_parent(const char *path)
{
    char dir[4096];
    if (snprintf(dir, sizeof dir, "%s", path) >= (int)sizeof dir)
        return pv_error(PV_ERR_INVALID_ARG, "%.64s...: profile path longer than %zu bytes", path, sizeof dir - 1);
    char *slash = strrchr(dir, '/');
    if (!slash || slash == dir)
        return PV_OK;
    *slash = '\0';
    for (char *c = dir + 1; *c; c++) {
        if (*c != '/')
            continue;
        *c = '\0';
        if (mkdir(dir, 0755) != 0 && errno != EEXIST)
            return pv_error(PV_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
        *c = '/';
    }
    if (mkdir(dir, 0755) != 0 && errno != EEXIST)
        return pv_error(PV_ERR_IO, "%s: cannot create directory: %s", dir, strerror(errno));
    return PV_OK;
}

static pv_status check_profile(const pv_profile *p)
{
    if (!p->backend[0] || !p->device[0])
        return pv_error(PV_ERR_INVALID_ARG, "pv_profile_save: the profile names no backend or device");
    if (!(isfinite(p->alpha) && p->alpha >= 0 && isfinite(p->beta) && p->beta >= 0 && isfinite(p->c) &&
          p->c >= 0 && p->beta + p->c > 0))
        return pv_error(PV_ERR_INVALID_ARG,
                        "pv_profile_save: alpha %g, beta %g, c %g must be finite, >= 0, beta + c > 0", p->alpha,
                        p->beta, p->c);
    if (p->chunk_tokens < 1 || p->chunk_tokens > 4096)
        return pv_error(PV_ERR_INVALID_ARG, "pv_profile_save: chunk_tokens %u out of range [1, 4096]",
                        p->chunk_tokens);
    if (p->n_points > PV_PROFILE_MAX_POINTS)
        return pv_error(PV_ERR_INVALID_ARG, "pv_profile_save: %u points, more than %d", p->n_points,
                        PV_PROFILE_MAX_POINTS);
    if (p->n_kernels > PV_PROFILE_MAX_KERNELS)
        return pv_error(PV_ERR_INVALID_ARG, "pv_profile_save: %u kernel sets, more than %d", p->n_kernels,
                        PV_PROFILE_MAX_KERNELS);
    for (uint32_t i = 0; i < p->n_kernels; i++)
        if (kernel_entry_form(p->kernels[i].bucket, p->kernels[i].params))
            return pv_error(PV_ERR_INVALID_ARG, "pv_profile_save: kernel set %u (\"%.48s\" = \"%.96s\") is not a "
                            "bucket and NAME=VALUE pairs",
                            i, p->kernels[i].bucket, p->kernels[i].params);
    return PV_OK;
}

pv_status pv_profile_save(const char *path, const pv_profile *p)
{
    if (!path || !p)
        return pv_error(PV_ERR_INVALID_ARG, "pv_profile_save: path and profile must not be NULL");
    pv_status st = check_profile(p);
    if (st != PV_OK)
        return st;
    char name[192];
    pv_profile_section_name(p->backend, p->device, name, sizeof name);

    /* What stays: the existing file, whole but for this device's section. */
    char *old = NULL;
    size_t old_size = 0;
    profile_read *rd = calloc(1, sizeof *rd);
    if (!rd)
        return pv_error(PV_ERR_OUT_OF_MEMORY, "pv_profile_save: no memory");
    rd->want = name;
    if (access(path, F_OK) == 0) {
        st = read_profiles(path, rd, &old, &old_size);
        if (st != PV_OK) {
            free(rd);
            return st;
        }
    } else if ((st = make_parent(path)) != PV_OK) {
        free(rd);
        return st;
    }

    char tmp[4096 + 32];
    snprintf(tmp, sizeof tmp, "%s.tmp.%ld", path, (long)getpid());
    FILE *f = fopen(tmp, "w");
    if (!f) {
        st = pv_error(PV_ERR_IO, "%s: cannot write: %s", tmp, strerror(errno));
        free(old);
        free(rd);
        return st;
    }
    int bad = 0;
    if (!old) {
        fputs("; Device profiles written by pensieve-tune: the eviction cost model per\n"
              "; backend and device (include/pensieve/profile.h).\n\n",
              f);
        bad = write_section(f, name, p);
    } else if (rd->found) {
        fwrite(old, 1, rd->wanted_begin, f);
        bad = write_section(f, name, p);
        if (rd->wanted_end < old_size) {
            fputc('\n', f);
            fwrite(old + rd->wanted_end, 1, old_size - rd->wanted_end, f);
        }
    } else {
        fwrite(old, 1, old_size, f);
        if (old_size && old[old_size - 1] != '\n')
            fputc('\n', f);
        fputc('\n', f);
        bad = write_section(f, name, p);
    }
    bad = fclose(f) != 0 || bad;
    free(old);
    free(rd);
    if (bad || rename(tmp, path) != 0) {
        st = pv_error(PV_ERR_IO, "%s: cannot write the profile file: %s", bad ? tmp : path, strerror(errno));
        unlink(tmp);
        return st;
    }
    return PV_OK;
}

pv_status pv_profile_apply(const pv_profile *p, pv_cache_config *cfg)
{
    if (!p || !cfg)
        return pv_error(PV_ERR_INVALID_ARG, "pv_profile_apply: profile and config must not be NULL");
    if (p->chunk_tokens < 1)
        return pv_error(PV_ERR_INVALID_ARG, "pv_profile_apply: the profile's chunk_tokens is 0");
    const double scale = (double)cfg->chunk_tokens / (double)p->chunk_tokens;
    cfg->alpha = p->alpha * scale;
    cfg->beta = p->beta * scale;
    cfg->c = p->c * scale;
    if (!(isfinite(cfg->alpha) && isfinite(cfg->beta) && isfinite(cfg->c) && cfg->beta + cfg->c > 0))
        return pv_error(PV_ERR_INVALID_ARG, "pv_profile_apply: alpha %g, beta %g, c %g are not usable costs",
                        cfg->alpha, cfg->beta, cfg->c);
    return PV_OK;
}
