/* Tuned kernel parameters per shape bucket, for the backends that run the
 * portable kernels (OpenCL, CUDA). Backend-internal; the public face is
 * the string API of backend.h ("kernel tuning").
 *
 * The front end owns one pv_kernel_tuning per open backend
 * (pv_backend.tuning): the family defaults, which a backend's init may
 * change within the candidate lists (and cap at its device's work-group
 * limit), and the sets pv_backend_kernel_set stored per bucket. A
 * launcher asks pv_kernel_tuned for its call's bucket, then sets the
 * variants its call needs. Buckets:
 *   attention.hd<64|128|256>.g<1|2|4|8>.<decode|prefill>.<short|long>
 *     head-dim class (PV_MAX_HEAD_DIM), query heads per KV head (rounded
 *     up to a power of two; g8: 8 or more), decode: at most
 *     PV_KERNEL_DECODE_TOKENS query tokens, long: the longest context
 *     (last position + 1) at least PV_KERNEL_LONG_CONTEXT;
 *   gather, qmatmul, recompute: one bucket each (their kernels are copies
 *     and element-wise passes whose best parameters do not depend on the
 *     model's shape). */
#ifndef PV_BACKENDS_KERNEL_TUNING_H
#define PV_BACKENDS_KERNEL_TUNING_H

#include "backends/backend.h"
#include "backends/kernel-params.h"

#define PV_KERNEL_DECODE_TOKENS 8
#define PV_KERNEL_LONG_CONTEXT 1024
/* Every bucket there is: 3 head-dim classes x 4 GQA classes x 2 x 2 for
 * attention, one for each other family. */
#define PV_KERNEL_BUCKETS_MAX (3 * 4 * 2 * 2 + PV_KERNEL_FAMILY_COUNT - 1)
#define PV_KERNEL_BUCKET_NAME_MAX 48

typedef struct pv_kernel_bucket {
    pv_kernel_family family;
    /* attention only, 0 for the other families */
    int head_dim; /* 64, 128, 256 */
    int gqa;      /* 1, 2, 4, 8 */
    int prefill;
    int long_context;
} pv_kernel_bucket;

struct pv_kernel_tuning {
    pv_kernel_params defaults[PV_KERNEL_FAMILY_COUNT];
    int max_work_group; /* the device's limit on PV_WG; 0: none */
    int max_gemm;       /* the largest PV_GEMM (pv_gemm_mode) the backend runs; reset: PV_GEMM_F32 */
    int n;
    pv_kernel_bucket bucket[PV_KERNEL_BUCKETS_MAX];
    pv_kernel_params params[PV_KERNEL_BUCKETS_MAX];
};

/* The table's defaults, no limit, no tuned sets. */
void pv_kernel_tuning_reset(pv_kernel_tuning *t);

/* A backend's own default for one tuned parameter of a family, capped at
 * the work-group limit for PV_WG (the largest listed value not above it);
 * PV_ERR_INVALID_ARG for a value not in the parameter's list. */
pv_status pv_kernel_tuning_default(pv_kernel_tuning *t, pv_kernel_family family, pv_kparam param, int value);

/* The bucket of an attention call (its arguments already checked). */
void pv_kernel_bucket_of_attention(const pv_attention_args *a, pv_kernel_bucket *out);

/* The parameter set calls of bucket b use: its tuned set in t, else the
 * family's defaults (t's, or the table's for t NULL). Variants are 0 for
 * the launcher to fill in. */
pv_kernel_params pv_kernel_tuned(const pv_kernel_tuning *t, const pv_kernel_bucket *b);

/* Products of one x at decode sizes (n_tokens <= fused_max_t, the
 * backend's fused kernels): the index of the first whose weight type
 * takes x rounded under t's qmatmul set (PV_ACT16; x is then rounded once
 * for all such products), or -1, as also for larger batches. */
int pv_qmatmul_group_rounds(const pv_kernel_tuning *t, const pv_qmatmul_args *products, int n, int64_t fused_max_t);

/* Text forms: "attention.hd64.g4.decode.short" and "PV_WG=16 PV_SPLITS=4"
 * (the tuned and launch parameters only, in table order). Parsing refuses
 * anything else with PV_ERR_INVALID_ARG naming the part at fault; a set
 * may name a subset of its family's parameters, the others keep their
 * values in *inout. */
pv_status pv_kernel_bucket_parse(const char *text, pv_kernel_bucket *out);
void pv_kernel_bucket_format(const pv_kernel_bucket *b, char *buf, size_t size);
pv_status pv_kernel_params_parse(const char *text, pv_kernel_params *inout);
void pv_kernel_params_format(const pv_kernel_params *p, char *buf, size_t size);

#endif
