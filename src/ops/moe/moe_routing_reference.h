/*
 * moe_routing_reference.h - private: the CPU reference of the MoE routing helpers
 * (metrale/ops_moe.h) and the kernel names every backend ships for them. The CPU backend runs
 * the stages below as CPU kernels of module "metrale" under the CUDA kernels' names and argument
 * lists (kernels/cuda/moe/moe_routing.cu; the lists are in metrale/ops_moe.h).
 */
#ifndef METRALE_MOE_ROUTING_REFERENCE_H
#define METRALE_MOE_ROUTING_REFERENCE_H

#define MG_MOE_KERNEL_TOPK "moe_topk"
#define MG_MOE_KERNEL_SORT_COUNT "moe_sort_count"
#define MG_MOE_KERNEL_SORT_SCAN "moe_sort_scan"
#define MG_MOE_KERNEL_SORT_SCATTER "moe_sort_scatter"
#define MG_MOE_KERNEL_COMBINE "moe_combine"

/* The CUDA kernels' block sizes (their __launch_bounds__): top-k runs one warp per token, the
 * sort's kernels one thread per expert (scan) or per pair of a 256-pair tile, the combine one
 * thread per 8 columns. */
#define MG_MOE_TOPK_THREADS 128u
#define MG_MOE_SORT_THREADS 256u
#define MG_MOE_COMBINE_THREADS 128u

/* Registers the CPU kernels once per process; later calls do nothing. */
void mg_moe_routing_cpu_kernels_register(void);

#endif
