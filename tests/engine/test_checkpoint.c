/*
 * tests/engine/test_checkpoint.c — loom_save / loom_load on a small ConvNet
 * under O0 and O2: bit-exact round trips of everything a step depends on,
 * damaged and truncated files refused as corrupt and intact foreign ones
 * for what they are, each leaving the program and the file as they were,
 * failed saves that keep the old checkpoint, and a resumed run whose losses
 * equal the uninterrupted run's bit for bit.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>
#include <zlib.h>

#include "io/ckpt_file.h"
#include "engine/program_internal.h"
#include "loom.h"

#define BATCH 4
#define IMG 8

static char dir[4096];

static void make_dir(void)
{
	const char *base = getenv("TEST_TMPDIR");
	snprintf(dir, sizeof(dir), "%s/loomckptXXXXXX", base && base[0] ? base : "/tmp");
	cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
}

static char *in_dir(const char *name)
{
	char *p;
	cr_assert_geq(asprintf(&p, "%s/%s", dir, name), 0);
	return p;
}

typedef struct net_cfg {
	loom_opt_level level;
	int channels; /* conv1's output channels: another value is another graph */
	loom_optim_kind optim;
	double momentum;
	int growth_interval;
} net_cfg;

static const net_cfg O0_ADAMW = { LOOM_O0, 4, LOOM_OPTIM_ADAMW, 0, 0 };
static const net_cfg O2_ADAMW = { LOOM_O2, 4, LOOM_OPTIM_ADAMW, 0, 2 };

/* conv 3x3 -> bn -> relu -> maxpool 2 -> flatten -> linear -> CE, in f32. */
static loom_program *build(const net_cfg *c)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[4] = { BATCH, 1, IMG, IMG }, yd[1] = { BATCH };
	loom_value x = loom_input(g, "x", LOOM_F32, 4, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value h = loom_layer_conv2d(g, "conv1", x, c->channels, 3, 1, 1, 1);
	h = loom_layer_batchnorm2d(g, "bn1", h);
	h = loom_maxpool2d(g, loom_relu(g, h), 2, 2, 0);
	h = loom_layer_linear(g, "fc", loom_flatten(g, h), 3, 1);
	loom_value loss = loom_softmax_cross_entropy(g, h, y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));

	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.optim.kind = c->optim;
	o.optim.lr = 0.01;
	o.optim.momentum = c->momentum;
	o.optim.weight_decay = 0.01;
	o.amp.level = c->level;
	if (c->growth_interval)
		o.amp.growth_interval = c->growth_interval;
	loom_program *p;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	loom_graph_free(g);
	return p;
}

/* Batch k: a fixed pseudo-random image set (an LCG seeded by k). */
static void feed(loom_program *p, int k)
{
	float x[BATCH * IMG * IMG];
	int32_t y[BATCH];
	uint32_t s = 2654435761u * (uint32_t)(k + 1);
	for (size_t i = 0; i < sizeof(x) / sizeof(x[0]); i++) {
		s = s * 1664525u + 1013904223u;
		x[i] = (float)((s >> 8) & 0xffff) / 32768.0f - 1.0f;
	}
	for (int i = 0; i < BATCH; i++)
		y[i] = (i * 7 + k) % 3;
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, sizeof(x) / sizeof(x[0])), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "y", y, LOOM_I32, BATCH), LOOM_OK);
}

static double train(loom_program *p, int k)
{
	feed(p, k);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	return loom_loss(p);
}

/*
 * What a checkpoint must carry, byte for byte: the arena bytes of every
 * parameter and buffer (running statistics, O2 masters), the whole optimizer
 * state region, and the run-time scalars.
 */
typedef struct snap {
	unsigned char *values, *state;
	size_t values_bytes, state_bytes;
	int64_t step;
	double lr;
	loom_scaler scaler;
} snap;

