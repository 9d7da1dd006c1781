/*
 * io/checkpoint.c — loom_save / loom_load: a program's parameters,
 * buffers (batch-norm statistics, O2 masters), optimizer state, step,
 * learning rate, loss scaler and fp8 scales in one ckpt_file container. Loading checks
 * everything before it changes anything, so a refused file leaves the
 * program as it was.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "parallel/parallel.h"
#include "parallel/pipeline.h"
#include "io/ckpt_file.h"
#include "engine/program_internal.h"

#define META LOOM_CKPT_META

typedef struct rec_list {
	loom_ckpt_record *r;
	char (*names)[LOOM_NAME_MAX + 16];
	void **host; /* downloaded payloads (owned) */
	/* Each record's bytes in the program: more than the record's own
	 * (the file's) for a padded vocabulary's table and its optimizer
	 * state, whose padding rows are the storage's tail (engine/vocab_pad.c) */
	size_t *full;
	int n;
	int fp8; /* the fp8 scales' record (amp.fp8), else -1 */
} rec_list;

static int is_state(const loom_node *n)
{
	return n->op == LOOM_OP_PARAM || n->op == LOOM_OP_BUFFER;
}

/*
 * amp.fp8's scales and amax histories (amp/fp8_scaling.h), one f32 record
 * "amp.fp8" in loom_fp8_state_pack's layout, so that a resumed run casts as
 * the uninterrupted one. Every rank holds the same state (max-reduced at
 * each step end): rank 0's is saved, and every rank loads it.
 */
static void fp8_record(loom_program *p, rec_list *l)
{
	l->fp8 = -1;
	if (p->ts.fp8.n == 0)
		return;
	loom_ckpt_record *r = &l->r[l->n];
	snprintf(l->names[l->n], sizeof(l->names[0]), "amp.fp8");
	r->name = l->names[l->n];
	r->dtype = LOOM_F32;
	r->ndim = 1;
	r->dims[0] = (int64_t)loom_fp8_state_floats(&p->ts.fp8);
	r->bytes = (size_t)r->dims[0] * sizeof(float);
	l->full[l->n] = r->bytes;
	l->fp8 = l->n++;
}

/* The fp8 record's payload for saving (owned by l->host). */
static loom_status fp8_pack(loom_program *p, rec_list *l)
{
	float *buf = malloc(l->r[l->fp8].bytes);
	if (!buf)
		return LOOM_ERR_NOMEM;
	loom_fp8_state_pack(&p->ts.fp8, buf);
	l->host[l->fp8] = buf;
	l->r[l->fp8].data = buf;
	return LOOM_OK;
}

/* The loaded fp8 record checked (check_only: into scratch copies, before
 * anything changes) or placed into the training state. */
static loom_status fp8_unpack(loom_program *p, const loom_ckpt_record *r, const char *path,
			      int check_only)
{
	char err[256];
	loom_fp8_state probe = p->ts.fp8;
	float *copy = malloc(r->bytes);
	loom_fp8_tensor *t = check_only ? malloc(sizeof(*t) * (size_t)probe.n) : NULL;
	float *h = check_only ? malloc(sizeof(float) * ((size_t)probe.n * probe.history_len + 1)) :
				NULL;
	loom_status st = LOOM_OK;
	if (!copy || (check_only && (!t || !h))) {
		st = loom_program_fail(p, LOOM_ERR_NOMEM, "load %s: out of memory", path);
		goto out;
	}
	memcpy(copy, r->data, r->bytes); /* the payload's alignment is the file's */
	if (check_only) {
		memcpy(t, probe.t, sizeof(*t) * (size_t)probe.n);
		probe.t = t;
		probe.history = h;
	}
	if (loom_fp8_state_unpack(check_only ? &probe : &p->ts.fp8, copy, err, sizeof(err)))
		st = loom_program_fail(p, LOOM_ERR_FORMAT, "checkpoint %s: %s", path, err);
out:
	free(t);
	free(h);
	free(copy);
	return st;
}

