/*
 * io/weights.c — loom_export_safetensors / loom_import_safetensors: a
 * program's parameters and buffers as a safetensors file under PyTorch's
 * state_dict names (include/loom_io.h). The container is
 * io/safetensors.c; here, which tensors, their names, their dtypes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "base/elem.h"
#include "base/free_each.h"
#include "engine/io_view.h"
#include "io/safetensors.h"
#include "loom_io.h"

#define NAME_BUF (LOOM_NAME_MAX + 64)
#define NBT ".num_batches_tracked"

void loom_weights_opts_default(loom_weights_opts *o)
{
	if (o)
		*o = (loom_weights_opts){ .strict = 1 };
}

/* A parameter or buffer of the user's graph (not an O2 master). */
static int is_exchanged(const loom_node *n)
{
	return (n->op == LOOM_OP_PARAM || n->op == LOOM_OP_BUFFER) && !(n->flags & LOOM_NODE_AMP);
}

/* The name of loom name `name` in the file, through the first matching rename. */
static void file_name(const loom_weights_opts *o, const char *name, char *buf, size_t len)
{
	for (int i = 0; i < o->n_names; i++) {
		size_t k = strlen(o->names[i].loom);
		if (strncmp(name, o->names[i].loom, k) == 0) {
			snprintf(buf, len, "%s%s", o->names[i].file, name + k);
			return;
		}
	}
	snprintf(buf, len, "%s", name);
}

/* name is entry, or ends in '.' and entry (one of list's n). */
static int listed(const char *const *list, int n, const char *name)
{
	size_t len = strlen(name);
	for (int i = 0; i < n; i++) {
		size_t k = strlen(list[i]);
		if (k && (strcmp(name, list[i]) == 0 ||
			  (len > k && name[len - k - 1] == '.' && strcmp(name + len - k, list[i]) == 0)))
			return 1;
	}
	return 0;
}

/* Import: the first matching rename whose result the file holds, else the
 * first matching one (file_name's). */
static void import_name(const loom_weights_opts *o, const loom_st_file *f, const char *name,
			char *buf, size_t len)
{
	for (int i = 0; i < o->n_names; i++) {
		size_t k = strlen(o->names[i].loom);
		if (strncmp(name, o->names[i].loom, k) == 0) {
			snprintf(buf, len, "%s%s", o->names[i].file, name + k);
			if (loom_st_find(f, buf))
				return;
		}
	}
	file_name(o, name, buf, len);
}

/* A 2-D tensor of elem-byte elements, rows x cols, into its transpose. */
static void transpose_bytes(const void *src, void *dst, int64_t rows, int64_t cols, size_t elem)
{
	const char *s = src;
	char *d = dst;
	for (int64_t i = 0; i < rows; i++)
		for (int64_t j = 0; j < cols; j++)
			memcpy(d + (j * rows + i) * elem, s + (i * cols + j) * elem, elem);
}

static int skipped(const loom_weights_opts *o, const char *fname)
{
	for (int i = 0; i < o->n_skip; i++) {
		size_t k = strlen(o->skip[i]);
		if (k && strncmp(fname, o->skip[i], k) == 0 && (fname[k] == 0 || fname[k] == '.'))
			return 1;
	}
	return 0;
}

/* "layer1.1.running_mean" -> "layer1.1" in buf; 0 if name is not a batch
 * norm's running mean. */
static int bn_prefix(const char *name, char *buf, size_t len)
{
	static const char suffix[] = ".running_mean";
	size_t n = strlen(name), k = sizeof(suffix) - 1;
	if (n <= k || strcmp(name + n - k, suffix) != 0)
		return 0;
	snprintf(buf, len, "%.*s", (int)(n - k), name);
	return 1;
}

static loom_st_dtype st_dtype(loom_dtype dt)
{
	switch (dt) {
	case LOOM_F32: return LOOM_ST_F32;
	case LOOM_F64: return LOOM_ST_F64;
	case LOOM_F16: return LOOM_ST_F16;
	case LOOM_BF16: return LOOM_ST_BF16;
	case LOOM_I32: return LOOM_ST_I32;
	case LOOM_FP8_E4M3: return LOOM_ST_F8_E4M3;
	case LOOM_FP8_E5M2: return LOOM_ST_F8_E5M2;
	default: return LOOM_ST_DTYPE_COUNT;
	}
}