static snap take(const loom_program *p)
{
	snap s = { 0 };
	for (int v = 0; v < p->plan.n_fwd; v++) {
		loom_op op = p->plan.g->nodes[v].op;
		if (op == LOOM_OP_PARAM || op == LOOM_OP_BUFFER)
			s.values_bytes += loom_value_bytes(p, v);
	}
	s.values = malloc(s.values_bytes + 1);
	size_t off = 0;
	for (int v = 0; v < p->plan.n_fwd; v++) {
		loom_op op = p->plan.g->nodes[v].op;
		if (op != LOOM_OP_PARAM && op != LOOM_OP_BUFFER)
			continue;
		cr_assert_eq(p->plan.mp.region[v], LOOM_REGION_PERSIST);
		memcpy(s.values + off, loom_value_ptr(p, v), loom_value_bytes(p, v));
		off += loom_value_bytes(p, v);
	}
	s.state_bytes = p->plan.state_bytes;
	s.state = malloc(s.state_bytes + 1);
	memcpy(s.state, p->arena.state, s.state_bytes);
	s.step = p->ts.step;
	s.lr = p->ts.lr;
	s.scaler = p->ts.scaler;
	return s;
}

static void drop(snap *s)
{
	free(s->values);
	free(s->state);
}

/* The first field of the loss scaler that differs between a and b, with
 * both values ("growth_tracker 3 vs 4"), into buf; 0 if none does (every
 * field, so that a difference is never reported as "scale 65536 vs
 * 65536"). */
static int scaler_diff(const loom_scaler *a, const loom_scaler *b, char *buf, size_t len)
{
#define F(field, fmt, cast)                                                               \
	if (memcmp(&a->field, &b->field, sizeof(a->field)))                               \
		return snprintf(buf, len, #field " " fmt " vs " fmt, (cast)a->field,      \
				(cast)b->field), 1;
	F(scale, "%g", double)
	F(growth_factor, "%g", double)
	F(backoff_factor, "%g", double)
	F(max_scale, "%g", double)
	F(growth_tracker, "%d", int)
	F(growth_interval, "%d", int)
	F(dynamic, "%d", int)
	F(pad_, "%d", int)
	F(skipped_steps, "%lld", long long)
	F(below_one_steps, "%lld", long long)
#undef F
	/* A field added to loom_scaler and not above: still a difference. */
	if (memcmp(a, b, sizeof(*a)))
		return snprintf(buf, len, "a field this test does not name yet"), 1;
	buf[0] = 0;
	return 0;
}

static void assert_same(const snap *a, const snap *b, const char *what)
{
	char sd[128];
	cr_assert_eq(a->values_bytes, b->values_bytes, "%s", what);
	cr_assert_eq(a->state_bytes, b->state_bytes, "%s", what);
	for (size_t i = 0; i < a->values_bytes; i++)
		cr_assert_eq(a->values[i], b->values[i], "%s: parameter/buffer byte %zu differs", what, i);
	for (size_t i = 0; i < a->state_bytes; i++)
		cr_assert_eq(a->state[i], b->state[i], "%s: optimizer state byte %zu differs", what, i);
	cr_assert_eq(a->step, b->step, "%s: step", what);
	cr_assert_eq(a->lr, b->lr, "%s: lr", what);
	cr_assert(!scaler_diff(&a->scaler, &b->scaler, sd, sizeof(sd)), "%s: loss scaler %s", what,
		  sd);
}

static int snaps_equal(const snap *a, const snap *b)
{
	return a->values_bytes == b->values_bytes && a->state_bytes == b->state_bytes &&
	       memcmp(a->values, b->values, a->values_bytes) == 0 &&
	       memcmp(a->state, b->state, a->state_bytes) == 0 && a->step == b->step &&
	       a->lr == b->lr && memcmp(&a->scaler, &b->scaler, sizeof(a->scaler)) == 0;
}

static unsigned char *slurp(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	fseek(f, 0, SEEK_END);
	*n = (size_t)ftell(f);
	fseek(f, 0, SEEK_SET);
	unsigned char *b = malloc(*n + 1);
	cr_assert_eq(fread(b, 1, *n, f), *n);
	fclose(f);
	return b;
}

/* Always a new file: ext4 flushes a file truncated and rewritten on close,
 * which would make the every-byte tests wait on the disk thousands of times. */
static void spit(const char *path, const unsigned char *b, size_t n)
{
	cr_assert(unlink(path) == 0 || errno == ENOENT, "%s: %s", path, strerror(errno));
	FILE *f = fopen(path, "wb");
	cr_assert_not_null(f, "%s: %s", path, strerror(errno));
	cr_assert_eq(fwrite(b, 1, n, f), n);
	cr_assert_eq(fclose(f), 0);
}

