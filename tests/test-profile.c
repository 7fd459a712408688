/* The cost model's fit and the device profile file: the fit recovers known
 * constants from noisy measurements; profiles round-trip, merge into a
 * file without touching other devices' sections, and a corrupt file is an
 * error naming file, line and key (and is never overwritten). */
#include "tap.h"

#include <pensieve/profile.h>

#include <math.h>
#include <stdint.h>
#include <string.h>
#include <unistd.h>

static double uniform(uint64_t *s)
{
    *s = *s * 6364136223846793005ull + 1442695040888963407ull;
    return (double)(*s >> 11) / 9007199254740992.0;
}

/* Measurements of alpha l + beta at 32 .. 16384, each off by up to +-noise
 * (relative), as timings are. */
static size_t noisy_points(double alpha, double beta, double noise, uint64_t *rng, pv_cost_point *pts)
{
    size_t n = 0;
    for (double l = 32; l <= 16384; l *= 2, n++)
        pts[n] = (pv_cost_point){l, (alpha * l + beta) * (1 + noise * (2 * uniform(rng) - 1)), noise};
    return n;
}

static void check_fit(void)
{
    pv_cost_point pts[PV_PROFILE_MAX_POINTS];
    pv_cost_fit f;
    /* exact data: exact constants */
    uint64_t rng = 1;
    size_t n = noisy_points(2e-8, 3e-5, 0, &rng, pts);
    pv_status st = pv_cost_fit_linear(pts, n, &f);
    ok(st == PV_OK && fabs(f.alpha / 2e-8 - 1) < 1e-9 &&
           fabs(f.beta / 3e-5 - 1) < 1e-9 && f.r2 > 1 - 1e-12,
       "exact points: alpha %g beta %g r2 %.12f", f.alpha, f.beta, f.r2);
    /* +-2% noise on every point (medians of repeats here spread about that
     * much), 200 draws: both constants within 5% every time, for lines whose
     * terms cross at contexts 40, 1500 and 10000. (At +-3% the worst draw
     * misses the smaller term by 6-7%; a constant whose term stays under
     * the noise everywhere, as beta at 1e-6 s beside 5e-7 s per token, is
     * not measurable by any fit.) */
    const double cases[][2] = {{2e-8, 3e-5}, {1e-8, 1e-4}, {5e-7, 2e-5}};
    for (size_t c = 0; c < sizeof cases / sizeof cases[0]; c++) {
        double worst_a = 0, worst_b = 0, worst_r2 = 1;
        for (int draw = 0; draw < 200; draw++) {
            n = noisy_points(cases[c][0], cases[c][1], 0.02, &rng, pts);
            if (pv_cost_fit_linear(pts, n, &f) != PV_OK) {
                worst_a = INFINITY;
                break;
            }
            worst_a = fmax(worst_a, fabs(f.alpha / cases[c][0] - 1));
            worst_b = fmax(worst_b, fabs(f.beta / cases[c][1] - 1));
            worst_r2 = fmin(worst_r2, f.r2);
        }
        ok(worst_a <= 0.05 && worst_b <= 0.05,
           "alpha %g, beta %g under 2%% noise, 200 draws: worst errors %.2f%% and %.2f%% (limit 5%%), "
           "lowest r2 %.4f",
           cases[c][0], cases[c][1], 100 * worst_a, 100 * worst_b, worst_r2);
    }
    /* a flat, noisy curve may fit a negative slope: clamped to 0 */
    pv_cost_point flat[3] = {{32, 1.02e-5, 0}, {64, 1.0e-5, 0}, {128, 0.98e-5, 0}};
    st = pv_cost_fit_linear(flat, 3, &f);
    ok(st == PV_OK && f.alpha == 0 && fabs(f.beta / 1e-5 - 1) < 0.01,
       "a falling curve: alpha clamped to 0, beta %g", f.beta);
    pv_cost_point rising[3] = {{1000, 1e-6, 0}, {2000, 2.2e-6, 0}, {4000, 4.6e-6, 0}};
    st = pv_cost_fit_linear(rising, 3, &f);
    ok(st == PV_OK && f.beta == 0 && f.alpha > 0,
       "a curve through below the origin: beta clamped to 0, alpha %g", f.alpha);
    pv_cost_point same[2] = {{64, 1e-5, 0}, {64, 2e-5, 0}};
    ok(pv_cost_fit_linear(same, 2, &f) == PV_ERR_INVALID_ARG && strstr(pv_last_error(), "all 2 points"),
       "points at one context are refused (%s)", pv_last_error());
    pv_cost_point zero[2] = {{32, 1e-5, 0}, {64, 0, 0}};
    ok(pv_cost_fit_linear(zero, 2, &f) == PV_ERR_INVALID_ARG && strstr(pv_last_error(), "point 1"),
       "a zero time is refused (%s)", pv_last_error());
}

