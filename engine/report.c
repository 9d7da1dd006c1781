/*
 * engine/report.c — what a person can look at of a compiled program: the plan
 * as a Graphviz graph (loom_program_dump_dot) and where its memory goes
 * (loom_program_memory_report), both decided before step 1; and what
 * mixed precision did in the last step (loom_amp_report: the loss scale,
 * fp8's per-tensor scales, amaxes and saturation).
 */
#include <stdio.h>
#include <string.h>

#include "engine/pass.h"
#include "engine/program_internal.h"
#include "graph/ops/ops.h"

/* Fill colours by precision: fp32 blue, fp16 orange, bf16 gold. */
static const char *dtype_colour(loom_dtype dt)
{
	switch (dt) {
	case LOOM_F32:
		return "#cfe2ff";
	case LOOM_F16:
		return "#ffd8a8";
	case LOOM_BF16:
		return "#fff3bf";
	case LOOM_F64:
		return "#dee2e6";
	default:
		return "#ffffff";
	}
}

/* The fusion a node carries, or NULL. */
static const char *fused_note(const loom_program *p, loom_value v)
{
	const loom_node *n = &p->plan.g->nodes[v];
	if ((n->op == LOOM_OP_MAXPOOL2D || n->op == LOOM_OP_MAXPOOL2D_BWD) && n->a.pool.relu)
		return "relu fused";
	if ((n->op == LOOM_OP_LINEAR && n->a.mm.relu) ||
	    (n->op == LOOM_OP_BATCHNORM2D && n->a.bn.relu) || (n->op == LOOM_OP_ADD && n->a.ew.relu))
		return "relu fused";
	if (n->flags & LOOM_NODE_ACCUM)
		return "adds into the other gradient";
	return NULL;
}

/* A label safe inside a double-quoted dot string. */
static void dot_escape(char *s)
{
	for (; *s; s++)
		if (*s == '"' || *s == '\\')
			*s = '\'';
}

/* The steps that are not nodes, in the executor's order: each collective
 * hangs off its bucket's node on the comm stream; the rest are listed. */
static void dot_steps(const loom_program *p, FILE *out)
{
	const loom_plan *pl = &p->plan;
	int listed = 0;
	for (int i = 0; i < pl->n_steps; i++) {
		const loom_step *s = &pl->steps[i];
		if (s->kind == LOOM_STEP_COLLECTIVE)
			fprintf(out, "  s%d [shape=ellipse, fillcolor=\"#d3f9d8\", label=\"step %d: %s "
				     "bucket %d\\ncomm stream\"];\n  n%d -> s%d [style=dashed];\n",
				i, i, loom_coll_name(s->coll), s->index, (int)s->v, i);
		listed += s->kind != LOOM_STEP_NODE;
	}
	if (!listed)
		return;
	fprintf(out, "  steps [shape=note, fillcolor=\"#f1f3f5\", label=\"steps besides the nodes "
		     "(%d in all)\\l", pl->n_steps);
	/* A run of steps of one kind (every gradient's accumulation, every
	 * bucket's all-gather) is one line. */
	for (int i = 0; i < pl->n_steps; i++) {
		const loom_step *s = &pl->steps[i];
		if (s->kind == LOOM_STEP_NODE)
			continue;
		int j = i;
		while (j + 1 < pl->n_steps && pl->steps[j + 1].kind == s->kind &&
		       pl->steps[j + 1].coll == s->coll && s->kind != LOOM_STEP_OPTIM &&
		       s->kind != LOOM_STEP_WAIT)
			j++;
		if (j > i)
			fprintf(out, "%d-%d: %s", i, j, loom_step_kind_name(s->kind));
		else
			fprintf(out, "%d: %s", i, loom_step_kind_name(s->kind));
		if (s->kind == LOOM_STEP_COLLECTIVE)
			fprintf(out, " %s", loom_coll_name(s->coll));
		if (s->kind == LOOM_STEP_ACCUM || s->kind == LOOM_STEP_COPY ||
		    s->kind == LOOM_STEP_COLLECTIVE)
		{
			if (j > i)
				fprintf(out, " %d..%d", s->index, pl->steps[j].index);
			else
				fprintf(out, " %d", s->index);
		}
		else if (s->kind == LOOM_STEP_OPTIM)
			fprintf(out, " pieces [%d, %d)", s->first, s->last);
		fprintf(out, "\\l");
		i = j;
	}
	fprintf(out, "\"];\n");
}