/* Trains a few steps so that nothing is at its initial value. */
static void warm_up(loom_program *p, int first, int n)
{
	for (int k = first; k < first + n; k++)
		train(p, k);
}

static void round_trip(const net_cfg *c)
{
	make_dir();
	char *path = in_dir("a.ckpt");
	loom_program *p = build(c);
	warm_up(p, 0, 3);
	cr_assert_eq(loom_set_lr(p, 0.0125), LOOM_OK);
	snap saved = take(p);
	cr_assert_eq(loom_save(p, path), LOOM_OK, "%s", loom_program_error(p));

	/* The same program, moved on, comes back exactly. */
	warm_up(p, 3, 2);
	cr_assert_eq(loom_set_lr(p, 0.5), LOOM_OK);
	snap moved = take(p);
	cr_assert(!snaps_equal(&saved, &moved), "training did not change the program");
	cr_assert_eq(loom_load(p, path), LOOM_OK, "%s", loom_program_error(p));
	snap back = take(p);
	assert_same(&saved, &back, "load into the same program");

	/* A fresh program gets the same bytes. */
	loom_program *q = build(c);
	warm_up(q, 10, 1);
	cr_assert_eq(loom_load(q, path), LOOM_OK, "%s", loom_program_error(q));
	snap fresh = take(q);
	assert_same(&saved, &fresh, "load into a fresh program");
	loom_program_info ip, iq;
	loom_program_info_get(p, &ip);
	loom_program_info_get(q, &iq);
	cr_assert_eq(ip.loss_scale, iq.loss_scale);
	cr_assert_eq(ip.skipped_steps, iq.skipped_steps);
	cr_assert_eq(loom_step_count(q), saved.step);
	cr_assert_eq(loom_get_lr(q), 0.0125);

	drop(&saved);
	drop(&moved);
	drop(&back);
	drop(&fresh);
	loom_program_free(p);
	loom_program_free(q);
	free(path);
}

Test(checkpoint, round_trip_bit_exact_o0)
{
	round_trip(&O0_ADAMW);
}

Test(checkpoint, round_trip_bit_exact_o2)
{
	round_trip(&O2_ADAMW);
}

Test(checkpoint, round_trip_sgd_momentum_o0)
{
	net_cfg c = { LOOM_O0, 4, LOOM_OPTIM_SGD, 0.9, 0 };
	round_trip(&c);
}

/* The file holds what the header promises: every parameter, buffer, the O2
 * masters, the optimizer state and the meta record. */
Test(checkpoint, records_named_as_documented_o2)
{
	make_dir();
	char *path = in_dir("a.ckpt");
	loom_program *p = build(&O2_ADAMW);
	warm_up(p, 0, 1);
	cr_assert_eq(loom_save(p, path), LOOM_OK, "%s", loom_program_error(p));
	char err[512];
	loom_ckpt_file *f;
	cr_assert_eq(loom_ckpt_read(path, &f, err, sizeof(err)), LOOM_OK, "%s", err);
	const char *names[] = { "conv1.weight", "conv1.weight.master", "conv1.bias.master",
				"bn1.weight", "bn1.running_mean", "bn1.running_var",
				"fc.weight", "fc.weight.master", "fc.bias.master",
				"optim.conv1.weight.0", "optim.fc.bias.1", "loom.meta" };
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		cr_assert_not_null(loom_ckpt_find(f, names[i]), "no record '%s'", names[i]);
	cr_assert_eq(loom_ckpt_find(f, "fc.weight")->dtype, LOOM_F16);
	cr_assert_eq(loom_ckpt_find(f, "fc.weight.master")->dtype, LOOM_F32);
	/* keep_batchnorm_fp32: batch norm has no half copy and no master. */
	cr_assert_eq(loom_ckpt_find(f, "bn1.weight")->dtype, LOOM_F32);
	cr_assert_null(loom_ckpt_find(f, "bn1.weight.master"));
	loom_ckpt_free(f);
	loom_program_free(p);
	free(path);
}

static void check_refused(loom_program *p, const snap *before, const char *path,
			  loom_status st, const char *what)
{
	cr_assert_neq(st, LOOM_OK, "%s: accepted", what);
	cr_assert_neq(strstr(loom_program_error(p), path), NULL, "%s: message '%s' does not name %s",
		      what, loom_program_error(p), path);
	snap now = take(p);
	cr_assert(snaps_equal(before, &now), "%s: the refused load changed the program", what);
	drop(&now);
}

