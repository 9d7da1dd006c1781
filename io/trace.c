/*
 * io/trace.c — loom_trace_start / loom_trace_stop: the spans a program
 * recorded (engine/trace.h), gathered from every rank to rank 0 through the
 * process group's host collectives (engine/io_view.h) and written as one Chrome trace (the
 * "traceEvents" JSON that chrome://tracing and ui.perfetto.dev read), a
 * track (pid) per rank with a "compute" and a "comm" thread.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>

#include "engine/io_view.h"
#include "graph/ops/ops.h"

enum { TID_COMPUTE = 0, TID_COMM = 1 };

/* The ranks a trace covers: the data-parallel world, or with pipeline
 * stages the whole group (plan.world and plan.rank are then a stage's
 * replicas), so that every stage is a track of the one file. */
static int trace_world(const loom_program *p)
{
	loom_stage_info si;
	loom_io_stages(p, &si);
	return si.stages * si.replicas;
}

static int trace_rank(const loom_program *p)
{
	loom_stage_info si;
	loom_io_stages(p, &si);
	return si.group_rank;
}

/* Whether the ranks' spans cross the group's host collectives. */
static int host_comm(const loom_program *p)
{
	return trace_world(p) > 1 && loom_io_has_host(p);
}

loom_status loom_trace_start(loom_program *p, const char *path)
{
	loom_train_state *ts = loom_io_state(p);
	if (!loom_io_usable(p))
		return LOOM_ERR_INVALID;
	loom_io_clear_error(p);
	if (ts->trace)
		return loom_program_fail(p, LOOM_ERR_STATE, "trace_start: a trace is already on");
	loom_trace *t = calloc(1, sizeof(*t));
	if (!t)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "trace_start: out of memory");
	/* Rank 0 creates the file now, so that a bad path fails here on
	 * every rank rather than after the runs. */
	int ok = 1, err = 0;
	if (trace_rank(p) == 0) {
		snprintf(t->path, sizeof(t->path), "%s", path ? path : "");
		if (!path || !(t->out = fopen(path, "w"))) {
			ok = 0;
			err = path ? errno : EINVAL;
		}
	}
	t->origin = loom_trace_now();
	if (host_comm(p)) {
		loom_status st = loom_io_host_broadcast(p, &ok, sizeof(ok), 0, "trace_start");
		if (st != LOOM_OK) {
			loom_trace_free(t);
			return st;
		}
	}
	if (!ok) {
		loom_trace_free(t);
		if (trace_rank(p) == 0)
			return loom_program_fail(p, LOOM_ERR_IO, "trace_start: cannot create '%s': %s",
						 path ? path : "(null)", strerror(err));
		return loom_program_fail(p, LOOM_ERR_IO, "trace_start: rank 0 cannot create its file");
	}
	ts->trace = t;
	return LOOM_OK;
}

/* ------------------------------------------------------------ writing */

static void json_str(FILE *f, const char *s)
{
	fputc('"', f);
	for (; *s; s++) {
		unsigned char ch = (unsigned char)*s;
		if (ch == '"' || ch == '\\')
			fprintf(f, "\\%c", ch);
		else if (ch < 0x20)
			fprintf(f, "\\u%04x", ch);
		else
			fputc(ch, f);
	}
	fputc('"', f);
}

static int relu_fused(const loom_node *n)
{
	return ((n->op == LOOM_OP_MAXPOOL2D || n->op == LOOM_OP_MAXPOOL2D_BWD) && n->a.pool.relu) ||
	       (n->op == LOOM_OP_LINEAR && n->a.mm.relu) ||
	       (n->op == LOOM_OP_BATCHNORM2D && n->a.bn.relu) || (n->op == LOOM_OP_ADD && n->a.ew.relu);
}

/* The event's head: name, category, phase X, track, times (microseconds
 * from the origin). */
static void head(FILE *f, const char *name, const char *cat, int pid, int tid,
		 const loom_span *s, double origin)
{
	fprintf(f, ",\n{\"name\":");
	json_str(f, name);
	fprintf(f, ",\"cat\":\"%s\",\"ph\":\"X\",\"pid\":%d,\"tid\":%d,\"ts\":%.3f,\"dur\":%.3f",
		cat, pid, tid, (s->t0 - origin) * 1e6, (s->t1 - s->t0) * 1e6);
}