static int write_file(const char *path, const char *text)
{
    FILE *f = fopen(path, "w");
    if (!f)
        return 0;
    fputs(text, f);
    return fclose(f) == 0;
}

static char *slurp(const char *path)
{
    static char buf[65536];
    FILE *f = fopen(path, "r");
    size_t n = f ? fread(buf, 1, sizeof buf - 1, f) : 0;
    if (f)
        fclose(f);
    buf[n] = '\0';
    return buf;
}

static pv_profile sample(const char *backend, const char *device, double alpha)
{
    pv_profile p;
    memset(&p, 0, sizeof p);
    snprintf(p.backend, sizeof p.backend, "%s", backend);
    snprintf(p.device, sizeof p.device, "%s", device);
    p.alpha = alpha;
    p.beta = 3.25e-5;
    p.c = 4.5e-4;
    p.r2 = 0.9987;
    p.heldout_error = 0.031;
    p.chunk_tokens = 32;
    p.n_points = 3;
    p.points[0] = (pv_cost_point){32, 3.3e-5, 0.02};
    p.points[1] = (pv_cost_point){64, 3.4e-5, 0.03};
    p.points[2] = (pv_cost_point){128, 3.6e-5, 0.01};
    snprintf(p.shape, sizeof p.shape, "9,3,64,30");
    snprintf(p.date, sizeof p.date, "2026-11-23T23:00:00Z");
    snprintf(p.version, sizeof p.version, "test");
    p.n_kernels = 2;
    p.kernels[0] = (struct pv_profile_kernel){"attention.hd64.g4.decode.long", "PV_WG=16 PV_SPLITS=4", 0};
    p.kernels[1] = (struct pv_profile_kernel){"gather", "PV_WG=128 PV_ITEM_ELEMS=2", 0};
    return p;
}