/* ---------------------------------------------------------------- export */

typedef struct export_list {
	loom_st_tensor *t;
	char (*names)[NAME_BUF];
	void **host;
	int n;
} export_list;

static void export_free(export_list *l)
{
	LOOM_FREE_EACH(l->host, l->n);
	free(l->names);
	free(l->t);
}

/* One tensor of the file: node v's values (its master's under O2). */
static loom_status export_value(loom_program *p, const loom_weights_opts *o, loom_value v,
				export_list *l)
{
	const loom_plan *pl = loom_io_plan(p);
	const loom_node *n = &pl->g->nodes[v];
	loom_value src = n->master != LOOM_NONE && n->op == LOOM_OP_PARAM ? n->master : v;
	const loom_node *s = &pl->g->nodes[src];
	loom_st_tensor *t = &l->t[l->n];
	size_t bytes = loom_io_value_bytes(p, src);
	/* A padded vocabulary's table: the file has the user's rows (the
	 * storage's prefix; engine/vocab_pad.c). */
	loom_shape us = loom_node_user_shape(s);
	file_name(o, n->name, l->names[l->n], NAME_BUF);
	t->name = l->names[l->n];
	t->dtype = st_dtype(s->dtype);
	t->ndim = us.ndim;
	memcpy(t->dims, us.dims, sizeof(int64_t) * us.ndim);
	t->bytes = (size_t)loom_shape_numel(&us) * loom_dtype_size(s->dtype);
	if (!(l->host[l->n] = malloc(bytes ? bytes : 1)))
		return loom_program_fail(p, LOOM_ERR_NOMEM, "export: out of memory");
	t->data = l->host[l->n];
	l->n++;
	/* ZeRO: the master or ZeRO-3's parameter gathered from the shards */
	loom_status st = src != v ? loom_master_read(p, v, l->host[l->n - 1]) :
				    loom_value_read_whole(p, v, l->host[l->n - 1]);
	if (st != LOOM_OK || !o->conv1d_export || t->ndim != 2 ||
	    !listed(o->conv1d, o->n_conv1d, t->name))
		return st;
	/* Hugging Face's Conv1D: [in, out]. */
	void *tr = malloc(t->bytes ? t->bytes : 1);
	if (!tr)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "export: out of memory");
	transpose_bytes(t->data, tr, t->dims[0], t->dims[1], loom_st_dtype_size(t->dtype));
	free(l->host[l->n - 1]);
	l->host[l->n - 1] = tr;
	t->data = tr;
	int64_t d0 = t->dims[0];
	t->dims[0] = t->dims[1];
	t->dims[1] = d0;
	return LOOM_OK;
}

/* PyTorch's num_batches_tracked beside the batch norm whose running mean
 * is node v. */
static loom_status export_nbt(loom_program *p, const loom_weights_opts *o, loom_value v,
			      export_list *l)
{
	loom_train_state *ts = loom_io_state(p);
	char prefix[NAME_BUF], loom_name[NAME_BUF + 32];
	if (!bn_prefix(loom_io_plan(p)->g->nodes[v].name, prefix, sizeof(prefix)))
		return LOOM_OK;
	snprintf(loom_name, sizeof(loom_name), "%s" NBT, prefix);
	loom_st_tensor *t = &l->t[l->n];
	int64_t *count = malloc(sizeof(int64_t));
	if (!count)
		return loom_program_fail(p, LOOM_ERR_NOMEM, "export: out of memory");
	*count = ts->step + ts->scaler.skipped_steps;
	l->host[l->n] = count;
	file_name(o, loom_name, l->names[l->n], NAME_BUF);
	*t = (loom_st_tensor){ .name = l->names[l->n], .dtype = LOOM_ST_I64, .ndim = 0,
			       .data = count, .bytes = sizeof(int64_t) };
	l->n++;
	return LOOM_OK;
}

/* An export's or import's checks (what: "export" or "import"); *opts the
 * defaults in *def when the caller gave none. */
static loom_status weights_args(loom_program *p, const char *path, const char *what,
				const loom_weights_opts **opts, loom_weights_opts *def)
{
	if (!loom_io_usable(p))
		return LOOM_ERR_INVALID;
	if (!path || !path[0])
		return loom_program_fail(p, LOOM_ERR_INVALID, "%s: no path given", what);
	/* Each stage holds its own parameters: loom_save gathers them. */
	if (loom_io_plan(p)->pipe)
		return loom_program_fail(p, LOOM_ERR_UNSUPPORTED, "%s: not with pipeline stages yet "
					 "(loom_save writes the whole model; resume it on one rank)",
					 what);
	if (!*opts) {
		loom_weights_opts_default(def);
		*opts = def;
	}
	return LOOM_OK;
}

