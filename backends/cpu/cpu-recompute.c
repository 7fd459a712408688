/* The rest of a transformer layer (RMSNorm, RoPE, SwiGLU, residual add,
 * softmax) and the sampling helpers (argmax, top-p). Reductions and angles
 * are computed in double: this is the oracle other backends are held to. */
#include "config.h"

#include "backends/cpu/cpu.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

/* outr[:] = xr[:] / sqrt(mean(xr^2) + eps) * weight[:] over one row of dim;
 * outr may be xr (the row is read before it is written). */
static void rmsnorm_row(const float *xr, const float *weight, float *outr, size_t dim, float eps)
{
    double sum_sq = 0.0;
    for (size_t d = 0; d < dim; d++)
        sum_sq += (double)xr[d] * xr[d];
    float inv_rms = (float)(1.0 / sqrt(sum_sq / (double)dim + eps));
    for (size_t d = 0; d < dim; d++)
        outr[d] = xr[d] * inv_rms * weight[d];
}

/* out[r][:] = x[r][:] / sqrt(mean(x[r]^2) + eps) * weight[:], x and out
 * [rows][dim]; in place allowed. */
pv_status pv_cpu_rmsnorm(pv_backend *be, const pv_rmsnorm_args *a)
{
    const float *x = pv_cpu_elem_ptr(a->x, a->x_off, sizeof(float));
    const float *weight = pv_cpu_elem_ptr(a->weight, a->weight_off, sizeof(float));
    float *out = pv_cpu_elem_ptr(a->out, a->out_off, sizeof(float));
    size_t dim = (size_t)a->dim;

    PV_CPU_OMP("omp parallel for schedule(static) if (a->rows * a->dim >= PV_CPU_PARALLEL_MIN)")
    for (int64_t r = 0; r < a->rows; r++)
        rmsnorm_row(x + (size_t)r * dim, weight, out + (size_t)r * dim, dim, a->eps);
    return PV_OK;
}

/* Per row: x[r][:] += y[r][:] (pv_cpu_add's one f32 rounding), then
 * out[r][:] = rmsnorm(x[r][:]) * weight[:] (pv_cpu_rmsnorm's row). */
pv_status pv_cpu_add_rmsnorm(pv_backend *be, const pv_add_rmsnorm_args *a)
{
    float *x = pv_cpu_elem_ptr(a->x, a->x_off, sizeof(float));
    const float *y = pv_cpu_elem_ptr(a->y, a->y_off, sizeof(float));
    const float *weight = pv_cpu_elem_ptr(a->weight, a->weight_off, sizeof(float));
    float *out = pv_cpu_elem_ptr(a->out, a->out_off, sizeof(float));
    size_t dim = (size_t)a->dim;

    PV_CPU_OMP("omp parallel for schedule(static) if (a->rows * a->dim >= PV_CPU_PARALLEL_MIN)")
    for (int64_t r = 0; r < a->rows; r++) {
        float *xr = x + (size_t)r * dim;
        const float *yr = y + (size_t)r * dim;
        for (size_t d = 0; d < dim; d++)
            xr[d] = xr[d] + yr[d];
        rmsnorm_row(xr, weight, out + (size_t)r * dim, dim, a->eps);
    }
    return PV_OK;
}

/* dst[T][n_heads][head_dim] = src rotated: pair i turns by
 * pos * base^(-2i/head_dim); pairs are (2i, 2i+1), or (i, i + head_dim/2)
 * with neox. dst may be src (each pair is read before it is written). */
void pv_cpu_rope_rows(const float *src, float *dst, int32_t n_tokens, int32_t n_heads, int32_t head_dim,
                      const int32_t *pos, float base, int neox)
{
    int32_t half = head_dim / 2;
    const int64_t elems = (int64_t)n_tokens * n_heads * head_dim;
    PV_CPU_OMP("omp parallel for schedule(static) if (elems >= PV_CPU_PARALLEL_MIN)")
    for (int32_t t = 0; t < n_tokens; t++) {
        for (int32_t i = 0; i < half; i++) {
            double angle = (double)pos[t] * pow((double)base, -2.0 * i / head_dim);
            double c = cos(angle), s = sin(angle);
            int32_t first = neox ? i : 2 * i;
            int32_t second = neox ? i + half : 2 * i + 1;
            for (int32_t h = 0; h < n_heads; h++) {
                size_t head = ((size_t)t * n_heads + h) * head_dim;
                double x0 = src[head + first], x1 = src[head + second];
                dst[head + first] = (float)(x0 * c - x1 * s);
                dst[head + second] = (float)(x0 * s + x1 * c);
            }
        }
    }
}