/* Writes b to path, loads it into p, checks that the load is refused with
 * the program and the file left as they were, and returns the status. */
static loom_status load_refused(loom_program *p, const snap *before, const char *path,
				const unsigned char *b, size_t n, const char *what)
{
	spit(path, b, n);
	loom_status st = loom_load(p, path);
	check_refused(p, before, path, st, what);
	size_t m;
	unsigned char *after = slurp(path, &m);
	cr_assert(m == n && memcmp(after, b, n) == 0, "%s: the refused file was changed", what);
	free(after);
	return st;
}

/* Stores the CRC of everything before the trailer, as a writer would: the
 * file is then intact, whatever it says. */
static void reseal(unsigned char *b, size_t n)
{
	uint32_t crc = (uint32_t)crc32(crc32(0L, Z_NULL, 0), b, (uInt)(n - 4));
	for (int i = 0; i < 4; i++)
		b[n - 4 + i] = (unsigned char)(crc >> (8 * i));
}

/*
 * Every single flipped byte is refused and leaves the program and the file
 * alone. The CRC covers every byte before the trailer and is checked before
 * any field is parsed, so:
 *   bytes 0..7 (the magic, checked first) give LOOM_ERR_FORMAT, "not a loom
 *     checkpoint": a file that does not start with it is not ours to judge;
 *   bytes 8..n-5 (version, count, fingerprint, names, lengths, dtypes, dims,
 *     padding, payloads) give LOOM_ERR_CORRUPT, "checksum mismatch";
 *   bytes n-4..n-1 (the CRC itself, outside what it covers) give
 *     LOOM_ERR_CORRUPT too: the stored value no longer matches.
 * Each byte is flipped whole and in its low bit only.
 */
static void flipped_bytes(const net_cfg *c)
{
	static const unsigned char masks[] = { 0xff, 0x01 };
	make_dir();
	char *path = in_dir("a.ckpt"), *bad = in_dir("bad.ckpt");
	loom_program *p = build(c);
	warm_up(p, 0, 2);
	cr_assert_eq(loom_save(p, path), LOOM_OK, "%s", loom_program_error(p));
	warm_up(p, 2, 1);
	snap before = take(p);
	size_t n;
	unsigned char *b = slurp(path, &n);
	for (size_t i = 0; i < n; i++) {
		for (size_t m = 0; m < sizeof(masks); m++) {
			char what[80];
			snprintf(what, sizeof(what), "byte %zu of %zu flipped by 0x%02x", i, n,
				 masks[m]);
			b[i] ^= masks[m];
			loom_status st = load_refused(p, &before, bad, b, n, what);
			b[i] ^= masks[m];
			const char *msg = loom_program_error(p);
			if (i < 8) {
				cr_assert_eq(st, LOOM_ERR_FORMAT, "%s: %s (%s)", what,
					     loom_status_string(st), msg);
				cr_assert_neq(strstr(msg, "not a loom checkpoint"), NULL, "%s: %s",
					      what, msg);
			} else {
				cr_assert_eq(st, LOOM_ERR_CORRUPT, "%s: %s (%s)", what,
					     loom_status_string(st), msg);
				cr_assert_neq(strstr(msg, "checksum"), NULL, "%s: %s", what, msg);
			}
		}
	}
	/* The intact file still loads. */
	cr_assert_eq(loom_load(p, path), LOOM_OK, "%s", loom_program_error(p));
	drop(&before);
	free(b);
	loom_program_free(p);
	free(path);
	free(bad);
}

Test(checkpoint, any_flipped_byte_refused_o0)
{
	flipped_bytes(&O0_ADAMW);
}

Test(checkpoint, any_flipped_byte_refused_o2)
{
	flipped_bytes(&O2_ADAMW);
}

/* A cut or extended file is a damaged one: too short for a header and the
 * trailer it is FORMAT (nothing there to check a CRC against), any longer
 * the CRC no longer matches and it is CORRUPT. */
