/* The parameters the portable kernels (kernels/<family>.cl) are built with:
 * for each family, every -D define it takes, its default and the values a
 * backend may build it with. Backend-neutral: the CUDA backend builds from
 * this table (backends/cuda/), and it is meant for the OpenCL backend and
 * pensieve-tune's kernel search too, so that a tuned value means the same
 * thing everywhere.
 *
 * A parameter has one of three roles:
 *   - tuned: a free choice that changes speed, never results (work-group
 *     size, elements per work-item). A backend holds one value per shape
 *     bucket (backends/kernel-tuning.h: the family's default until a tuner
 *     picks another) and builds the programs of the bucket's calls with it.
 *     A launcher that needs the value as well (PV_WG is the work-group
 *     size, PV_ITEM_ELEMS sets the number of groups) must take it from the
 *     same parameter set the program was built with.
 *   - launch: tuned the same way, but read by the launcher only (split
 *     count, GEMM precision, activation rounding); never a -D define, so
 *     its values share one program. PV_GEMM and PV_ACT16 are the tuned
 *     choices that change results (they round the products' inputs):
 *     pensieve-tune allows PV_GEMM's rounded modes a wider error, while
 *     PV_ACT16's some 1e-5 fits the usual limit.
 *   - variant: fixed by the op's arguments (storage dtype, weight type,
 *     head-dim class, query heads per group); the launcher sets it per call
 *     and each value is a program of its own.
 * The value lists are exactly what tests/test-cuda-nvrtc.c compiles for
 * CUDA; a value outside them is untested. Defaults are those of the
 * kernels' own #ifndef blocks (the test checks that they agree); a backend
 * still passes every parameter of a family explicitly, so the option string
 * alone says how a program was built. A backend may start from other
 * defaults of the lists (the OpenCL backend builds attention with PV_WG =
 * 16 on CPU devices). */
#ifndef PV_BACKENDS_KERNEL_PARAMS_H
#define PV_BACKENDS_KERNEL_PARAMS_H

#include "kernels/kernel-sources.h"

#include <stdint.h>
#include <stdio.h>
#include <string.h>

typedef enum pv_kernel_family {
    PV_KERNEL_ATTENTION = 0, /* kernels/attention.cl */
    PV_KERNEL_GATHER,        /* kernels/gather.cl */
    PV_KERNEL_QMATMUL,       /* kernels/qmatmul.cl */
    PV_KERNEL_RECOMPUTE,     /* kernels/recompute.cl */
    PV_KERNEL_FAMILY_COUNT
} pv_kernel_family;

