/*
 * engine/cpu/dnnl_engine.h — the one oneDNN CPU engine that the oneDNN
 * paths (bn_dnnl.c, conv_dnnl.c, matmul_dnnl.c, pool_dnnl.c) make their
 * primitives, memory objects and streams on.
 */
#ifndef LOOM_ENGINE_CPU_DNNL_ENGINE_H
#define LOOM_ENGINE_CPU_DNNL_ENGINE_H

#include <oneapi/dnnl/dnnl.h>

/* The process's engine, made once by whichever thread asks first; NULL
 * when oneDNN cannot make one (each path then declines its node). */
dnnl_engine_t loom_cpu_dnnl_engine(void);

#endif /* LOOM_ENGINE_CPU_DNNL_ENGINE_H */