/* The records this program saves and expects, payloads left NULL. */
static loom_status list_records(loom_program *p, rec_list *l)
{
	int cap = 2 + p->plan.n_params * 2;
	for (int v = 0; v < p->plan.n_fwd; v++)
		cap += is_state(&p->plan.g->nodes[v]);
	l->r = calloc(cap, sizeof(*l->r));
	l->names = calloc(cap, sizeof(*l->names));
	l->host = calloc(cap, sizeof(void *));
	l->full = calloc(cap, sizeof(size_t));
	if (!l->r || !l->names || !l->host || !l->full)
		return LOOM_ERR_NOMEM;
	for (int v = 0; v < p->plan.n_fwd; v++) {
		const loom_node *n = &p->plan.g->nodes[v];
		if (!is_state(n))
			continue;
		loom_ckpt_record *r = &l->r[l->n];
		snprintf(l->names[l->n], sizeof(l->names[0]), "%s", n->name);
		r->name = l->names[l->n];
		loom_shape us = loom_node_user_shape(n);
		r->dtype = n->dtype;
		r->ndim = us.ndim;
		memcpy(r->dims, us.dims, sizeof(r->dims));
		r->bytes = (size_t)loom_shape_numel(&us) * loom_dtype_size(n->dtype);
		l->full[l->n] = loom_value_bytes(p, v);
		l->n++;
	}
	int ns = p->plan.n_state;
	for (int s = 0; s < p->plan.n_params; s++) {
		const loom_param_slot *sl = &p->plan.params[s];
		for (int k = 0; k < ns; k++) {
			loom_ckpt_record *r = &l->r[l->n];
			snprintf(l->names[l->n], sizeof(l->names[0]), "optim.%s.%d",
				 p->plan.g->nodes[sl->param].name, k);
			r->name = l->names[l->n];
			loom_shape us = loom_node_user_shape(&p->plan.g->nodes[sl->param]);
			r->dtype = sl->state_dtype;
			r->ndim = 1;
			r->dims[0] = loom_shape_numel(&us);
			r->bytes = (size_t)r->dims[0] * loom_dtype_size(sl->state_dtype);
			l->full[l->n] = (size_t)sl->numel * loom_dtype_size(sl->state_dtype);
			l->n++;
		}
	}
	loom_ckpt_record *r = &l->r[l->n];
	snprintf(l->names[l->n], sizeof(l->names[0]), META);
	r->name = l->names[l->n];
	r->dtype = LOOM_F64;
	r->ndim = 1;
	r->dims[0] = LOOM_CKPT_META_COUNT;
	r->bytes = LOOM_CKPT_META_COUNT * sizeof(double);
	l->full[l->n] = r->bytes;
	l->n++;
	fp8_record(p, l);
	return LOOM_OK;
}

static void free_records(rec_list *l)
{
	for (int i = 0; l->host && i < l->n; i++)
		free(l->host[i]);
	free(l->host);
	free(l->full);
	free(l->r);
	free(l->names);
}

/* The value of record i, LOOM_NONE if it is not a value's. */
static loom_value record_value(const loom_program *p, int i)
{
	int k = 0;
	for (int v = 0; v < p->plan.n_fwd; v++)
		if (is_state(&p->plan.g->nodes[v]) && k++ == i)
			return v;
	return LOOM_NONE;
}

/* The arena address of record i (NULL for the meta record; a sharded
 * master.s is not one: see sharded_value). */
static void *record_addr(loom_program *p, int i)
{
	int k = 0;
	for (int v = 0; v < p->plan.n_fwd; v++) {
		if (!is_state(&p->plan.g->nodes[v]))
			continue;
		if (k++ == i)
			return loom_value_ptr(p, v);
	}
	int ns = p->plan.n_state;
	for (int s = 0; s < p->plan.n_params; s++)
		for (int j = 0; j < ns; j++)
			if (k++ == i)
				return p->arena.state + p->plan.params[s].state_off[j];
	return NULL;
}

/* Record i is optimizer state buffer *k of slot *s? */
static int state_record(const loom_program *p, int i, int *s, int *k)
{
	int n = 0, ns = p->plan.n_state;
	for (int v = 0; v < p->plan.n_fwd; v++)
		n += is_state(&p->plan.g->nodes[v]);
	if (i < n || ns == 0 || i >= n + p->plan.n_params * ns)
		return 0;
	*s = (i - n) / ns;
	*k = (i - n) % ns;
	return 1;
}

/* Record i is a sharded value (ZeRO's O2 master, ZeRO-3's parameter) of
 * slot *s, in loom_zero_gather's buffer *k? */
static int sharded_value(const loom_program *p, int i, int *s, int *k)
{
	loom_value v = record_value(p, i);
	if (v == LOOM_NONE)
		return 0;
	return (*s = loom_zero_shard_of(p, v, k)) >= 0;
}

/* Pipeline stages: the stage that holds record i (a value's owner, a
 * state buffer's slot's); -1 without stages. */