/* x[T][n_heads][head_dim] rotated in place. */
pv_status pv_cpu_rope(pv_backend *be, const pv_rope_args *a)
{
    float *x = pv_cpu_elem_ptr(a->x, a->x_off, sizeof(float));
    pv_cpu_rope_rows(x, x, a->n_tokens, a->n_heads, a->head_dim, a->pos, a->base, a->neox);
    return PV_OK;
}

/* out[i] = silu(gate[i]) * up[i], silu(g) = g / (1 + exp(-g)) */
pv_status pv_cpu_swiglu(pv_backend *be, const pv_swiglu_args *a)
{
    const float *gate = pv_cpu_elem_ptr(a->gate, a->gate_off, sizeof(float));
    const float *up = pv_cpu_elem_ptr(a->up, a->up_off, sizeof(float));
    float *out = pv_cpu_elem_ptr(a->out, a->out_off, sizeof(float));

    PV_CPU_OMP("omp parallel for schedule(static) if (a->n >= PV_CPU_PARALLEL_MIN)")
    for (int64_t i = 0; i < a->n; i++)
        out[i] = gate[i] / (1.0f + expf(-gate[i])) * up[i];
    return PV_OK;
}

/* out[i] = a[i] + b[i]; in place allowed */
pv_status pv_cpu_add(pv_backend *be, const pv_add_args *a)
{
    const float *x = pv_cpu_elem_ptr(a->a, a->a_off, sizeof(float));
    const float *y = pv_cpu_elem_ptr(a->b, a->b_off, sizeof(float));
    float *out = pv_cpu_elem_ptr(a->out, a->out_off, sizeof(float));

    PV_CPU_OMP("omp parallel for schedule(static) if (a->n >= PV_CPU_PARALLEL_MIN)")
    for (int64_t i = 0; i < a->n; i++)
        out[i] = x[i] + y[i];
    return PV_OK;
}

/* out[r][:] = softmax(x[r][:] * scale), [rows][cols]; in place allowed. The
 * row max is subtracted first so exp never overflows. */
pv_status pv_cpu_softmax(pv_backend *be, const pv_softmax_args *a)
{
    const float *x = pv_cpu_elem_ptr(a->x, a->x_off, sizeof(float));
    float *out = pv_cpu_elem_ptr(a->out, a->out_off, sizeof(float));
    size_t cols = (size_t)a->cols;

    PV_CPU_OMP("omp parallel for schedule(static)")
    for (int64_t r = 0; r < a->rows; r++) {
        const float *xr = x + (size_t)r * cols;
        float *outr = out + (size_t)r * cols;
        double max = -INFINITY;
        for (size_t c = 0; c < cols; c++)
            max = fmax(max, (double)xr[c] * a->scale);
        double sum = 0.0;
        for (size_t c = 0; c < cols; c++) {
            double e = exp((double)xr[c] * a->scale - max);
            outr[c] = (float)e;
            sum += e;
        }
        for (size_t c = 0; c < cols; c++)
            outr[c] = (float)(outr[c] / sum);
    }
    return PV_OK;
}

/* The lowest index of the row's maximum. */
static int32_t argmax_row(const float *xr, size_t cols)
{
    size_t best = 0;
    for (size_t c = 1; c < cols; c++)
        if (xr[c] > xr[best])
            best = c;
    return (int32_t)best;
}

pv_status pv_cpu_argmax(pv_backend *be, const pv_argmax_args *a)
{
    const float *x = pv_cpu_elem_ptr(a->x, a->x_off, sizeof(float));
    size_t cols = (size_t)a->cols;
    for (int64_t r = 0; r < a->rows; r++)
        a->out[r] = argmax_row(x + (size_t)r * cols, cols);
    return PV_OK;
}

typedef struct token_prob {
    double p;
    int32_t id;
} token_prob;

/* Highest probability first; equal probabilities in index order. */
static int by_prob_desc(const void *lhs, const void *rhs)
{
    const token_prob *x = lhs, *y = rhs;
    if (x->p != y->p)
        return x->p > y->p ? -1 : 1;
    return (x->id > y->id) - (x->id < y->id);
}

/* One row of top-p sampling, as documented in backend.h:
 *   p = softmax(logits / temperature)
 *   threshold = p of the token whose running mass (highest first) first
 *               reaches top_p; every token with p >= threshold and p > 0
 *               is kept (a banned token, logit -infinity, never is)
 *   pick the first kept token, in index order, whose cumulative kept mass
 *   exceeds u * (total kept mass). */