/* Every parameter of any family; a family takes a subset. */
typedef enum pv_kparam {
    /* PV_WG, tuned: work-items per work-group (CUDA block size). A power of
     * two (the group reductions halve it), at most 256 (with no launch
     * bounds a CUDA kernel may take 255 registers a thread, and 256 such
     * threads fill the 64K-register file). Attention needs PV_WG >=
     * PV_ATT_MAX_GROUP (a tile has PV_WG / heads rows) and holds
     * PV_WG * (PV_WG + 1) + 2 * PV_WG floats and PV_WG longs of local
     * memory, so at most 64 under CUDA's 48 KiB of static shared memory
     * (its GPU kernel, pv_attention_teams, PV_WG * 8 * PV_ATT_MAX_GROUP
     * floats);
     * qmatmul holds 16 * PV_WG floats. */
    PV_KPARAM_WG = 0,
    /* PV_ITEM_ELEMS, tuned: elements each work-item moves in the slot copies
     * and element-wise kernels (a group covers PV_WG * PV_ITEM_ELEMS). Any
     * positive integer; the loop over them is unrolled. */
    PV_KPARAM_ITEM_ELEMS,
    /* PV_STORE_F16, variant: the KV storage dtype, 0 f32, 1 f16; picks the
     * kernels' _f32 / _f16 names. */
    PV_KPARAM_STORE_F16,
    /* PV_MAX_HEAD_DIM, variant: the largest head_dim an attention build
     * serves; the launcher takes the smallest class >= head_dim, since each
     * work-item computes PV_MAX_HEAD_DIM / PV_WG dims whatever head_dim is. */
    PV_KPARAM_MAX_HEAD_DIM,
    /* PV_ATT_MAX_GROUP, variant: query heads an attention work-group serves
     * at most (their queries and outputs live in registers); the launcher
     * takes the smallest power of two >= the heads per block, at most
     * PV_ATTENTION_GROUP_MAX (backends/attention-split.h). */
    PV_KPARAM_ATT_MAX_GROUP,
    /* PV_WTYPE, variant: the weight type's ggml id (pv_wtype), one qmatmul
     * build per type. */
    PV_KPARAM_WTYPE,
    /* PV_SPLITS, launch: attention's split-K count, the work-groups that
     * share one (query token, KV head, head block) by ranges of its context
     * (backends/attention-split.h); 0 is that header's rule, which grows it
     * with the context. */
    PV_KPARAM_SPLITS,
    /* PV_GEMM, launch: how qmatmul multiplies the batches too large for
     * its fused kernels (T > 16): the weights widened into tiles, then the
     * BLAS GEMM in the precision of a pv_gemm_mode. A backend runs the modes
     * up to its pv_kernel_tuning.max_gemm (kernel-tuning.h); pensieve-tune
     * measures them and keeps the fastest. */
    PV_KPARAM_GEMM,
    /* PV_ACT16, launch: 1 has qmatmul's decode-sized products (T <= 16) of
     * the block types (Q8_0, Q4_0, Q4_1) multiply x rounded to 16 bits per
     * block of 32, as the CPU backend's integer kernels do (backend.h,
     * pv_qmatmul_args), with integer dot products (dp4a on CUDA): a
     * rounding kernel and then fewer instructions per weight. 0 multiplies
     * f32 x. Changes results by some 1e-5 of the largest output; other
     * weight types and larger batches are the same in both. */
    PV_KPARAM_ACT16,
    /* PV_QMV_ROWS, tuned: the rows of W a work-group of qmatmul's
     * one-token kernels takes (pv_qmv_rows). Every work-group loads all of
     * x (4 bytes an element, 2.25 under PV_ACT16), so at 2 rows a Q4 product
     * reads some 3.6 times more x than weight bytes, from L2 on a GPU; more
     * rows share each x load among more of them, fewer leave more groups
     * to fill the device. */
    PV_KPARAM_QMV_ROWS,
    /* PV_QMV_LANES, tuned: the row lanes of a work-group of qmatmul's
     * decode-sized kernels, each taking its token class's rows
     * (pv_qmv_rows), the lanes of an octet neighbours in a warp. Their
     * loads of x are one, so x's traffic from L2 falls by the lanes, with
     * no more registers for the sums: at 8 tokens and 2 rows a Q4 product
     * reads some 28 times more x than weight bytes (run A: 102 us for
     * 14336 x 4096 Q4_0 at 8 tokens, a cache's rate for those bytes, by
     * my reading); 8 lanes make it 3.6. A row's run per warp shrinks by
     * as much. */
    PV_KPARAM_QMV_LANES,
    PV_KPARAM_COUNT
} pv_kparam;

/* PV_GEMM's values. The 16-bit modes round both the weights and the
 * activations (f16: 11-bit significand, range 65504; bf16: 8 bits, f32's
 * range) and accumulate in f32 on tensor cores; TF32 keeps f32 tiles and
 * rounds the products' inputs to a 10-bit significand inside the GEMM. */
typedef enum pv_gemm_mode {
    PV_GEMM_F32 = 0, /* f32 tiles, f32 GEMM (no tensor cores) */
    PV_GEMM_F16,     /* f16 tiles and activations (tensor cores from compute capability 7.0) */
    PV_GEMM_BF16,    /* bf16 tiles and activations (8.0) */
    PV_GEMM_TF32,    /* f32 tiles, TF32 tensor-core GEMM (8.0) */
    PV_GEMM_MODES
} pv_gemm_mode;

static inline const char *pv_gemm_mode_name(int mode)
{
    static const char *const names[PV_GEMM_MODES] = {"f32", "f16", "bf16", "tf32"};
    return mode >= 0 && mode < PV_GEMM_MODES ? names[mode] : "?";
}

typedef enum pv_kparam_role { PV_KPARAM_TUNED, PV_KPARAM_VARIANT, PV_KPARAM_LAUNCH } pv_kparam_role;

#define PV_KPARAM_MAX_VALUES 8
#define PV_KPARAM_MAX_PER_FAMILY 6

typedef struct pv_kparam_spec {
    pv_kparam param;
    pv_kparam_role role;
    int def;
    int n_values;
    int values[PV_KPARAM_MAX_VALUES];
} pv_kparam_spec;

typedef struct pv_kernel_family_spec {
    const char *name; /* kernels/<name>.cl */
    int n_params;
    pv_kparam_spec params[PV_KPARAM_MAX_PER_FAMILY];
} pv_kernel_family_spec;

/* One parameter set: the family and a value for each parameter it takes
 * (the others stay 0, so two sets compare equal with memcmp). */
typedef struct pv_kernel_params {
    pv_kernel_family family;
    int value[PV_KPARAM_COUNT];
} pv_kernel_params;

