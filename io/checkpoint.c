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

#include "base/free_each.h"
#include "engine/io_view.h"
#include "io/ckpt_file.h"

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
 * "amp.fp8" (engine/io_view.h's loom_io_fp8_*), so that a resumed run casts
 * as the uninterrupted one. Every rank holds the same state (max-reduced at
 * each step end): rank 0's is saved, and every rank loads it.
 */
static void fp8_record(loom_program *p, rec_list *l)
{
	size_t n = loom_io_fp8_floats(p);
	l->fp8 = -1;
	if (n == 0)
		return;
	loom_ckpt_record *r = &l->r[l->n];
	snprintf(l->names[l->n], sizeof(l->names[0]), "amp.fp8");
	r->name = l->names[l->n];
	r->dtype = LOOM_F32;
	r->ndim = 1;
	r->dims[0] = (int64_t)n;
	r->bytes = n * sizeof(float);
	l->full[l->n] = r->bytes;
	l->fp8 = l->n++;
}

/* The fp8 record's payload for saving (owned by l->host). */
static loom_status fp8_pack(loom_program *p, rec_list *l)
{
	float *buf = malloc(l->r[l->fp8].bytes);
	if (!buf)
		return LOOM_ERR_NOMEM;
	loom_status st = loom_io_fp8_pack(p, buf); /* waits for a device's copy */
	if (st != LOOM_OK) {
		free(buf);
		return st;
	}
	l->host[l->fp8] = buf;
	l->r[l->fp8].data = buf;
	return LOOM_OK;
}

/* The loaded fp8 record checked (check_only: nothing changes) or placed
 * into the training state. */
static loom_status fp8_unpack(loom_program *p, const loom_ckpt_record *r, const char *path,
			      int check_only)
{
	char err[256];
	float *copy = malloc(r->bytes);
	loom_status st;
	if (!copy)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "load %s: out of memory", path);
	memcpy(copy, r->data, r->bytes); /* the payload's alignment is the file's */
	st = loom_io_fp8_unpack(p, copy, check_only, err, sizeof(err));
	if (st == LOOM_ERR_NOMEM)
		st = loom_program_fail(p, st, "load %s: out of memory", path);
	else if (st != LOOM_OK)
		st = loom_program_fail(p, st, "checkpoint %s: %s", path, err);
	free(copy);
	return st;
}