static int record_stage(const loom_program *p, int i)
{
	int s, k;
	if (!p->plan.pipe)
		return -1;
	if (state_record(p, i, &s, &k))
		return loom_pipeline_leaf_owner(&p->plan, p->plan.params[s].param);
	return loom_pipeline_leaf_owner(&p->plan, record_value(p, i));
}

/* Record i's payload into dst: a download, under ZeRO a state buffer or
 * master gathered from every rank's shards, under pipeline stages the
 * holding stage's copy (both collective). */
static loom_status fetch_record(loom_program *p, int i, void *addr, void *dst, size_t bytes)
{
	int s, k;
	if (p->plan.pipe)
		return loom_pipeline_fetch(p, record_stage(p, i), addr, dst, bytes);
	if (p->plan.zero && state_record(p, i, &s, &k))
		return loom_zero_gather(p, s, k, dst);
	if (p->plan.zero && sharded_value(p, i, &s, &k))
		return loom_zero_gather(p, s, k, dst);
	return loom_program_download(p, dst, addr, bytes);
}

static loom_status place_record(loom_program *p, int i, void *addr, const void *src, size_t bytes)
{
	int s, k;
	/* every rank read the file; each stage takes what it holds */
	if (p->plan.pipe && (state_record(p, i, &s, &k) ?
			     record_stage(p, i) != p->plan.pipe->stage :
			     !loom_plan_holds(&p->plan, record_value(p, i))))
		return LOOM_OK;
	if (p->plan.zero && state_record(p, i, &s, &k))
		return loom_zero_scatter(p, s, k, src);
	if (p->plan.zero && sharded_value(p, i, &s, &k))
		return loom_zero_scatter(p, s, k, src);
	return loom_program_upload(p, addr, src, bytes);
}

loom_status loom_save(loom_program *p, const char *path)
{
	if (!loom_program_usable(p))
		return LOOM_ERR_INVALID;
	if (!path || !path[0])
		return loom_program_fail(p, LOOM_ERR_INVALID, "save: no path given");
	/* Pipeline: each record comes from the stage that holds it, so that
	 * rank 0 writes the whole model in the one format (fetch_record). */
	rec_list l = { 0 };
	loom_status st = list_records(p, &l);
	if (st != LOOM_OK) {
		free_records(&l);
		return loom_program_fail(p, st, "save %s: out of memory", path);
	}
	double meta[LOOM_CKPT_META_COUNT] = {
		[LOOM_CKPT_META_STEP] = (double)p->ts.step, [LOOM_CKPT_META_LR] = p->ts.lr,
		[LOOM_CKPT_META_SCALE] = p->ts.scaler.scale, [LOOM_CKPT_META_TRACKER] = p->ts.scaler.growth_tracker,
		[LOOM_CKPT_META_SKIPPED] = (double)p->ts.scaler.skipped_steps,
		[LOOM_CKPT_META_BELOW] = (double)p->ts.scaler.below_one_steps,
	};
	for (int i = 0; i < l.n && st == LOOM_OK; i++) {
		void *addr = record_addr(p, i);
		if (i == l.fp8) {
			if ((st = fp8_pack(p, &l)) != LOOM_OK)
				loom_program_fail(p, st, "save %s: out of memory", path);
			continue;
		}
		if (!addr) {
			l.r[i].data = meta;
			continue;
		}
		l.host[i] = malloc(l.full[i] ? l.full[i] : 1);
		if (!l.host[i]) {
			st = loom_program_fail(p, LOOM_ERR_NOMEM, "save %s: out of memory", path);
			break;
		}
		/* the whole value; the file takes its user's part, the prefix */
		st = fetch_record(p, i, addr, l.host[i], l.full[i]);
		l.r[i].data = l.host[i];
	}
	char err[512];
	/* ZeRO, pipeline: every rank gathered, rank 0 writes. */
	int writer = p->plan.pipe ? p->plan.pipe->replica == 0 && p->plan.pipe->stage == 0 :
				    p->plan.rank == 0;
	if (st == LOOM_OK && (p->plan.zero || p->plan.pipe) && !writer) {
		free_records(&l);
		return LOOM_OK;
	}
	if (st == LOOM_OK) {
		st = loom_ckpt_write(path, p->plan.fingerprint, l.r, l.n, err, sizeof(err));
		if (st != LOOM_OK)
			loom_program_fail(p, st, "%s", err);
	}
	free_records(&l);
	return st;
}