/* The -D name of a parameter. */
static inline const char *pv_kparam_define(pv_kparam p)
{
    static const char *const names[PV_KPARAM_COUNT] = {
        "PV_WG", "PV_ITEM_ELEMS", "PV_STORE_F16", "PV_MAX_HEAD_DIM", "PV_ATT_MAX_GROUP", "PV_WTYPE", "PV_SPLITS",
        "PV_GEMM", "PV_ACT16", "PV_QMV_ROWS", "PV_QMV_LANES",
    };
    return (unsigned)p < PV_KPARAM_COUNT ? names[p] : "?";
}

/* The table. A function-local static so that a file including this header
 * without using it carries no unused object. */
static inline const pv_kernel_family_spec *pv_kernel_family_spec_of(pv_kernel_family family)
{
    static const pv_kernel_family_spec specs[PV_KERNEL_FAMILY_COUNT] = {
        [PV_KERNEL_ATTENTION] = {"attention", 5, {
            {PV_KPARAM_WG, PV_KPARAM_TUNED, 64, 3, {16, 32, 64}},
            {PV_KPARAM_SPLITS, PV_KPARAM_LAUNCH, 0, 6, {0, 1, 2, 4, 8, 16}},
            {PV_KPARAM_STORE_F16, PV_KPARAM_VARIANT, 0, 2, {0, 1}},
            {PV_KPARAM_MAX_HEAD_DIM, PV_KPARAM_VARIANT, 256, 3, {64, 128, 256}},
            {PV_KPARAM_ATT_MAX_GROUP, PV_KPARAM_VARIANT, 8, 4, {1, 2, 4, 8}},
        }},
        [PV_KERNEL_GATHER] = {"gather", 3, {
            {PV_KPARAM_WG, PV_KPARAM_TUNED, 64, 4, {32, 64, 128, 256}},
            {PV_KPARAM_ITEM_ELEMS, PV_KPARAM_TUNED, 8, 5, {1, 2, 4, 8, 16}},
            {PV_KPARAM_STORE_F16, PV_KPARAM_VARIANT, 0, 2, {0, 1}},
        }},
        [PV_KERNEL_QMATMUL] = {"qmatmul", 6, {
            {PV_KPARAM_WG, PV_KPARAM_TUNED, 64, 4, {32, 64, 128, 256}},
            {PV_KPARAM_QMV_ROWS, PV_KPARAM_TUNED, 2, 3, {2, 4, 8}},
            {PV_KPARAM_QMV_LANES, PV_KPARAM_TUNED, 1, 2, {1, 8}},
            {PV_KPARAM_GEMM, PV_KPARAM_LAUNCH, PV_GEMM_F32, 4, {PV_GEMM_F32, PV_GEMM_F16, PV_GEMM_BF16, PV_GEMM_TF32}},
            {PV_KPARAM_ACT16, PV_KPARAM_LAUNCH, 0, 2, {0, 1}},
            /* F32, F16, Q4_0, Q4_1, Q8_0, BF16; the kernel has no default */
            {PV_KPARAM_WTYPE, PV_KPARAM_VARIANT, 0, 6, {0, 1, 2, 3, 8, 30}},
        }},
        [PV_KERNEL_RECOMPUTE] = {"recompute", 2, {
            {PV_KPARAM_WG, PV_KPARAM_TUNED, 64, 4, {32, 64, 128, 256}},
            {PV_KPARAM_ITEM_ELEMS, PV_KPARAM_TUNED, 8, 5, {1, 2, 4, 8, 16}},
        }},
    };
    return (unsigned)family < PV_KERNEL_FAMILY_COUNT ? &specs[family] : NULL;
}

/* The family's kernel text (kernels/<name>.cl, embedded); a program is
 * pv_kernel_source_dialect followed by it. NULL for no family. */
static inline const char *pv_kernel_family_source(pv_kernel_family family)
{
    switch (family) {
    case PV_KERNEL_ATTENTION: return pv_kernel_source_attention;
    case PV_KERNEL_GATHER: return pv_kernel_source_gather;
    case PV_KERNEL_QMATMUL: return pv_kernel_source_qmatmul;
    case PV_KERNEL_RECOMPUTE: return pv_kernel_source_recompute;
    case PV_KERNEL_FAMILY_COUNT: break;
    }
    return NULL;
}

/* Whether the family is built with `value` for param: for PV_KPARAM_WTYPE,
 * whether the portable kernels read that weight type (the OpenCL and CUDA
 * backends answer supports_weights from it). */
static inline int pv_kernel_builds_value(pv_kernel_family family, pv_kparam param, int value)
{
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(family);
    for (int i = 0; spec && i < spec->n_params; i++)
        for (int v = 0; spec->params[i].param == param && v < spec->params[i].n_values; v++)
            if (spec->params[i].values[v] == value)
                return 1;
    return 0;
}

/* *out = the family's defaults. */
static inline void pv_kernel_params_default(pv_kernel_family family, pv_kernel_params *out)
{
    memset(out, 0, sizeof *out);
    out->family = family;
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(family);
    for (int i = 0; spec && i < spec->n_params; i++)
        out->value[spec->params[i].param] = spec->params[i].def;
}