void loom_program_dump_dot(const loom_program *p, FILE *out)
{
	char lb[96], sh[96];
	if (!loom_program_usable(p) || !out)
		return;
	fprintf(out, "digraph loom_plan {\n");
	fprintf(out, "  graph [rankdir=TB, fontname=\"Helvetica\", label=\"loom plan: %d nodes "
		     "(%d forward), %s\"];\n",
		p->plan.g->n, p->plan.n_fwd, p->be->describe(p->be_ctx));
	fprintf(out, "  node [shape=box, style=\"rounded,filled\", fontname=\"Helvetica\", "
		     "fontsize=10];\n  edge [fontname=\"Helvetica\", fontsize=8];\n");
	fprintf(out, "  legend [shape=plaintext, style=\"\", label=<<table border=\"0\">"
		     "<tr><td bgcolor=\"%s\">fp32</td><td bgcolor=\"%s\">fp16</td>"
		     "<td bgcolor=\"%s\">bf16</td></tr></table>>];\n",
		dtype_colour(LOOM_F32), dtype_colour(LOOM_F16), dtype_colour(LOOM_BF16));
	for (int v = 0; v < p->plan.g->n; v++) {
		const loom_node *n = &p->plan.g->nodes[v];
		const char *fused = fused_note(p, v);
		loom_node_label(p->plan.g, v, lb, sizeof(lb));
		dot_escape(lb);
		fprintf(out, "  n%d [label=\"%d: %s\\n%s %s", v, v, lb, loom_dtype_name(n->dtype),
			loom_shape_str(&n->shape, sh, sizeof(sh)));
		if (fused)
			fprintf(out, "\\n(%s)", fused);
		if (loom_made_earlier(&p->plan, v))
			fprintf(out, "\\n(made by %d)", (int)n->made_by);
		fprintf(out, "\\n%c+%zu\", fillcolor=\"%s\"",
			loom_region_letter(p->plan.mp.region[v]), p->plan.mp.offset[v],
			dtype_colour(n->dtype));
		if (loom_op_is_leaf(n->op))
			fprintf(out, ", shape=%s", n->op == LOOM_OP_INPUT ? "invhouse" : "cylinder");
		if (fused || loom_made_earlier(&p->plan, v))
			fprintf(out, ", penwidth=2.5, color=\"#c92a2a\"");
		if (n->flags & LOOM_NODE_AMP)
			fprintf(out, ", style=\"rounded,filled,dashed\"");
		fprintf(out, "];\n");
		for (int i = 0; i < n->nsrc; i++) {
			loom_value s = n->src[i];
			if (s < 0)
				continue;
			fprintf(out, "  n%d -> n%d [label=\"%s\"%s];\n", (int)s, v,
				loom_shape_str(&p->plan.g->nodes[s].shape, sh, sizeof(sh)),
				(n->flags & LOOM_NODE_BACKWARD) ? ", color=\"#868e96\"" : "");
		}
		if (loom_made_earlier(&p->plan, v))
			fprintf(out, "  n%d -> n%d [style=dotted, arrowhead=none, label=\"same call\"];\n",
				(int)n->made_by, v);
	}
	dot_steps(p, out);
	fprintf(out, "}\n");
}

static void mib_line(FILE *out, const char *what, size_t bytes, const char *note)
{
	fprintf(out, "  %-24s %12.3f MiB%s%s\n", what, bytes / 1048576.0, note ? "  " : "",
		note ? note : "");
}

/* amp.fp8's scales and histories: host memory beside the loss scaler's
 * state, counted before step 1 (none without fp8); a backend that keeps
 * delayed scaling's state on the device holds a copy there (and the
 * packed amaxes of the reduction over the ranks). */