static void check_files(const char *dir)
{
    char path[512];
    snprintf(path, sizeof path, "%s/sub/dir/profiles.ini", dir);
    pv_profile a = sample("cpu", "AMD EPYC [test]; #1", 1.5e-8), got;
    pv_status st;
    st = pv_profile_save(path, &a);
    ok(st == PV_OK, "a new file and its directories are created (%s)", st ? pv_last_error() : "ok");
    st = pv_profile_load(path, "cpu", "AMD EPYC [test]; #1", &got);
    ok(st == PV_OK && got.alpha == a.alpha && got.beta == a.beta && got.c == a.c && got.r2 == a.r2 &&
           got.chunk_tokens == 32 && got.n_points == 3 && got.points[2].context == 128 &&
           got.points[2].seconds == 3.6e-5 && strcmp(got.shape, "9,3,64,30") == 0 &&
           got.heldout_error == 0.031 && got.n_kernels == 2 &&
           strcmp(got.kernels[1].bucket, "gather") == 0 &&
           strcmp(got.kernels[1].params, "PV_WG=128 PV_ITEM_ELEMS=2") == 0 && got.kernels[0].line > 0,
       "a profile reads back as written, kernel sets too, its device name's [ ] ; # made safe (%s)",
       st ? pv_last_error() : "ok");
    pv_profile odd = a;
    snprintf(odd.kernels[1].params, sizeof odd.kernels[1].params, "PV_WG=128\n[cpu: y]");
    ok(pv_profile_save(path, &odd) == PV_ERR_INVALID_ARG && strstr(pv_last_error(), "kernel set 1"),
       "a kernel set with a line break, which would break the file, is not saved");

    /* another device's section, hand-edited, with comments: kept byte for byte */
    const char *other = "[opencl: pthread-AMD EPYC]  ; PoCL\n"
                        "alpha = 2e-8   ; by hand\n"
                        "beta = 1e-5\n"
                        "c = 2e-4\n"
                        "chunk_tokens = 32\n";
    FILE *f = fopen(path, "a");
    if (f) {
        fprintf(f, "\n%s", other);
        fclose(f);
    }
    pv_profile b = sample("cpu", "AMD EPYC [test]; #1", 7.5e-8);
    pv_profile c = sample("cuda", "NVIDIA H100 80GB HBM3", 1e-10);
    st = pv_profile_save(path, &b);
    if (st == PV_OK)
        st = pv_profile_save(path, &c);
    ok(st == PV_OK, "two more saves (%s)", st ? pv_last_error() : "ok");
    const char *text = slurp(path);
    const char *first = strstr(text, "[cpu: ");
    ok(strstr(text, other) != NULL && first && !strstr(first + 1, "[cpu: "),
       "the other device's section is kept byte for byte; the replaced one appears once");
    st = pv_profile_load(path, "cpu", "AMD EPYC [test]; #1", &got);
    ok(st == PV_OK && got.alpha == 7.5e-8,
       "the second save replaced the first: alpha %g", got.alpha);
    st = pv_profile_load(path, "opencl", "pthread-AMD EPYC", &got);
    ok(st == PV_OK && got.alpha == 2e-8 &&
           got.heldout_error < 0 && got.n_points == 0,
       "the hand-written section loads (%s)", st ? pv_last_error() : "ok");
    ok(pv_profile_load(path, "cuda", "NVIDIA H100 80GB HBM3", &got) == PV_OK && got.alpha == 1e-10,
       "the appended section loads");
    st = pv_profile_load(path, "cuda", "NVIDIA H200", &got);
    ok(st == PV_ERR_NOT_FOUND && strstr(pv_last_error(), "[cuda: NVIDIA H100 80GB HBM3]"),
       "a device without a section: not found, naming the sections (%s)", pv_last_error());

    /* corrupt files: file, line and key named; never overwritten */
    static const struct {
        const char *text, *needle;
    } bad[] = {
        {"[cpu: x]\nalpha = 1e-8\nbeta = fast\nc = 1\nchunk_tokens = 32\n", ":3: key [cpu: x] beta = \"fast\""},
        {"[cpu: x]\nalpha = 1e-8\nbeta = 1\nc = 1\nchunk_tokens = 32\nspeed = 3\n", ":6: unknown key [cpu: x] speed"},
        {"[cpu: x]\nalpha = 1e-8\nbeta = 1\nchunk_tokens = 32\n", ":1: section lacks key c"},
        {"[cpu: x]\nalpha = -1\nbeta = 1\nc = 1\nchunk_tokens = 32\n", ":2: key [cpu: x] alpha"},
        {"[cpu: x]\nalpha = 1\nalpha = 2\n", ":3: key [cpu: x] alpha is set again (first on line 2)"},
        {"[cpu: x]\nalpha = 1\nbeta = 1\nc = 1\nchunk_tokens = 32\npoints = 32:1e-5\n", ":6: key [cpu: x] points"},
        {"[cpu]\nalpha = 1\n", ":1: section [cpu] is not \"backend: device\""},
        {"alpha = 1\n", ":1: \"alpha = 1\" comes before any section"},
        {"[cpu: x]\nalpha = 1\nkernel.Gather = PV_WG=64\n", ":3: key [cpu: x] kernel.Gather: the bucket"},
        {"[cpu: x]\nalpha = 1\nkernel. = PV_WG=64\n", ":3: key [cpu: x] kernel.: the bucket"},
        {"[cpu: x]\nalpha = 1\nkernel.gather = fast\n", ":3: key [cpu: x] kernel.gather = \"fast\" is not"},
        {"[cpu: x]\nkernel.gather = PV_WG=64\nalpha = 1\nkernel.gather = PV_WG=32\n",
         ":4: key [cpu: x] kernel.gather is set again (first on line 2)"},
    };
    char bad_path[512];
    snprintf(bad_path, sizeof bad_path, "%s/bad.ini", dir);
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        write_file(bad_path, bad[i].text);
        st = pv_profile_load(bad_path, "cpu", "x", &got);
        const char *msg = pv_last_error();
        ok(st == PV_ERR_FORMAT && strstr(msg, bad_path) && strstr(msg, bad[i].needle), "corrupt profile %zu: %s",
           i, msg);
    }
    write_file(bad_path, bad[0].text);
    st = pv_profile_save(bad_path, &a);
    ok(st == PV_ERR_FORMAT && strcmp(slurp(bad_path), bad[0].text) == 0,
       "saving into a corrupt file is refused and leaves it as it was (%s)", pv_last_error());
    unlink(bad_path);
    unlink(path);
}

static void check_apply(void)
{
    pv_cache_config cfg;
    pv_cache_config_defaults(&cfg);
    pv_profile p = sample("cpu", "x", 2e-8);
    ok(pv_profile_apply(&p, &cfg) == PV_OK && cfg.alpha == 2e-8 && cfg.beta == p.beta && cfg.c == p.c,
       "applied at the measured chunk size: the constants as measured");
    cfg.chunk_tokens = 64;
    ok(pv_profile_apply(&p, &cfg) == PV_OK && cfg.alpha == 4e-8 && cfg.beta == 2 * p.beta && cfg.c == 2 * p.c,
       "applied to chunks of 64 tokens: scaled by 2");
}

int main(void)
{
    check_fit();
    char dir[] = "/tmp/pv-test-profile-XXXXXX";
    if (!mkdtemp(dir)) {
        ok(0, "a temporary directory");
        return tap_done();
    }
    check_files(dir);
    check_apply();
    char sub[600];
    snprintf(sub, sizeof sub, "%s/sub/dir", dir);
    rmdir(sub);
    snprintf(sub, sizeof sub, "%s/sub", dir);
    rmdir(sub);
    rmdir(dir);
    return tap_done();
}