/* The parameter sets of a family in which the parameters whose bit is set
 * in `varied` (bit i: the family's parameter i in the table) take each of
 * their values and the others their defaults: how many there are, and set
 * `index` of them (0 <= index < that count; a mixed-radix number, the
 * table's first parameter fastest). */
static inline int pv_kernel_sets_count(pv_kernel_family family, unsigned varied)
{
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(family);
    int count = spec ? 1 : 0;
    for (int i = 0; spec && i < spec->n_params; i++)
        if (varied & (1u << i))
            count *= spec->params[i].n_values;
    return count;
}

static inline void pv_kernel_sets_nth(pv_kernel_family family, unsigned varied, int index, pv_kernel_params *out)
{
    pv_kernel_params_default(family, out);
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(family);
    for (int i = 0; spec && i < spec->n_params; i++)
        if (varied & (1u << i)) {
            out->value[spec->params[i].param] = spec->params[i].values[index % spec->params[i].n_values];
            index /= spec->params[i].n_values;
        }
}

/* The `varied` bits of a family's parameters of the given roles (bit r set
 * in roles: role r of pv_kparam_role). The sets a backend may build:
 * PV_KPARAM_TUNED and PV_KPARAM_VARIANT (launch parameters build none). */
static inline unsigned pv_kernel_params_of_roles(pv_kernel_family family, unsigned roles)
{
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(family);
    unsigned bits = 0;
    for (int i = 0; spec && i < spec->n_params; i++)
        if (roles & (1u << spec->params[i].role))
            bits |= 1u << i;
    return bits;
}

/* The build options of a parameter set: "-DPV_WG=64 -DPV_ITEM_ELEMS=8 ...",
 * every parameter of the family in table order but the launch ones. Returns
 * the length, as snprintf does (>= size: truncated). */
static inline int pv_kernel_params_defines(const pv_kernel_params *p, char *buf, size_t size)
{
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(p->family);
    int len = 0;
    if (size)
        buf[0] = '\0';
    for (int i = 0; spec && i < spec->n_params; i++) {
        const pv_kparam id = spec->params[i].param;
        if (spec->params[i].role == PV_KPARAM_LAUNCH)
            continue;
        const size_t at = (size_t)len < size ? (size_t)len : size;
        int n = snprintf(buf + at, size - at, "%s-D%s=%d", len ? " " : "", pv_kparam_define(id), p->value[id]);
        if (n < 0)
            return n;
        len += n;
    }
    return len;
}

/* p with its launch parameters zeroed: the sets that build one program
 * compare equal (a program cache keys on this). */
static inline pv_kernel_params pv_kernel_params_built(const pv_kernel_params *p)
{
    pv_kernel_params built = *p;
    const pv_kernel_family_spec *spec = pv_kernel_family_spec_of(p->family);
    for (int i = 0; spec && i < spec->n_params; i++)
        if (spec->params[i].role == PV_KPARAM_LAUNCH)
            built.value[spec->params[i].param] = 0;
    return built;
}

/* Whether kernels/qmatmul.cl built for weight type wtype (a ggml id, as
 * PV_WTYPE) holds the PV_ACT16 kernels: the block types Q4_0, Q4_1, Q8_0. */
static inline int pv_qmatmul_has_act16(int wtype)
{
    return wtype == 2 || wtype == 3 || wtype == 8;
}

/* Whether qmatmul's decode-sized products of weight type wtype take x
 * rounded to 16 bits under the set p (PV_ACT16). */
static inline int pv_qmatmul_act16(const pv_kernel_params *p, int wtype)
{
    return pv_qmatmul_has_act16(wtype) && p->value[PV_KPARAM_ACT16];
}

/* kernels/qmatmul.cl's decode-sized products: the token class of a call
 * of n_tokens (<= 16), the kernel "pv_qmatmul_fused_<class>" or
 * "pv_qmatmul_swiglu_<class>", and (pv_qmv_rows) the rows of W each of its
 * work-groups takes (as the kernels are instantiated there, times the row
 * lanes). */
static inline int pv_qmv_token_class(int64_t n_tokens)
{
    return n_tokens <= 1 ? 1 : n_tokens <= 4 ? 4 : 16;
}

/* Under the parameter set p: PV_QMV_ROWS at one token, 4 at up to 4, 2
 * at up to 16, for each of PV_QMV_LANES lanes. */
static inline int pv_qmv_rows(const pv_kernel_params *p, int token_class)
{
    const int lane_rows = token_class == 1 ? p->value[PV_KPARAM_QMV_ROWS] : token_class == 4 ? 4 : 2;
    return lane_rows * p->value[PV_KPARAM_QMV_LANES];
}

#endif