static void node_event(FILE *f, const loom_plan *pl, int pid, const loom_span *s, double origin)
{
	const loom_node *n = &pl->g->nodes[s->id];
	char name[128], lb[96], sh[96];
	snprintf(name, sizeof(name), "%s%s #%d", loom_op_defs[n->op]->name,
		 relu_fused(n) ? "+relu" : "", (int)s->id);
	head(f, name, (n->flags & LOOM_NODE_BACKWARD) ? "backward" : "forward", pid, TID_COMPUTE, s,
	     origin);
	fprintf(f, ",\"args\":{\"node\":%d,\"run\":%d,\"label\":", (int)s->id, s->run);
	json_str(f, loom_node_label(pl->g, s->id, lb, sizeof(lb)));
	fprintf(f, ",\"dtype\":\"%s\",\"shape\":\"%s\",\"sources\":\"", loom_dtype_name(n->dtype),
		loom_shape_str(&n->shape, sh, sizeof(sh)));
	for (int i = 0; i < n->nsrc; i++)
		fprintf(f, "%s%s %s", i ? ", " : "", loom_dtype_name(pl->g->nodes[n->src[i]].dtype),
			loom_shape_str(&pl->g->nodes[n->src[i]].shape, sh, sizeof(sh)));
	fprintf(f, "\"");
	/* What the node makes besides its own value (fused siblings). */
	loom_value w = loom_sibling_first(pl, s->id);
	if (w != LOOM_NONE) {
		fprintf(f, ",\"also_makes\":\"");
		for (int i = 0; w != LOOM_NONE; w = loom_sibling_next(pl, w), i++)
			fprintf(f, "%s%s #%d", i ? ", " : "", loom_op_defs[pl->g->nodes[w].op]->name,
				(int)w);
		fprintf(f, "\"");
	}
	fprintf(f, "}}");
}

static const char *const mode_name[] = { "train", "grad", "forward", "eval", "accumulate" };
static const char *const phase_name[] = { "forward", "backward", "optimizer" };

/* A span of another pipeline stage: its accumulation segments, buckets and
 * the nodes it added after the cut (its buckets') are its own plan's, which
 * this rank has not: named by number only. */
static void foreign_event(FILE *f, const loom_plan *pl, int pid, const loom_span *s, double origin)
{
	char name[128];
	switch (s->kind) {
	case LOOM_SPAN_ACCUM:
		snprintf(name, sizeof(name), "%s segment %d", s->aux ? "fold sum into" : "accumulate",
			 s->id);
		head(f, name, "accumulate", pid, TID_COMPUTE, s, origin);
		fprintf(f, ",\"args\":{\"segment\":%d,\"run\":%d}}", s->id, s->run);
		return;
	case LOOM_SPAN_ALLREDUCE:
		snprintf(name, sizeof(name), "%s bucket %d", loom_coll_name((loom_coll_op)s->aux), s->id);
		head(f, name, "comm", pid, TID_COMM, s, origin);
		fprintf(f, ",\"args\":{\"bucket\":%d,\"run\":%d}}", s->id, s->run);
		return;
	default: /* a node past the cut's graph */
		snprintf(name, sizeof(name), "node #%d", s->id);
		head(f, name, "node", pid, TID_COMPUTE, s, origin);
		fprintf(f, ",\"args\":{\"node\":%d,\"run\":%d}}", s->id, s->run);
		return;
	}
}