static void fp8_scales_line(const loom_program *p, FILE *out)
{
	char note[160];
	if (p->ts.fp8.n == 0)
		return;
	if (p->ts.fp8.delayed)
		snprintf(note, sizeof(note), "(%d tensors, delayed scaling: amax history of %d steps%s)",
			 p->ts.fp8.n, p->ts.fp8.history_len,
			 p->be->fp8 ? "; and a copy on the device" : "");
	else
		snprintf(note, sizeof(note), "(%d tensors, current scaling)", p->ts.fp8.n);
	mib_line(out, "fp8 scales", loom_fp8_state_bytes(&p->ts.fp8), note);
}

/* amp.fp8's roundings kept in fp8 (LOOM_FP8_STORAGE), among the
 * activations above: their bytes, and what their dtype would have taken
 * more (none without). */
static void fp8_storage_line(const loom_program_info *info, FILE *out)
{
	char note[128];
	if (info->n_fp8_stored == 0)
		return;
	snprintf(note, sizeof(note), "(%d tensors kept in 1 byte: %.3f MiB saved)",
		 info->n_fp8_stored, info->fp8_saved_bytes / 1048576.0);
	mib_line(out, "fp8 storage", info->fp8_stored_bytes, note);
}

void loom_program_memory_report(const loom_program *p, FILE *out)
{
	loom_program_info info;
	char note[128];
	if (!loom_program_usable(p) || !out)
		return;
	loom_program_info_get(p, &info);
	/* Without planning, every activation would have a buffer of its own
	 * and so would every kernel's scratch. */
	size_t kept = p->plan.mp.persist_bytes + p->plan.mp.bucket_bytes; /* buckets hold gradients */
	size_t naive = kept + p->plan.mp.act_naive_bytes + p->plan.ws_bytes +
		       loom_plan_state_region_bytes(&p->plan);
	/* Whole masters are persistent values; sharded ones (ZeRO) are not. */
	size_t whole_masters = info.master_bytes > p->plan.master_shard_bytes ?
				       info.master_bytes - p->plan.master_shard_bytes : 0;
	size_t other = kept - info.param_bytes - info.grad_bytes - whole_masters;
	if (kept < info.param_bytes + info.grad_bytes + whole_masters)
		other = 0;
	/* ZeRO-3: no parameter is persistent (its shards are the state
	 * region's or after the buckets) */
	if (p->plan.zero == 3)
		other = p->plan.mp.persist_bytes;
	fprintf(out, "memory of the compiled plan (%s, %d nodes, %d parameters, %lld elements):\n",
		info.backend, info.n_nodes, info.n_params, (long long)info.n_param_elems);
	snprintf(note, sizeof(note), "(ZeRO-%d: this rank's shard, 1/%d)", p->plan.zero,
		 p->plan.world);
	mib_line(out, "parameters", info.param_bytes, p->plan.zero == 3 ? note : NULL);
	mib_line(out, "master weights (fp32)", info.master_bytes,
		 p->plan.master_shard_bytes ? note : NULL);
	char gnote[128];
	size_t shards = 0; /* ZeRO-2: this rank's gradient shards, kept to the step's end */
	for (int k = 0; k < p->plan.buckets.n; k++)
		shards += (size_t)(p->plan.buckets.b[k].count / p->plan.world) *
			  loom_dtype_size(p->plan.buckets.b[k].dtype);
	snprintf(gnote, sizeof(gnote), "(ZeRO-%d: this rank's shards %.3f MiB, the rest buckets "
		 "in flight)", p->plan.zero, shards / 1048576.0);
	mib_line(out, "gradients", info.grad_bytes, p->plan.zero >= 2 ? gnote : NULL);
	mib_line(out, "optimizer state", info.optim_state_bytes, p->plan.zero ? note : NULL);
	mib_line(out, "inputs, buffers, outputs", other, NULL);
	snprintf(note, sizeof(note), "(%.3f MiB with one buffer each)",
		 info.activation_naive_bytes / 1048576.0);
	/* A strategy's place for this rank (a pipeline stage's activation
	 * slots), as its pass words it: " (...)". */
	const loom_pass *ps = LOOM_PASS_WITH(p, note);
	char where[96] = "";
	if (ps)
		ps->note(p, where, sizeof(where));
	if (where[0])
		snprintf(note, sizeof(note), "%s", where + (where[0] == ' '));
	if (info.n_recomputed > 0 && !where[0])
		snprintf(note, sizeof(note), "(%.3f MiB with one buffer each; %d values made again "
			 "in the backward)", info.activation_naive_bytes / 1048576.0,
			 info.n_recomputed);
	mib_line(out, "activations (reused)", info.activation_bytes, note);
	fp8_storage_line(&info, out);
	if (p->plan.zero == 3) {
		/* the gathered buckets, placed among the activations */
		char gn[160];
		snprintf(gn, sizeof(gn), "(ZeRO-3: %d gathers of parameter buckets, in the "
			 "activations)", p->plan.n_gathers);
		mib_line(out, "gathered at once (peak)", p->plan.gathered_peak, gn);
	}
	mib_line(out, "workspace", p->plan.ws_bytes, NULL);
	fp8_scales_line(p, out);
	/* Not in the arena: made by the first LOOM_RUN_ACCUMULATE only. */
	mib_line(out, "accumulation sums", p->plan.accum_bytes,
		 p->arena.accum ? "(gradient accumulation; allocated, outside the arena)" :
				  "(gradient accumulation; allocated at the first ACCUMULATE)");
	snprintf(note, sizeof(note), "(naive %.3f MiB: %.1f%% saved)", naive / 1048576.0,
		 naive ? 100.0 * (1.0 - (double)info.arena_bytes / (double)naive) : 0.0);
	mib_line(out, "peak (the arena)", info.arena_bytes, note);
	fprintf(out, "compute of one step: %.4f GFLOP (forward %.4f, backward %.4f; the products "
		     "of conv, linear and matmul nodes)\n",
		(info.flops_fwd + info.flops_bwd) * 1e-9, info.flops_fwd * 1e-9,
		info.flops_bwd * 1e-9);
}