loom_status loom_load(loom_program *p, const char *path)
{
	if (!loom_program_usable(p))
		return LOOM_ERR_INVALID;
	if (!path || !path[0])
		return loom_program_fail(p, LOOM_ERR_INVALID, "load: no path given");
	char err[512];
	loom_ckpt_file *f = NULL;
	loom_status st = loom_ckpt_read(path, &f, err, sizeof(err));
	if (st != LOOM_OK)
		return loom_program_fail(p, st, "%s", err);
	rec_list l = { 0 };
	if (loom_ckpt_fingerprint(f) != p->plan.fingerprint) {
		st = loom_program_fail(p, LOOM_ERR_MISMATCH,
				       "checkpoint %s was saved from another graph or other options "
				       "(fingerprint %016llx, this program %016llx)",
				       path, (unsigned long long)loom_ckpt_fingerprint(f),
				       (unsigned long long)p->plan.fingerprint);
		goto out;
	}
	if ((st = list_records(p, &l)) != LOOM_OK) {
		loom_program_fail(p, st, "load %s: out of memory", path);
		goto out;
	}
	/* Check every record before touching the program. */
	const loom_ckpt_record **found = calloc(l.n, sizeof(*found));
	if (!found) {
		st = loom_program_fail(p, LOOM_ERR_NOMEM, "load %s: out of memory", path);
		goto out;
	}
	for (int i = 0; i < l.n; i++) {
		const loom_ckpt_record *r = loom_ckpt_find(f, l.r[i].name);
		if (!r) {
			st = loom_program_fail(p, LOOM_ERR_MISMATCH, "checkpoint %s has no tensor '%s'",
					       path, l.r[i].name);
			break;
		}
		if (r->dtype != l.r[i].dtype || r->ndim != l.r[i].ndim || r->bytes != l.r[i].bytes ||
		    memcmp(r->dims, l.r[i].dims, sizeof(int64_t) * r->ndim) != 0) {
			st = loom_program_fail(p, LOOM_ERR_MISMATCH,
					       "checkpoint %s: tensor '%s' has another dtype or shape",
					       path, l.r[i].name);
			break;
		}
		found[i] = r;
		if (i == l.fp8) {
			if ((st = fp8_unpack(p, r, path, 1)) != LOOM_OK)
				break;
			continue;
		}
		if (!record_addr(p, i)) {
			double meta[LOOM_CKPT_META_COUNT];
			memcpy(meta, r->data, sizeof(meta));
			st = loom_ckpt_check_meta(meta, err, sizeof(err));
			if (st != LOOM_OK) {
				loom_program_fail(p, st, "checkpoint %s: %s", path, err);
				break;
			}
		}
	}
	for (int i = 0; i < l.n && st == LOOM_OK; i++) {
		void *addr = record_addr(p, i);
		if (i == l.fp8) {
			st = fp8_unpack(p, found[i], path, 0);
			continue;
		}
		if (addr && l.full[i] == found[i]->bytes) {
			st = place_record(p, i, addr, found[i]->data, found[i]->bytes);
			continue;
		}
		if (addr) { /* a padded value: the file's rows, then zero padding */
			void *whole = calloc(1, l.full[i]);
			if (!whole) {
				st = loom_program_fail(p, LOOM_ERR_NOMEM, "load %s: out of memory", path);
				break;
			}
			memcpy(whole, found[i]->data, found[i]->bytes);
			st = place_record(p, i, addr, whole, l.full[i]);
			free(whole);
			continue;
		}
		double meta[LOOM_CKPT_META_COUNT];
		memcpy(meta, found[i]->data, sizeof(meta));
		p->ts.step = (int64_t)meta[LOOM_CKPT_META_STEP];
		p->ts.lr = meta[LOOM_CKPT_META_LR];
		p->ts.scaler.scale = (float)meta[LOOM_CKPT_META_SCALE];
		p->ts.scaler.growth_tracker = (int32_t)meta[LOOM_CKPT_META_TRACKER];
		p->ts.scaler.skipped_steps = (int64_t)meta[LOOM_CKPT_META_SKIPPED];
		p->ts.scaler.below_one_steps = (int64_t)meta[LOOM_CKPT_META_BELOW];
	}
	/* Gradients accumulated before the load belong to the old weights. */
	if (st == LOOM_OK && p->ts.micro > 0) {
		void *zero = calloc(1, p->plan.accum_bytes ? p->plan.accum_bytes : 1);
		st = zero ? loom_program_upload(p, p->arena.accum, zero, p->plan.accum_bytes) :
			    loom_program_fail(p, LOOM_ERR_NOMEM, "load: out of memory");
		free(zero);
		p->ts.micro = 0;
	}
	free(found);
out:
	free_records(&l);
	loom_ckpt_free(f);
	return st;
}
