/*
 * tests/engine/gpt_plan.c — gpt_parts.h's plan checks: the parts of the
 * GPT tests that read a compiled program's plan (the fused sums' tests).
 */
#include "engine/program_internal.h"
#include "tests/engine/gpt_parts.h"

int gpt_backward_adds(const loom_program *p)
{
	const loom_graph *g = p->plan.g;
	int n = 0;
	for (loom_value v = 0; v < g->n; v++)
		n += g->nodes[v].op == LOOM_OP_ADD && (g->nodes[v].flags & LOOM_NODE_BACKWARD);
	return n;
}

int gpt_same_bytes(const loom_program *p, loom_value v, loom_value a)
{
	const loom_value r = p->plan.mp.root[a];
	return p->plan.mp.region[v] == p->plan.mp.region[r] &&
	       p->plan.mp.offset[v] == p->plan.mp.offset[r];
}