/* The records this program saves and expects, payloads left NULL. */
static loom_status list_records(loom_program *p, rec_list *l)
{
	const loom_plan *pl = loom_io_plan(p);
	int cap = 2 + pl->n_params * 2;
	for (int v = 0; v < pl->n_fwd; v++)
		cap += is_state(&pl->g->nodes[v]);
	l->r = calloc(cap, sizeof(*l->r));
	l->names = calloc(cap, sizeof(*l->names));
	l->host = calloc(cap, sizeof(void *));
	l->full = calloc(cap, sizeof(size_t));
	if (!l->r || !l->names || !l->host || !l->full)
		return LOOM_ERR_NOMEM;
	for (int v = 0; v < pl->n_fwd; v++) {
		const loom_node *n = &pl->g->nodes[v];
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
		l->full[l->n] = loom_io_value_bytes(p, v);
		l->n++;
	}
	int ns = pl->n_state;
	for (int s = 0; s < pl->n_params; s++) {
		const loom_param_slot *sl = &pl->params[s];
		for (int k = 0; k < ns; k++) {
			loom_ckpt_record *r = &l->r[l->n];
			snprintf(l->names[l->n], sizeof(l->names[0]), "optim.%s.%d",
				 pl->g->nodes[sl->param].name, k);
			r->name = l->names[l->n];
			loom_shape us = loom_node_user_shape(&pl->g->nodes[sl->param]);
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
	LOOM_FREE_EACH(l->host, l->n);
	free(l->full);
	free(l->r);
	free(l->names);
}

/* The value of record i, LOOM_NONE if it is not a value's. */
static loom_value record_value(const loom_program *p, int i)
{
	const loom_plan *pl = loom_io_plan(p);
	int k = 0;
	for (int v = 0; v < pl->n_fwd; v++)
		if (is_state(&pl->g->nodes[v]) && k++ == i)
			return v;
	return LOOM_NONE;
}

/* The arena address of record i (NULL for the meta record; a sharded
 * master.s is not one: see sharded_value). */
static void *record_addr(loom_program *p, int i)
{
	const loom_plan *pl = loom_io_plan(p);
	int k = 0;
	for (int v = 0; v < pl->n_fwd; v++) {
		if (!is_state(&pl->g->nodes[v]))
			continue;
		if (k++ == i)
			return loom_io_value_ptr(p, v);
	}
	int ns = pl->n_state;
	for (int s = 0; s < pl->n_params; s++)
		for (int j = 0; j < ns; j++)
			if (k++ == i)
				return loom_io_arena(p)->state + pl->params[s].state_off[j];
	return NULL;
}

/* Record i is optimizer state buffer *k of slot *s? */
static int state_record(const loom_program *p, int i, int *s, int *k)
{
	const loom_plan *pl = loom_io_plan(p);
	int n = 0, ns = pl->n_state;
	for (int v = 0; v < pl->n_fwd; v++)
		n += is_state(&pl->g->nodes[v]);
	if (i < n || ns == 0 || i >= n + pl->n_params * ns)
		return 0;
	*s = (i - n) / ns;
	*k = (i - n) % ns;
	return 1;
}

/* Record i is a sharded value (ZeRO's O2 master, ZeRO-3's parameter) of
 * slot *s, in loom_shard_gather's buffer *k? */
static int sharded_value(const loom_program *p, int i, int *s, int *k)
{
	loom_value v = record_value(p, i);
	if (v == LOOM_NONE)
		return 0;
	return (*s = loom_value_shard(p, v, k)) >= 0;
}

/* Pipeline stages: the stage that holds record i (a value's owner, a
 * state buffer's slot's); -1 without stages. */
static int record_stage(const loom_program *p, int i)
{
	const loom_plan *pl = loom_io_plan(p);
	int s, k;
	if (!pl->pipe)
		return -1;
	if (state_record(p, i, &s, &k))
		return loom_io_leaf_owner(p, pl->params[s].param);
	return loom_io_leaf_owner(p, record_value(p, i));
}

/* Record i's payload into dst: a download, under ZeRO a state buffer or
 * master gathered from every rank's shards, under pipeline stages the
 * holding stage's copy (both collective). */
static loom_status fetch_record(loom_program *p, int i, void *addr, void *dst, size_t bytes)
{
	const loom_plan *pl = loom_io_plan(p);
	int s, k;
	if (pl->pipe)
		return loom_io_stage_fetch(p, record_stage(p, i), addr, dst, bytes);
	if (pl->zero && state_record(p, i, &s, &k))
		return loom_shard_gather(p, s, k, dst);
	if (pl->zero && sharded_value(p, i, &s, &k))
		return loom_shard_gather(p, s, k, dst);
	return loom_program_download(p, dst, addr, bytes);
}

static loom_status place_record(loom_program *p, int i, void *addr, const void *src, size_t bytes)
{
	const loom_plan *pl = loom_io_plan(p);
	int s, k;
	/* every rank read the file; each stage takes what it holds */
	loom_stage_info si;
	if (loom_io_stages(p, &si) && (state_record(p, i, &s, &k) ?
				       record_stage(p, i) != si.stage :
				       !loom_plan_holds(pl, record_value(p, i))))
		return LOOM_OK;
	if (pl->zero && state_record(p, i, &s, &k))
		return loom_shard_scatter(p, s, k, src);
	if (pl->zero && sharded_value(p, i, &s, &k))
		return loom_shard_scatter(p, s, k, src);
	return loom_program_upload(p, addr, src, bytes);
}

loom_status loom_save(loom_program *p, const char *path)
{
	const loom_plan *pl = loom_io_plan(p);
	loom_train_state *ts = loom_io_state(p);
	if (!loom_io_usable(p))
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
		[LOOM_CKPT_META_STEP] = (double)ts->step, [LOOM_CKPT_META_LR] = ts->lr,
		[LOOM_CKPT_META_SCALE] = ts->scaler.scale, [LOOM_CKPT_META_TRACKER] = ts->scaler.growth_tracker,
		[LOOM_CKPT_META_SKIPPED] = (double)ts->scaler.skipped_steps,
		[LOOM_CKPT_META_BELOW] = (double)ts->scaler.below_one_steps,
	};
	for (int i = 0; i < l.n && st == LOOM_OK; i++) {
		void *addr = record_addr(p, i);
		if (i == l.fp8) {
			if ((st = fp8_pack(p, &l)) == LOOM_ERR_NOMEM)
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
	loom_stage_info si;
	int writer = loom_io_stages(p, &si) ? si.replica == 0 && si.stage == 0 : pl->rank == 0;
	if (st == LOOM_OK && (pl->zero || pl->pipe) && !writer) {
		free_records(&l);
		return LOOM_OK;
	}
	if (st == LOOM_OK) {
		st = loom_ckpt_write(path, pl->fingerprint, l.r, l.n, err, sizeof(err));
		if (st != LOOM_OK)
			loom_program_fail(p, st, "%s", err);
	}
	free_records(&l);
	return st;
}

/* Every record of l in the file f with its dtype and shape (found[i]),
 * the meta record's scalars in range: checked before the program is
 * touched. */
static loom_status check_records(loom_program *p, const loom_ckpt_file *f, const char *path,
				 const rec_list *l, const loom_ckpt_record **found)
{
	char err[512];
	for (int i = 0; i < l->n; i++) {
		const loom_ckpt_record *r = loom_ckpt_find(f, l->r[i].name);
		if (!r)
			return loom_program_fail(p, LOOM_ERR_MISMATCH, "checkpoint %s has no tensor '%s'",
						 path, l->r[i].name);
		if (r->dtype != l->r[i].dtype || r->ndim != l->r[i].ndim || r->bytes != l->r[i].bytes ||
		    memcmp(r->dims, l->r[i].dims, sizeof(int64_t) * r->ndim) != 0)
			return loom_program_fail(p, LOOM_ERR_MISMATCH,
						 "checkpoint %s: tensor '%s' has another dtype or shape",
						 path, l->r[i].name);
		found[i] = r;
		if (i == l->fp8) {
			loom_status st = fp8_unpack(p, r, path, 1);
			if (st != LOOM_OK)
				return st;
			continue;
		}
		if (!record_addr(p, i)) {
			double meta[LOOM_CKPT_META_COUNT];
			memcpy(meta, r->data, sizeof(meta));
			loom_status st = loom_ckpt_check_meta(meta, err, sizeof(err));
			if (st != LOOM_OK)
				return loom_program_fail(p, st, "checkpoint %s: %s", path, err);
		}
	}
	return LOOM_OK;
}

/* The meta record's scalars into the training state. */
static void load_meta(loom_train_state *ts, const void *data)
{
	double meta[LOOM_CKPT_META_COUNT];
	memcpy(meta, data, sizeof(meta));
	ts->step = (int64_t)meta[LOOM_CKPT_META_STEP];
	ts->lr = meta[LOOM_CKPT_META_LR];
	ts->scaler.scale = (float)meta[LOOM_CKPT_META_SCALE];
	ts->scaler.growth_tracker = (int32_t)meta[LOOM_CKPT_META_TRACKER];
	ts->scaler.skipped_steps = (int64_t)meta[LOOM_CKPT_META_SKIPPED];
	ts->scaler.below_one_steps = (int64_t)meta[LOOM_CKPT_META_BELOW];
}

/* The checked records into the program: each value where the plan keeps
 * it (a padded value: the file's rows, then zero padding), the meta
 * record into the training state. */
static loom_status place_records(loom_program *p, const char *path, const rec_list *l,
				 const loom_ckpt_record **found)
{
	loom_status st = LOOM_OK;
	for (int i = 0; i < l->n && st == LOOM_OK; i++) {
		void *addr = record_addr(p, i);
		if (i == l->fp8) {
			st = fp8_unpack(p, found[i], path, 0);
			continue;
		}
		if (addr && l->full[i] == found[i]->bytes) {
			st = place_record(p, i, addr, found[i]->data, found[i]->bytes);
			continue;
		}
		if (addr) { /* a padded value: the file's rows, then zero padding */
			void *whole = calloc(1, l->full[i]);
			if (!whole)
				return loom_program_fail(p, LOOM_ERR_NOMEM, "load %s: out of memory", path);
			memcpy(whole, found[i]->data, found[i]->bytes);
			st = place_record(p, i, addr, whole, l->full[i]);
			free(whole);
			continue;
		}
		load_meta(loom_io_state(p), found[i]->data);
	}
	return st;
}

/* Gradients accumulated before the load belong to the old weights. */
static loom_status drop_accumulated(loom_program *p)
{
	const loom_plan *pl = loom_io_plan(p);
	loom_train_state *ts = loom_io_state(p);
	if (ts->micro <= 0)
		return LOOM_OK;
	void *zero = calloc(1, pl->accum_bytes ? pl->accum_bytes : 1);
	loom_status st = zero ? loom_program_upload(p, loom_io_arena(p)->accum, zero, pl->accum_bytes) :
				loom_program_fail(p, LOOM_ERR_NOMEM, "load: out of memory");
	free(zero);
	ts->micro = 0;
	return st;
}

loom_status loom_load(loom_program *p, const char *path)
{
	const loom_plan *pl = loom_io_plan(p);
	if (!loom_io_usable(p))
		return LOOM_ERR_INVALID;
	if (!path || !path[0])
		return loom_program_fail(p, LOOM_ERR_INVALID, "load: no path given");
	char err[512];
	loom_ckpt_file *f = NULL;
	const loom_ckpt_record **found = NULL;
	loom_status st = loom_ckpt_read(path, &f, err, sizeof(err));
	if (st != LOOM_OK)
		return loom_program_fail(p, st, "%s", err);
	rec_list l = { 0 };
	if (loom_ckpt_fingerprint(f) != pl->fingerprint) {
		st = loom_program_fail(p, LOOM_ERR_MISMATCH,
				       "checkpoint %s was saved from another graph or other options "
				       "(fingerprint %016llx, this program %016llx)",
				       path, (unsigned long long)loom_ckpt_fingerprint(f),
				       (unsigned long long)pl->fingerprint);
		goto out;
	}
	if ((st = list_records(p, &l)) != LOOM_OK) {
		loom_program_fail(p, st, "load %s: out of memory", path);
		goto out;
	}
	if (!(found = calloc(l.n, sizeof(*found)))) {
		st = loom_program_fail(p, LOOM_ERR_NOMEM, "load %s: out of memory", path);
		goto out;
	}
	if ((st = check_records(p, f, path, &l, found)) == LOOM_OK &&
	    (st = place_records(p, path, &l, found)) == LOOM_OK)
		st = drop_accumulated(p);
out:
	free(found);
	free_records(&l);
	loom_ckpt_free(f);
	return st;
}