/* si: the pipeline's stages, else NULL. */
static void span_event(FILE *f, const loom_plan *pl, const loom_stage_info *si, int pid,
		       const loom_span *s, double origin)
{
	char name[128];
	if (si && pid % si->stages != si->stage &&
	    (s->kind == LOOM_SPAN_ACCUM || s->kind == LOOM_SPAN_ALLREDUCE ||
	     (s->kind == LOOM_SPAN_NODE && s->id >= si->n_graph))) {
		foreign_event(f, pl, pid, s, origin);
		return;
	}
	switch (s->kind) {
	case LOOM_SPAN_RUN:
		if (s->id == LOOM_RUN_TRAIN)
			snprintf(name, sizeof(name), "train step %d", s->aux);
		else if (s->id == LOOM_RUN_ACCUMULATE)
			snprintf(name, sizeof(name), "accumulate micro-step %d", s->aux);
		else
			snprintf(name, sizeof(name), "%s",
				 s->id >= 0 && s->id < LOOM_RUN_MODE_COUNT ? mode_name[s->id] : "run");
		head(f, name, "run", pid, TID_COMPUTE, s, origin);
		fprintf(f, ",\"args\":{\"run\":%d}}", s->run);
		return;
	case LOOM_SPAN_PHASE:
		head(f, s->id >= 0 && s->id < 3 ? phase_name[s->id] : "phase", "phase", pid,
		     TID_COMPUTE, s, origin);
		fprintf(f, ",\"args\":{\"run\":%d}}", s->run);
		return;
	case LOOM_SPAN_NODE:
		node_event(f, pl, pid, s, origin);
		return;
	case LOOM_SPAN_WAIT:
		head(f, "wait for all-reduces", "comm", pid, TID_COMPUTE, s, origin);
		fprintf(f, ",\"args\":{\"run\":%d}}", s->run);
		return;
	case LOOM_SPAN_ACCUM:
		if (pl->buckets.n > 0)
			snprintf(name, sizeof(name), "%s bucket %d", s->aux ? "fold sum into" : "accumulate",
				 s->id);
		else
			snprintf(name, sizeof(name), "%s %s", s->aux ? "fold sum into" : "accumulate",
				 pl->g->nodes[pl->accum[s->id].v].name[0] ?
					 pl->g->nodes[pl->accum[s->id].v].name : "gradient");
		head(f, name, "accumulate", pid, TID_COMPUTE, s, origin);
		fprintf(f, ",\"args\":{\"segment\":%d,\"elements\":%lld,\"run\":%d}}", s->id,
			(long long)pl->accum[s->id].count, s->run);
		return;
	case LOOM_SPAN_ALLREDUCE: {
		const loom_bucket *b = &pl->buckets.b[s->id];
		snprintf(name, sizeof(name), "%s bucket %d", loom_coll_name((loom_coll_op)s->aux), s->id);
		head(f, name, "comm", pid, TID_COMM, s, origin);
		fprintf(f, ",\"args\":{\"bucket\":%d,\"node\":%d,\"dtype\":\"%s\",\"bytes\":%zu,"
			   "\"gradients\":%d,\"run\":%d}}",
			s->id, (int)b->node, loom_dtype_name(b->dtype), b->bytes, b->n, s->run);
		return;
	}
	case LOOM_SPAN_RECV: {
		char lb[96];
		snprintf(name, sizeof(name), "receive %s, micro-batch %d",
			 loom_node_label(pl->g, s->id, lb, sizeof(lb)), s->aux);
		head(f, name, "comm", pid, TID_COMPUTE, s, origin);
		fprintf(f, ",\"args\":{\"value\":%d,\"micro\":%d,\"run\":%d}}", s->id, s->aux,
			s->run);
		return;
	}
	case LOOM_SPAN_COPY:
		snprintf(name, sizeof(name), "gathered parameters of bucket %d", s->id);
		head(f, name, "optimizer", pid, TID_COMPUTE, s, origin);
		fprintf(f, ",\"args\":{\"bucket\":%d,\"run\":%d}}", s->id, s->run);
		return;
	default:
		return;
	}
}

static void meta(FILE *f, int pid, int tid, const char *what, const char *name)
{
	fprintf(f, ",\n{\"name\":\"%s\",\"ph\":\"M\",\"pid\":%d,\"tid\":%d,\"args\":{\"name\":\"%s\"}}",
		what, pid, tid, name);
}