Test(checkpoint, truncated_refused)
{
	make_dir();
	char *path = in_dir("a.ckpt"), *bad = in_dir("short.ckpt");
	loom_program *p = build(&O2_ADAMW);
	warm_up(p, 0, 2);
	cr_assert_eq(loom_save(p, path), LOOM_OK, "%s", loom_program_error(p));
	warm_up(p, 2, 1);
	snap before = take(p);
	size_t n;
	unsigned char *b = slurp(path, &n);
	size_t cuts[] = { 0, 7, 8, 20, 27, 28, 64, n / 2, n - 5, n - 4, n - 1 };
	for (size_t i = 0; i < sizeof(cuts) / sizeof(cuts[0]); i++) {
		char what[64];
		snprintf(what, sizeof(what), "truncated to %zu of %zu bytes", cuts[i], n);
		loom_status st = load_refused(p, &before, bad, b, cuts[i], what);
		cr_assert_eq(st, cuts[i] < 28 ? LOOM_ERR_FORMAT : LOOM_ERR_CORRUPT, "%s: %s (%s)",
			     what, loom_status_string(st), loom_program_error(p));
	}
	unsigned char *longer = calloc(1, n + 8);
	memcpy(longer, b, n);
	loom_status st = load_refused(p, &before, bad, longer, n + 8, "8 bytes appended");
	cr_assert_eq(st, LOOM_ERR_CORRUPT, "%s", loom_program_error(p));
	free(longer);
	/* A missing file is NOT_FOUND, also naming it. */
	char *none = in_dir("none.ckpt");
	check_refused(p, &before, none, loom_load(p, none), "missing file");
	cr_assert_eq(loom_load(p, none), LOOM_ERR_NOT_FOUND);
	drop(&before);
	free(b);
	free(none);
	loom_program_free(p);
	free(path);
	free(bad);
}

/*
 * Intact files that are not this program's checkpoint: their CRC matches,
 * so what is wrong with them is reported, not corruption. Not a checkpoint
 * at all and a malformed one are FORMAT, another format version MISMATCH
 * (ckpt_file.h), another graph MISMATCH (other_graph_refused below).
 */
Test(checkpoint, intact_foreign_files_refused)
{
	make_dir();
	char *path = in_dir("a.ckpt"), *bad = in_dir("foreign.ckpt");
	loom_program *p = build(&O0_ADAMW);
	warm_up(p, 0, 1);
	cr_assert_eq(loom_save(p, path), LOOM_OK, "%s", loom_program_error(p));
	warm_up(p, 1, 1);
	snap before = take(p);
	size_t n;
	unsigned char *b = slurp(path, &n);
	unsigned char *c = malloc(n);
	loom_status st;

	static const char text[] = "step,loss\n0,1.0986\n1,1.0412\n2,0.9977\n";
	st = load_refused(p, &before, bad, (const unsigned char *)text, sizeof(text) - 1,
			  "a text file");
	cr_assert_eq(st, LOOM_ERR_FORMAT, "%s", loom_program_error(p));
	cr_assert_neq(strstr(loom_program_error(p), "not a loom checkpoint"), NULL, "%s",
		      loom_program_error(p));

	/* Another magic, sealed with a valid CRC: still not ours. */
	memcpy(c, b, n);
	memcpy(c, "LOOMCKPX", 8);
	reseal(c, n);
	st = load_refused(p, &before, bad, c, n, "another magic");
	cr_assert_eq(st, LOOM_ERR_FORMAT, "%s", loom_program_error(p));

	/* A later format version. */
	memcpy(c, b, n);
	c[8] = 2;
	reseal(c, n);
	st = load_refused(p, &before, bad, c, n, "format version 2");
	cr_assert_eq(st, LOOM_ERR_MISMATCH, "%s", loom_program_error(p));
	cr_assert_neq(strstr(loom_program_error(p), "version 2"), NULL, "%s",
		      loom_program_error(p));

	/* Malformed but sealed: one record more than the file holds, a count
	 * that would be an absurd allocation, a name length past the end. The
	 * parser must refuse them without reading out of bounds. */
	static const struct {
		size_t off;
		uint32_t v;
		const char *what;
	} lies[] = { { 12, 0, "one record more" }, { 12, 0xffffffffu, "2^32-1 records" },
		     { 24, 0xfffffff0u, "a 4 GiB name" }, { 24, 1, "an empty name" } };
	for (size_t i = 0; i < sizeof(lies) / sizeof(lies[0]); i++) {
		memcpy(c, b, n);
		uint32_t v = lies[i].v;
		if (!v) /* the record count, plus one */
			v = (c[12] | c[13] << 8 | c[14] << 16 | (uint32_t)c[15] << 24) + 1;
		for (int k = 0; k < 4; k++)
			c[lies[i].off + k] = (unsigned char)(v >> (8 * k));
		reseal(c, n);
		st = load_refused(p, &before, bad, c, n, lies[i].what);
		cr_assert_eq(st, LOOM_ERR_FORMAT, "%s: %s (%s)", lies[i].what,
			     loom_status_string(st), loom_program_error(p));
		cr_assert_neq(strstr(loom_program_error(p), "malformed"), NULL, "%s: %s",
			      lies[i].what, loom_program_error(p));
	}

	/* The original still loads. */
	cr_assert_eq(loom_load(p, path), LOOM_OK, "%s", loom_program_error(p));
	drop(&before);
	free(b);
	free(c);
	loom_program_free(p);
	free(path);
	free(bad);
}