loom_status loom_export_safetensors(loom_program *p, const char *path,
				    const loom_weights_opts *opts)
{
	const loom_plan *pl = loom_io_plan(p);
	loom_weights_opts def;
	loom_status st = weights_args(p, path, "export", &opts, &def);
	if (st != LOOM_OK)
		return st;
	int cap = 0;
	for (int v = 0; v < pl->n_fwd; v++)
		cap += is_exchanged(&pl->g->nodes[v]) ? 2 : 0;
	export_list l = { .t = calloc(cap + 1, sizeof(*l.t)),
			  .names = calloc(cap + 1, sizeof(*l.names)),
			  .host = calloc(cap + 1, sizeof(void *)) };
	if (!l.t || !l.names || !l.host) {
		st = loom_program_fail(p, LOOM_ERR_NOMEM, "export %s: out of memory", path);
		goto out;
	}
	for (int v = 0; v < pl->n_fwd && st == LOOM_OK; v++) {
		if (!is_exchanged(&pl->g->nodes[v]))
			continue;
		st = export_value(p, opts, v, &l);
		if (st == LOOM_OK)
			st = export_nbt(p, opts, v, &l);
	}
	static const char *const meta[] = { "format", "pt", "producer", "loom" };
	char err[LOOM_ERR_MAX];
	/* ZeRO: every rank gathered (sharded masters), rank 0 writes. */
	if (st == LOOM_OK && pl->zero && pl->rank != 0)
		goto out;
	if (st == LOOM_OK && (st = loom_st_write(path, l.t, l.n, meta, 2, err, sizeof(err))))
		loom_program_fail(p, st, "export: %s", err);
out:
	export_free(&l);
	return st;
}

/* ---------------------------------------------------------------- import */

/* The file's tensor for the program's value: converted, ready to write. */
typedef struct import_item {
	loom_value v;
	const loom_st_tensor *t;
	int transpose; /* the file's is [in, out] (Conv1D) */
} import_item;

static double st_get(const loom_st_tensor *t, int64_t i)
{
	const unsigned char *b = (const unsigned char *)t->data + i * loom_st_dtype_size(t->dtype);
	switch (t->dtype) {
	case LOOM_ST_F64: { double x; memcpy(&x, b, 8); return x; }
	case LOOM_ST_F32: { float x; memcpy(&x, b, 4); return x; }
	case LOOM_ST_F16: { uint16_t x; memcpy(&x, b, 2); return loom_f16_to_f32(x); }
	case LOOM_ST_BF16: { uint16_t x; memcpy(&x, b, 2); return loom_bf16_to_f32(x); }
	default: return 0;
	}
}

static int is_float(loom_st_dtype dt)
{
	return dt == LOOM_ST_F64 || dt == LOOM_ST_F32 || dt == LOOM_ST_F16 || dt == LOOM_ST_BF16;
}

/* The shape as text, for messages. */
static const char *dims_str(const int64_t *dims, int ndim, char *buf, size_t len)
{
	size_t at = 0;
	at += snprintf(buf, len, "[");
	for (int d = 0; d < ndim && at < len; d++)
		at += snprintf(buf + at, len - at, "%s%lld", d ? ", " : "", (long long)dims[d]);
	if (at < len)
		snprintf(buf + at, len - at, "]");
	return buf;
}

/* Conv1D layout: one listed weight stored with its two (unequal)
 * dimensions swapped says the file is so. */
static int file_is_conv1d(const loom_plan *pl, const loom_weights_opts *o, const loom_st_file *f)
{
	char fname[NAME_BUF];
	int conv1d = 0;
	for (int v = 0; v < pl->n_fwd && o->n_conv1d; v++) {
		const loom_node *n = &pl->g->nodes[v];
		loom_shape us = loom_node_user_shape(n);
		if (!is_exchanged(n) || us.ndim != 2 || us.dims[0] == us.dims[1])
			continue;
		import_name(o, f, n->name, fname, sizeof(fname));
		const loom_st_tensor *t = loom_st_find(f, fname);
		if (t && t->ndim == 2 && listed(o->conv1d, o->n_conv1d, fname) &&
		    t->dims[0] == us.dims[1] && t->dims[1] == us.dims[0])
			conv1d = 1;
	}
	return conv1d;
}

