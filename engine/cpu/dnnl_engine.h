/*
 * engine/cpu/dnnl_engine.h — the one oneDNN CPU engine that the oneDNN
 * paths (bn_dnnl.c, conv_dnnl.c, matmul_dnnl.c, pool_dnnl.c) make their
 * primitives, memory objects and streams on, and the one way they give
 * them back.
 */
#ifndef LOOM_ENGINE_CPU_DNNL_ENGINE_H
#define LOOM_ENGINE_CPU_DNNL_ENGINE_H

#include <stddef.h>

#include <oneapi/dnnl/dnnl.h>

/* The process's engine, made once by whichever thread asks first; NULL
 * when oneDNN cannot make one (each path then declines its node). */
dnnl_engine_t loom_cpu_dnnl_engine(void);

/* A oneDNN path's object, size bytes zeroed; NULL when this CPU takes no
 * oneDNN path (the portable ISA), oneDNN has no engine, or out of memory:
 * the caller declines its node then. */
void *loom_cpu_dnnl_calloc(size_t size);

/* Destroys a path's oneDNN objects: the memories mem[0..nmem), primitives
 * prim[0..nprim), primitive descriptors pd[0..npd) and the stream, each
 * one that is not NULL (a half-made path gives back what it made). */
void loom_cpu_dnnl_release(dnnl_stream_t stream, int nmem, const dnnl_memory_t *mem, int nprim,
			   const dnnl_primitive_t *prim, int npd, const dnnl_primitive_desc_t *pd);

#endif /* LOOM_ENGINE_CPU_DNNL_ENGINE_H */