/*
 * Writes path's records again to bad, with the run-time scalars of loom.meta
 * (step, lr, scale, tracker, skipped, below-one) replaced: a file a faulty
 * writer could make, intact as far as the CRC can tell.
 */
static void write_meta(const char *path, const char *bad, int field, double v)
{
	char err[512];
	loom_ckpt_file *f;
	cr_assert_eq(loom_ckpt_read(path, &f, err, sizeof(err)), LOOM_OK, "%s", err);
	int n = loom_ckpt_count(f);
	loom_ckpt_record *r = calloc(n, sizeof(*r));
	double meta[6];
	for (int i = 0; i < n; i++) {
		r[i] = *loom_ckpt_at(f, i);
		if (strcmp(r[i].name, "loom.meta") == 0) {
			cr_assert_eq(r[i].bytes, sizeof(meta));
			memcpy(meta, r[i].data, sizeof(meta));
			meta[field] = v;
			r[i].data = meta;
		}
	}
	cr_assert_eq(loom_ckpt_write(bad, loom_ckpt_fingerprint(f), r, n, err, sizeof(err)),
		     LOOM_OK, "%s", err);
	free(r);
	loom_ckpt_free(f);
}

/* A CRC proves the bytes are the writer's, not that the writer was right:
 * every scalar is range-checked, and the refusal names the field. */
Test(checkpoint, meta_fields_out_of_range_refused)
{
	make_dir();
	char *path = in_dir("a.ckpt"), *bad = in_dir("bad.ckpt");
	loom_program *p = build(&O2_ADAMW);
	warm_up(p, 0, 2);
	cr_assert_eq(loom_save(p, path), LOOM_OK, "%s", loom_program_error(p));
	warm_up(p, 2, 1);
	snap before = take(p);
	static const struct {
		int field;
		double v;
		const char *name;
	} lies[] = {
		{ 0, -5, "'step'" }, { 0, NAN, "'step'" }, { 0, 1e300, "'step'" },
		{ 0, -INFINITY, "'step'" }, { 0, 2.5, "'step'" },
		{ 1, NAN, "'learning rate'" }, { 1, -0.1, "'learning rate'" },
		{ 1, INFINITY, "'learning rate'" },
		{ 2, NAN, "'loss scale'" }, { 2, -1, "'loss scale'" }, { 2, 0, "'loss scale'" },
		{ 2, 1e300, "'loss scale'" }, { 2, 1e-311, "'loss scale'" },
		{ 3, -1, "'loss scaler growth tracker'" }, { 3, 1e10, "'loss scaler growth tracker'" },
		{ 4, -1, "'skipped steps'" }, { 4, NAN, "'skipped steps'" },
		{ 5, -3, "'steps with the loss scale below 1'" },
	};
	for (size_t i = 0; i < sizeof(lies) / sizeof(lies[0]); i++) {
		write_meta(path, bad, lies[i].field, lies[i].v);
		size_t n, m;
		unsigned char *b = slurp(bad, &n);
		loom_status st = loom_load(p, bad);
		check_refused(p, &before, bad, st, lies[i].name);
		cr_assert_eq(st, LOOM_ERR_FORMAT, "%s = %g: %s", lies[i].name, lies[i].v,
			     loom_status_string(st));
		cr_assert_neq(strstr(loom_program_error(p), lies[i].name), NULL,
			      "%s = %g: the message does not name the field: %s", lies[i].name,
			      lies[i].v, loom_program_error(p));
		unsigned char *a = slurp(bad, &m);
		cr_assert(m == n && memcmp(a, b, n) == 0, "%s: the refused file changed",
			  lies[i].name);
		free(a);
		free(b);
	}
	/* The good file still loads; values at the edges are fine. */
	cr_assert_eq(loom_load(p, path), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_step_count(p), 2);
	write_meta(path, bad, 2, 0.25);
	cr_assert_eq(loom_load(p, bad), LOOM_OK, "%s", loom_program_error(p));
	drop(&before);
	loom_program_free(p);
	free(path);
	free(bad);
}

