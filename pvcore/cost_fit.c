/* The cost model's fit: seconds(l) = alpha * l + beta by weighted least
 * squares, in closed form (two unknowns need no LAPACK). */
#include <pensieve/profile.h>

#include <math.h>

/* Minimises sum w (alpha l + beta - t)^2 with w = 1 / t^2, each constant
 * kept >= 0 by refitting the other alone. */
static void solve(const pv_cost_point *p, size_t n, double *alpha, double *beta)
{
    double s = 0, sx = 0, sy = 0, sxx = 0, sxy = 0;
    for (size_t i = 0; i < n; i++) {
        const double w = 1.0 / (p[i].seconds * p[i].seconds);
        s += w;
        sx += w * p[i].context;
        sy += w * p[i].seconds;
        sxx += w * p[i].context * p[i].context;
        sxy += w * p[i].context * p[i].seconds;
    }
    const double det = s * sxx - sx * sx;
    *alpha = (s * sxy - sx * sy) / det;
    *beta = (sxx * sy - sx * sxy) / det;
    if (*alpha < 0) {
        *alpha = 0;
        *beta = sy / s;
    } else if (*beta < 0) {
        *beta = 0;
        *alpha = sxy / sxx;
    }
}

pv_status pv_cost_fit_linear(const pv_cost_point *points, size_t n, pv_cost_fit *out)
{
    if (!points || !out)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cost_fit_linear: points and out must not be NULL");
    if (n < 2)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cost_fit_linear: %zu points; a line needs at least 2", n);
    int distinct = 0;
    for (size_t i = 0; i < n; i++) {
        const pv_cost_point *p = &points[i];
        if (!isfinite(p->context) || p->context < 0 || !isfinite(p->seconds) || !(p->seconds > 0))
            return pv_error(PV_ERR_INVALID_ARG,
                            "pv_cost_fit_linear: point %zu (context %g, %g s) needs a finite context >= 0 and "
                            "a finite time > 0",
                            i, p->context, p->seconds);
        distinct = distinct || p->context != points[0].context;
    }
    if (!distinct)
        return pv_error(PV_ERR_INVALID_ARG, "pv_cost_fit_linear: all %zu points are at context %g", n,
                        points[0].context);
    pv_cost_fit f = {0};
    solve(points, n, &f.alpha, &f.beta);
    double mean = 0;
    for (size_t i = 0; i < n; i++)
        mean += points[i].seconds / (double)n;
    double ss_res = 0, ss_tot = 0;
    for (size_t i = 0; i < n; i++) {
        const double fit = pv_cost_fit_predict(&f, points[i].context);
        const double r = fit - points[i].seconds;
        ss_res += r * r;
        ss_tot += (points[i].seconds - mean) * (points[i].seconds - mean);
        const double rel = fabs(r) / points[i].seconds;
        f.max_rel_residual = rel > f.max_rel_residual ? rel : f.max_rel_residual;
    }
    f.r2 = ss_tot > 0 ? 1.0 - ss_res / ss_tot : (ss_res == 0 ? 1.0 : 0.0);
    *out = f;
    return PV_OK;
}

double pv_cost_fit_predict(const pv_cost_fit *fit, double context)
{
    return fit->alpha * context + fit->beta;
}
