/*
 * engine/cpu/bf16_node.h — the CPU backend's hook for native bf16 products
 * (bf16_node.c), called from one place in backend.c's half emulation.
 */
#ifndef LOOM_ENGINE_CPU_BF16_NODE_H
#define LOOM_ENGINE_CPU_BF16_NODE_H

#include "engine/plan.h"

/*
 * Runs node v on native bf16 kernels if it is a conv, linear or matmul with
 * bf16 matrix sources and the CPU has avx512_bf16; src are its sources' and
 * out its own buffer, ws the scratch the backend reserved for its emulation.
 * Returns 1 if it ran the node (out written), 0 if the caller must emulate.
 */
int loom_cpu_bf16_node(const loom_plan *p, loom_value v, void *const *src, void *out, void *ws);

#endif /* LOOM_ENGINE_CPU_BF16_NODE_H */