int loom_fp8_tensor_count(const loom_program *p)
{
	return loom_program_usable(p) ? p->ts.fp8.n : 0;
}

loom_status loom_fp8_tensor_get(const loom_program *p, int i, loom_fp8_tensor_info *out)
{
	if (!loom_program_usable(p) || !out)
		return LOOM_ERR_INVALID;
	loom_status st = loom_exec_fp8_host((loom_program *)p);
	if (st != LOOM_OK)
		return st;
	const loom_fp8_state *fs = &p->ts.fp8;
	if (i < 0 || i >= fs->n)
		return loom_program_fail((loom_program *)p, LOOM_ERR_INVALID,
					 "fp8 tensor %d: the plan scales %d tensors", i, fs->n);
	const loom_fp8_tensor *t = &fs->t[i];
	*out = (loom_fp8_tensor_info){
		.name = p->plan.g->nodes[fs->node[i]].name,
		.node = fs->node[i],
		.format = (loom_dtype)t->fmt,
		.scale = t->last_scale,
		.amax = t->last_amax,
		.next_scale = fs->delayed ? t->scale : 0,
		.saturated = t->last_saturated,
	};
	return LOOM_OK;
}

void loom_amp_report(const loom_program *p, FILE *out)
{
	/* a device's copy of the state first (the host view; waits) */
	if (!loom_program_usable(p) || !out || loom_exec_fp8_host((loom_program *)p) != LOOM_OK)
		return;
	const loom_fp8_state *fs = &p->ts.fp8;
	fprintf(out, "amp: loss scale %g, %lld steps skipped\n", (double)p->ts.scaler.scale,
		(long long)p->ts.scaler.skipped_steps);
	if (fs->n == 0)
		return;
	fprintf(out, "amp: fp8, %s scaling; per scaled tensor, the last step:\n",
		fs->delayed ? "delayed" : "current");
	fprintf(out, "  %-6s %-32s %5s %12s %12s %12s %10s\n", "node", "tensor", "fmt", "scale",
		"amax", "next scale", "saturated");
	for (int i = 0; i < fs->n; i++) {
		loom_fp8_tensor_info ti;
		char next[24] = "-";
		loom_fp8_tensor_get(p, i, &ti);
		if (fs->delayed)
			snprintf(next, sizeof(next), "%g", ti.next_scale);
		fprintf(out, "  %-6d %-32s %5s %12g %12g %12s %10lld\n", ti.node, ti.name,
			ti.format == LOOM_FP8_E4M3 ? "e4m3" : "e5m2", ti.scale, ti.amax, next,
			(long long)ti.saturated);
	}
}