static int32_t sample_row(const float *logits, int64_t cols, float temperature, float top_p, float u,
                          double *p, token_prob *sorted)
{
    double max = -INFINITY;
    for (int64_t c = 0; c < cols; c++)
        max = fmax(max, (double)logits[c]);
    double total = 0.0;
    for (int64_t c = 0; c < cols; c++) {
        p[c] = exp(((double)logits[c] - max) / temperature);
        total += p[c];
    }
    for (int64_t c = 0; c < cols; c++) {
        p[c] /= total;
        sorted[c].p = p[c];
        sorted[c].id = (int32_t)c;
    }
    qsort(sorted, (size_t)cols, sizeof *sorted, by_prob_desc);

    /* Rounding may leave the full mass a hair under top_p: keep all then. */
    double threshold = sorted[cols - 1].p;
    double running = 0.0;
    for (int64_t k = 0; k < cols; k++) {
        running += sorted[k].p;
        if (running >= top_p) {
            threshold = sorted[k].p;
            break;
        }
    }

    double kept = 0.0;
    int32_t last_kept = 0;
    for (int64_t c = 0; c < cols; c++)
        if (p[c] >= threshold && p[c] > 0.0) {
            kept += p[c];
            last_kept = (int32_t)c;
        }
    double target = (double)u * kept;
    double cumulative = 0.0;
    for (int64_t c = 0; c < cols; c++) {
        if (p[c] < threshold || p[c] == 0.0)
            continue;
        cumulative += p[c];
        if (cumulative > target)
            return (int32_t)c;
    }
    return last_kept; /* u * kept rounded up to the whole mass */
}

/* The scratch rows of sample_row, for cols columns. */
static pv_status sample_scratch(const char *op, int64_t cols, double **p, token_prob **sorted)
{
    *p = malloc((size_t)cols * sizeof **p);
    *sorted = malloc((size_t)cols * sizeof **sorted);
    if (!*p || !*sorted) {
        free(*p);
        free(*sorted);
        return pv_error(PV_ERR_OUT_OF_MEMORY, "cpu %s: cannot allocate scratch for cols %lld", op, (long long)cols);
    }
    return PV_OK;
}

pv_status pv_cpu_sample_top_p(pv_backend *be, const pv_sample_args *a)
{
    const float *logits = pv_cpu_elem_ptr(a->logits, a->logits_off, sizeof(float));
    size_t cols = (size_t)a->cols;
    double *p;
    token_prob *sorted;
    PV_TRY(sample_scratch("sample_top_p", a->cols, &p, &sorted));
    for (int64_t r = 0; r < a->rows; r++)
        a->out[r] = sample_row(logits + (size_t)r * cols, a->cols, a->temperature, a->top_p, a->u[r], p,
                               sorted);
    free(p);
    free(sorted);
    return PV_OK;
}

/* Row r of logits with row r's logit bias applied (pv_sample_batch_args):
 * f32 additions, a banned token -infinity. */
static void bias_row(const pv_sample_batch_args *a, int64_t r, const float *row, float *biased)
{
    memcpy(biased, row, (size_t)a->cols * sizeof *biased);
    for (int32_t k = a->bias_start[r]; k < a->bias_start[r + 1]; k++) {
        const int32_t c = a->bias_token[k];
        biased[c] = a->bias_value[k] <= PV_LOGIT_BIAS_BAN ? -INFINITY : row[c] + a->bias_value[k];
    }
}

/* Each row as argmax (temperature <= 0) or sample_top_p would take it,
 * from its biased logits where it has a bias; into host out or, computed
 * now like every CPU op, into out_dev. */
pv_status pv_cpu_sample_batch(pv_backend *be, const pv_sample_batch_args *a)
{
    const float *logits = pv_cpu_elem_ptr(a->logits, a->logits_off, sizeof(float));
    int32_t *out = a->out ? a->out : pv_cpu_elem_ptr(a->out_dev, a->out_dev_off, sizeof(int32_t));
    size_t cols = (size_t)a->cols;
    double *p = NULL;
    token_prob *sorted = NULL;
    float *biased = NULL;
    pv_status st = PV_OK;
    for (int64_t r = 0; r < a->rows && st == PV_OK; r++) {
        const float *row = logits + (size_t)r * cols;
        if (a->bias_start && a->bias_start[r + 1] > a->bias_start[r]) {
            if (!biased && !(biased = malloc(cols * sizeof *biased))) {
                st = pv_error(PV_ERR_OUT_OF_MEMORY, "cpu sample_batch: cannot allocate a biased row of %zu", cols);
                break;
            }
            bias_row(a, r, row, biased);
            row = biased;
        }
        if (a->temperature[r] <= 0.0f) {
            out[r] = argmax_row(row, cols);
            continue;
        }
        if (!p && (st = sample_scratch("sample_batch", a->cols, &p, &sorted)) != PV_OK)
            break;
        out[r] = sample_row(row, a->cols, a->temperature[r], a->top_p[r], a->u[r], p, sorted);
    }
    free(p);
    free(sorted);
    free(biased);
    return st;
}
