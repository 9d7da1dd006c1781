/*
 * engine/formats.c — the format pass (graph/formats.c) run for a program:
 * the backend answers which formats each node takes (its node_formats;
 * without one, NCHW only, so its plans are unchanged), and
 * loom_compile_opts.formats or LOOM_FORMATS=nchw|auto turns the pass off.
 */
#include <stdlib.h>
#include <string.h>

#include "base/options.h"
#include "engine/pass.h"
#include "engine/program_internal.h"

typedef struct format_query {
	const loom_backend *be;
	void *be_ctx;
	const loom_plan *plan;
} format_query;

/* Whether the backend answers node_formats (else NCHW only). */
static int has_formats(const loom_backend *be)
{
	return be->planning && be->planning->node_formats;
}

static void ask_backend(void *ctx, const loom_graph *g, loom_value v, loom_format_caps *caps)
{
	const format_query *q = ctx;
	(void)g; /* the plan's graph */
	q->be->planning->node_formats(q->be_ctx, q->plan, v, caps);
}

int loom_formats_on(const loom_compile_opts *o)
{
	int c = loom_opt_choice(LOOM_OPT_FORMATS); /* nchw|auto */
	if (c >= 0)
		return c == 1;
	return o->formats == LOOM_FORMATS_AUTO;
}

loom_status loom_plan_formats(loom_program *p)
{
	loom_plan *pl = &p->plan;
	/* Pipeline stages cut the graph by node; they keep NCHW for now. */
	if (!has_formats(p->be) || !loom_formats_on(&pl->opts) || pl->opts.pipeline_stages > 1)
		return LOOM_OK;
	format_query q = { p->be, p->be_ctx, pl };
	int n_fwd = pl->n_fwd;
	loom_status st = loom_formats_pass(pl->g, &n_fwd, &pl->loss, ask_backend, &q,
					   &pl->n_reorders);
	pl->n_fwd = n_fwd;
	return st;
}

/* The pass: after the fusions (a fused relu runs in its producer's
 * format), before the slots and the memory plan (a reorder is a value the
 * plan places). */
static int formats_wanted(const loom_program *p)
{
	return has_formats(p->be) && loom_formats_on(&p->plan.opts) &&
	       p->plan.opts.pipeline_stages <= 1;
}

static loom_status formats_run(loom_program *p, loom_pass_ctx *c)
{
	(void)c;
	loom_status st = loom_plan_formats(p);
	if (st != LOOM_OK)
		return loom_program_fail(p, st, "%s", p->plan.g->err.msg);
	return LOOM_OK;
}

const loom_pass loom_pass_formats = { .name = "formats", .wanted = formats_wanted,
				      .run = formats_run };