/* num_batches_tracked of the batch norm of fname: expected, not used. */
static void mark_nbt_used(const loom_st_file *f, const char *fname, char *used)
{
	char prefix[NAME_BUF], nbt[NAME_BUF + 32];
	if (!bn_prefix(fname, prefix, sizeof(prefix)))
		return;
	snprintf(nbt, sizeof(nbt), "%s" NBT, prefix);
	const loom_st_tensor *t = loom_st_find(f, nbt);
	if (t)
		used[t - loom_st_at(f, 0)] = 1;
}

/* The file's tensor t for the program's fname of shape ns: its shape
 * (read transposed, *tr, in a Conv1D file; or its first rows where listed)
 * and its dtype, or the message that says why it does not fit. */
static loom_status check_tensor(loom_program *p, const loom_weights_opts *o, const char *path,
				const char *fname, const loom_st_tensor *t, const loom_shape *ns,
				int conv1d, loom_weights_report *r, int *tr)
{
	char a[128], b[128];
	*tr = conv1d && ns->ndim == 2 && listed(o->conv1d, o->n_conv1d, fname);
	int64_t want[2] = { ns->dims[*tr], ns->dims[!*tr] };
	/* The file's first rows: a row-major prefix, read as it is. */
	int rows = !*tr && t->ndim == ns->ndim && t->ndim >= 1 &&
		   t->dims[0] > ns->dims[0] &&
		   memcmp(t->dims + 1, ns->dims + 1, sizeof(int64_t) * (t->ndim - 1)) == 0 &&
		   listed(o->first_rows, o->n_first_rows, fname);
	r->first_rows += rows;
	if (t->ndim != ns->ndim ||
	    (*tr ? memcmp(t->dims, want, sizeof(want)) :
	     rows ? 0 : memcmp(t->dims, ns->dims, sizeof(int64_t) * t->ndim)) != 0)
		return loom_program_fail(p, LOOM_ERR_SHAPE,
					 "import %s: tensor '%s' is %s in the file, the "
					 "program's is %s%s", path, fname,
					 dims_str(t->dims, t->ndim, a, sizeof(a)),
					 dims_str(ns->dims, ns->ndim, b, sizeof(b)),
					 *tr ? " (read transposed: the file's Conv1D layout)" : "");
	if (!is_float(t->dtype))
		return loom_program_fail(p, LOOM_ERR_DTYPE,
					 "import %s: tensor '%s' is %s, loom reads F32, F16, "
					 "BF16 or F64", path, fname, loom_st_dtype_name(t->dtype));
	return LOOM_OK;
}

/* The file's tensors no program tensor used: ignored where listed, else
 * counted as unexpected (strict: refused). */
static loom_status count_unexpected(loom_program *p, const loom_weights_opts *o,
				    const loom_st_file *f, const char *path, const char *used,
				    loom_weights_report *r)
{
	for (int i = 0; i < loom_st_count(f); i++) {
		const loom_st_tensor *t = loom_st_at(f, i);
		if (used[i] || skipped(o, t->name))
			continue;
		if (listed(o->ignore, o->n_ignore, t->name)) {
			r->ignored++;
			continue;
		}
		if (!r->unexpected++)
			snprintf(r->first_unexpected, sizeof(r->first_unexpected), "%s", t->name);
		if (o->strict)
			return loom_program_fail(p, LOOM_ERR_MISMATCH,
						 "import %s: the file's tensor '%s' is not in the "
						 "program (strict; with loom_weights_opts.strict 0 it is "
						 "counted and left out)", path,
						 t->name);
	}
	return LOOM_OK;
}

