/* The portable kernels' text, embedded in the library for the run-time
 * compilers of the OpenCL backend and the CUDA backend (NVRTC). kernels/kernel-sources.c is generated at
 * build time (kernels/local.mk) from kernels/dialect.h and the family files;
 * a family's program is the dialect text followed by the family text. */
#ifndef PV_KERNELS_KERNEL_SOURCES_H
#define PV_KERNELS_KERNEL_SOURCES_H

extern const char pv_kernel_source_dialect[];
extern const char pv_kernel_source_attention[];
extern const char pv_kernel_source_gather[];
extern const char pv_kernel_source_qmatmul[];
extern const char pv_kernel_source_recompute[];

#endif
