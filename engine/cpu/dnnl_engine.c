/*
 * engine/cpu/dnnl_engine.c — the oneDNN CPU engine (dnnl_engine.h), made
 * once: a CPU engine holds no per-op state, so every path shares it.
 */
#include "engine/cpu/dnnl_engine.h"

#include <pthread.h>
#include <stdlib.h>

#include "engine/cpu/cpu_path.h"

static dnnl_engine_t engine;
static pthread_once_t engine_once = PTHREAD_ONCE_INIT;

static void engine_make(void)
{
	if (dnnl_engine_create(&engine, dnnl_cpu, 0) != dnnl_success)
		engine = NULL;
}

dnnl_engine_t loom_cpu_dnnl_engine(void)
{
	pthread_once(&engine_once, engine_make);
	return engine;
}

void *loom_cpu_dnnl_calloc(size_t size)
{
	if (loom_cpu_isa_get() == LOOM_CPU_ISA_PORTABLE || !loom_cpu_dnnl_engine())
		return NULL;
	return calloc(1, size);
}

void loom_cpu_dnnl_release(dnnl_stream_t stream, int nmem, const dnnl_memory_t *mem, int nprim,
			   const dnnl_primitive_t *prim, int npd, const dnnl_primitive_desc_t *pd)
{
	for (int i = 0; i < nmem; i++)
		if (mem[i])
			dnnl_memory_destroy(mem[i]);
	for (int i = 0; i < nprim; i++)
		if (prim[i])
			dnnl_primitive_destroy(prim[i]);
	for (int i = 0; i < npd; i++)
		if (pd[i])
			dnnl_primitive_desc_destroy(pd[i]);
	if (stream)
		dnnl_stream_destroy(stream);
}