/* spans: world blocks of stride spans each, counts[r] used in block r. */
static loom_status write_trace(loom_program *p, loom_trace *t, const loom_span *spans,
			       size_t stride, const int64_t *counts, int64_t lost)
{
	FILE *f = t->out;
	const loom_plan *pl = loom_io_plan(p);
	loom_stage_info si;
	const loom_stage_info *staged = loom_io_stages(p, &si) ? &si : NULL;
	char name[64];
	/* Every later event starts with a comma: the first is a label. */
	fprintf(f, "{\"traceEvents\":[\n{\"name\":\"process_labels\",\"ph\":\"M\",\"pid\":0,"
		   "\"args\":{\"labels\":\"loom\"}}");
	int world = trace_world(p);
	for (int r = 0; r < world; r++) {
		if (staged)
			snprintf(name, sizeof(name), "rank %d (stage %d)", r, r % si.stages);
		else
			snprintf(name, sizeof(name), "rank %d", r);
		meta(f, r, 0, "process_name", name);
		fprintf(f, ",\n{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,"
			   "\"args\":{\"sort_index\":%d}}", r, r);
		meta(f, r, TID_COMPUTE, "thread_name", "compute");
		meta(f, r, TID_COMM, "thread_name", "comm");
		for (int64_t i = 0; i < counts[r]; i++)
			span_event(f, pl, staged, r, &spans[(size_t)r * stride + (size_t)i], t->origin);
	}
	fprintf(f, "\n],\n\"displayTimeUnit\":\"ms\",\n\"otherData\":{\"world\":%d,\"backend\":",
		world);
	json_str(f, loom_io_backend(p));
	fprintf(f, ",\"lost_spans\":%lld}}\n", (long long)lost);
	int bad = ferror(f);
	bad |= fclose(f) != 0;
	t->out = NULL;
	if (bad)
		return loom_program_fail(p, LOOM_ERR_IO, "trace_stop: writing '%s' failed", t->path);
	return LOOM_OK;
}

/* Every rank's spans to every rank (rank 0 writes them): the counts, then
 * the spans padded to the longest list, through the host collectives. */
static loom_status gather(loom_program *p, loom_trace *t)
{
	const char *what = "trace_stop: gathering the ranks' spans";
	int world = trace_world(p);
	int64_t mine[2] = { (int64_t)t->n, t->lost }, max = 0, lost = 0;
	int64_t *meta_all = malloc(sizeof(int64_t) * 2 * (size_t)world);
	int64_t *counts = malloc(sizeof(int64_t) * (size_t)world);
	loom_span *pad = NULL, *all = NULL;
	loom_status st = LOOM_ERR_NOMEM;
	if (!meta_all || !counts)
		goto out;
	if ((st = loom_io_host_allgather(p, mine, sizeof(mine), meta_all, what)) != LOOM_OK)
		goto out;
	for (int r = 0; r < world; r++) {
		counts[r] = meta_all[2 * r];
		lost += meta_all[2 * r + 1];
		if (counts[r] > max)
			max = counts[r];
	}
	pad = calloc(max ? (size_t)max : 1, sizeof(*pad));
	all = malloc(sizeof(*all) * (size_t)world * (max ? (size_t)max : 1));
	/* Out of memory here, this rank leaves the collective; the others
	 * then fail on the group's timeout rather than hang. */
	if (!pad || !all) {
		st = LOOM_ERR_NOMEM;
		goto out;
	}
	if (t->n)
		memcpy(pad, t->span, sizeof(*pad) * t->n);
	if (max > 0 &&
	    (st = loom_io_host_allgather(p, pad, sizeof(*pad) * (size_t)max, all, what)) != LOOM_OK)
		goto out;
	if (st == LOOM_OK && trace_rank(p) == 0)
		st = write_trace(p, t, all, (size_t)max, counts, lost);
out:
	if (st == LOOM_ERR_NOMEM)
		loom_program_fail(p, st, "trace_stop: out of memory");
	free(meta_all);
	free(counts);
	free(pad);
	free(all);
	return st;
}

loom_status loom_trace_stop(loom_program *p)
{
	loom_train_state *ts = loom_io_state(p);
	if (!loom_io_usable(p))
		return LOOM_ERR_INVALID;
	loom_io_clear_error(p);
	loom_trace *t = ts->trace;
	if (!t)
		return loom_program_fail(p, LOOM_ERR_STATE, "trace_stop: no trace was started");
	ts->trace = NULL;
	loom_status st;
	if (host_comm(p)) {
		st = gather(p, t);
	} else {
		int64_t count = (int64_t)t->n;
		st = write_trace(p, t, t->span, t->n, &count, t->lost);
	}
	loom_trace_free(t);
	return st;
}