/* Pairs the program's tensors with the file's, or says which does not fit. */
static loom_status match(loom_program *p, const loom_weights_opts *o, const loom_st_file *f,
			 const char *path, import_item *items, int *n_items, char *used,
			 loom_weights_report *r)
{
	const loom_plan *pl = loom_io_plan(p);
	char fname[NAME_BUF];
	int conv1d = file_is_conv1d(pl, o, f);
	for (int v = 0; v < pl->n_fwd; v++) {
		const loom_node *n = &pl->g->nodes[v];
		/* a padded vocabulary's table: the user's shape */
		const loom_shape us = loom_node_user_shape(n);
		if (!is_exchanged(n))
			continue;
		import_name(o, f, n->name, fname, sizeof(fname));
		mark_nbt_used(f, fname, used);
		const loom_st_tensor *t = loom_st_find(f, fname);
		if (t)
			used[t - loom_st_at(f, 0)] = 1;
		if (skipped(o, fname)) {
			r->skipped++;
			continue;
		}
		if (!t) {
			if (!r->missing++)
				snprintf(r->first_missing, sizeof(r->first_missing), "%s", fname);
			if (o->strict)
				return loom_program_fail(p, LOOM_ERR_NOT_FOUND,
							 "import %s: no tensor '%s' in the file (strict; "
							 "the program's %s)", path, fname, n->name);
			continue;
		}
		int tr;
		loom_status st = check_tensor(p, o, path, fname, t, &us, conv1d, r, &tr);
		if (st != LOOM_OK)
			return st;
		items[(*n_items)++] = (import_item){ v, t, tr };
		r->transposed += tr;
	}
	return count_unexpected(p, o, f, path, used, r);
}

/* Writes one tensor into node v (and its O2 master), as loom_write_f64. */
static loom_status import_value(loom_program *p, loom_value v, const loom_st_tensor *t,
				int transpose)
{
	const loom_node *n = &loom_io_plan(p)->g->nodes[v];
	/* A padded vocabulary's table: the file's rows, then zero padding
	 * rows (the storage's tail; engine/vocab_pad.c). */
	loom_shape us = loom_node_user_shape(n);
	int64_t cnt = loom_shape_numel(&us), whole = loom_shape_numel(&n->shape);
	size_t bytes = loom_io_value_bytes(p, v);
	void *tmp = calloc(1, bytes ? bytes : 1);
	float *m = n->master != LOOM_NONE ? calloc(whole ? whole : 1, sizeof(float)) : NULL;
	loom_status st = LOOM_OK;
	if (!tmp || (n->master != LOOM_NONE && !m)) {
		st = loom_program_fail(p, LOOM_ERR_NOMEM, "import: out of memory");
		goto out;
	}
	/* Conv1D: the program's [out, in] element (i, j) is the file's (j, i). */
	int64_t rows = us.ndim == 2 ? us.dims[0] : 1;
	int64_t cols = us.ndim == 2 ? us.dims[1] : cnt;
	for (int64_t i = 0; i < cnt; i++) {
		double x = st_get(t, transpose ? (i % cols) * rows + i / cols : i);
		loom_elem_set(n->dtype, tmp, i, x);
		if (m)
			m[i] = (float)x;
	}
	st = loom_value_write_whole(p, v, tmp); /* ZeRO-3: this rank's shards */
	if (st == LOOM_OK && m)
		st = loom_master_write(p, v, m);
out:
	free(tmp);
	free(m);
	return st;
}

loom_status loom_import_safetensors(loom_program *p, const char *path,
				    const loom_weights_opts *opts, loom_weights_report *report)
{
	const loom_plan *pl = loom_io_plan(p);
	loom_weights_opts def;
	loom_weights_report r = { 0 };
	char err[LOOM_ERR_MAX];
	loom_st_file *f = NULL;
	loom_status st = weights_args(p, path, "import", &opts, &def);
	if (st != LOOM_OK)
		return st;
	st = loom_st_read(path, &f, err, sizeof(err));
	if (st != LOOM_OK)
		return loom_program_fail(p, st, "import: %s", err);
	import_item *items = calloc(pl->n_fwd + 1, sizeof(*items));
	char *used = calloc(loom_st_count(f) + 1, 1);
	int n_items = 0;
	if (!items || !used) {
		st = loom_program_fail(p, LOOM_ERR_NOMEM, "import %s: out of memory", path);
		goto out;
	}
	if ((st = match(p, opts, f, path, items, &n_items, used, &r)) != LOOM_OK)
		goto out;
	for (int i = 0; i < n_items && st == LOOM_OK; i++)
		st = import_value(p, items[i].v, items[i].t, items[i].transpose);
	r.loaded = n_items;
out:
	if (report)
		*report = r;
	free(items);
	free(used);
	loom_st_free(f);
	return st;
}