static void expect_mismatch(const net_cfg *saved_cfg, const net_cfg *load_cfg, const char *what)
{
	make_dir();
	char *path = in_dir("a.ckpt");
	loom_program *p = build(saved_cfg);
	warm_up(p, 0, 1);
	cr_assert_eq(loom_save(p, path), LOOM_OK, "%s", loom_program_error(p));
	loom_program *q = build(load_cfg);
	warm_up(q, 5, 1);
	snap before = take(q);
	loom_status st = loom_load(q, path);
	cr_assert_eq(st, LOOM_ERR_MISMATCH, "%s: %s (%s)", what, loom_status_string(st),
		     loom_program_error(q));
	check_refused(q, &before, path, st, what);
	drop(&before);
	loom_program_free(p);
	loom_program_free(q);
	free(path);
}

Test(checkpoint, other_graph_refused)
{
	net_cfg wide = O0_ADAMW;
	wide.channels = 6;
	expect_mismatch(&O0_ADAMW, &wide, "conv1 with 6 channels");
	expect_mismatch(&wide, &O0_ADAMW, "conv1 with 4 channels");
}

Test(checkpoint, other_options_refused)
{
	net_cfg sgd = O0_ADAMW, o1 = O0_ADAMW, sgd_mom = O0_ADAMW;
	sgd.optim = LOOM_OPTIM_SGD;
	sgd_mom.optim = LOOM_OPTIM_SGD;
	sgd_mom.momentum = 0.9;
	o1.level = LOOM_O1;
	expect_mismatch(&O0_ADAMW, &sgd, "adamw checkpoint into sgd");
	expect_mismatch(&O0_ADAMW, &O2_ADAMW, "O0 checkpoint into O2");
	expect_mismatch(&O2_ADAMW, &O0_ADAMW, "O2 checkpoint into O0");
	expect_mismatch(&O0_ADAMW, &o1, "O0 checkpoint into O1");
	/* Same fingerprint, but the momentum buffers are not in the file. */
	expect_mismatch(&sgd, &sgd_mom, "sgd checkpoint into sgd with momentum");
}

Test(checkpoint, save_into_missing_directory_fails)
{
	make_dir();
	char *path = in_dir("a.ckpt"), *missing = in_dir("no/such/dir/a.ckpt");
	loom_program *p = build(&O0_ADAMW);
	warm_up(p, 0, 1);
	cr_assert_eq(loom_save(p, path), LOOM_OK, "%s", loom_program_error(p));
	size_t n0, n1;
	unsigned char *b0 = slurp(path, &n0);
	warm_up(p, 1, 1);
	loom_status st = loom_save(p, missing);
	cr_assert_eq(st, LOOM_ERR_IO, "%s", loom_status_string(st));
	cr_assert_neq(strstr(loom_program_error(p), missing), NULL, "%s", loom_program_error(p));
	struct stat sb;
	cr_assert_neq(stat(missing, &sb), 0);
	cr_assert_eq(loom_save(p, ""), LOOM_ERR_INVALID);
	cr_assert_eq(loom_save(p, NULL), LOOM_ERR_INVALID);

	/* A save over an existing checkpoint that fails half way (its .tmp
	 * cannot be created) leaves the old file as it was. */
	char *tmp;
	cr_assert_geq(asprintf(&tmp, "%s.tmp", path), 0);
	cr_assert_eq(mkdir(tmp, 0700), 0);
	cr_assert_neq(loom_save(p, path), LOOM_OK);
	unsigned char *b1 = slurp(path, &n1);
	cr_assert_eq(n0, n1);
	cr_assert_eq(memcmp(b0, b1, n0), 0, "the failed save changed the old checkpoint");
	cr_assert_eq(rmdir(tmp), 0);
	/* ... and it still loads, to the state it was saved from. */
	cr_assert_eq(loom_load(p, path), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_step_count(p), 1);
	free(b0);
	free(b1);
	free(tmp);
	free(missing);
	loom_program_free(p);
	free(path);
}

/*
 * Train N steps saving after step K; a fresh program (moved off its initial
 * state first) loads step K and, fed the same batches, reproduces the
 * original losses and final bytes exactly.
 */
static void resume(const net_cfg *c)
{
	enum { N = 9, K = 2 };
	make_dir();
	char *path = in_dir("k.ckpt");
	double want[N], got[N];
	snap at_save = { 0 };
	loom_program *p = build(c);
	for (int k = 0; k < N; k++) {
		if (k == 1)
			cr_assert_eq(loom_set_lr(p, 0.02), LOOM_OK);
		want[k] = train(p, k);
		if (k + 1 == K) {
			cr_assert_eq(loom_save(p, path), LOOM_OK, "%s", loom_program_error(p));
			at_save = take(p);
		}
	}
	loom_program_info end_info;
	loom_program_info_get(p, &end_info);
	snap end = take(p);

	loom_program *q = build(c);
	warm_up(q, 20, 2);
	cr_assert_eq(loom_load(q, path), LOOM_OK, "%s", loom_program_error(q));
	cr_assert_eq(loom_step_count(q), at_save.step);
	cr_assert_eq(loom_get_lr(q), 0.02);
	loom_program_info qi;
	loom_program_info_get(q, &qi);
	cr_assert_eq(qi.loss_scale, at_save.scaler.scale);
	for (int k = K; k < N; k++) {
		got[k] = train(q, k);
		cr_assert_eq(memcmp(&got[k], &want[k], sizeof(double)), 0,
			     "step %d: resumed loss %.17g, original %.17g", k, got[k], want[k]);
	}
	snap end_q = take(q);
	assert_same(&end, &end_q, "after resuming");
	loom_program_info_get(q, &qi);
	cr_assert_eq(qi.skipped_steps, end_info.skipped_steps);
	if (c->level == LOOM_O2) {
		/* The run this checks: the saved scale had grown, and later steps
		 * were skipped, so a scaler restored wrong would show. */
		cr_assert_gt(at_save.scaler.scale, 65536.0f, "scale at save %g", at_save.scaler.scale);
		cr_assert_gt(end_info.skipped_steps, 0);
	}
	drop(&at_save);
	drop(&end);
	drop(&end_q);
	loom_program_free(p);
	loom_program_free(q);
	free(path);
}

Test(checkpoint, resume_continues_loss_curve_o0)
{
	resume(&O0_ADAMW);
}

/* O2: half weights, fp32 masters, and a dynamic scale. With growth
 * interval 2 this model's scale grows to 2^17 after two steps, then
 * overflows and backs off every third step: the checkpoint holds a grown
 * scale, and the resumed run passes through skips and growths. */
Test(checkpoint, resume_continues_loss_curve_o2)
{
	resume(&O2_ADAMW);
}

Test(checkpoint, resume_continues_loss_curve_sgd_momentum_o2)
{
	net_cfg c = { LOOM_O2, 4, LOOM_OPTIM_SGD, 0.9, 2 };
	resume(&c);
}

/* Two checkpoints' scalers that differ in one field are reported by that
 * field's name and values, whichever it is. */
Test(checkpoint, a_scaler_difference_names_its_field)
{
	loom_scaler a, b;
	char buf[128];
	memset(&a, 0, sizeof(a));
	cr_assert_eq(loom_scaler_init(&a, 65536, 2000, 1), 0);
	b = a;
	cr_assert_eq(scaler_diff(&a, &b, buf, sizeof(buf)), 0);
	b.growth_tracker = a.growth_tracker + 1;
	cr_assert_eq(scaler_diff(&a, &b, buf, sizeof(buf)), 1);
	cr_assert_str_eq(buf, "growth_tracker 0 vs 1");
	b = a;
	b.skipped_steps = 3;
	cr_assert_eq(scaler_diff(&a, &b, buf, sizeof(buf)), 1);
	cr_assert_str_eq(buf, "skipped_steps 0 vs 3");
	b = a;
	b.scale = 32768;
	cr_assert_eq(scaler_diff(&a, &b, buf, sizeof(buf)), 1);
	cr_assert_str_eq(buf, "scale 65536 vs 32768");
}
