/*
 * tests/engine/test_weights.c — loom_export_safetensors and
 * loom_import_safetensors on the ConvNet under PyTorch's names: a bit-exact
 * round trip (tensors and eval logits), strict and non-strict handling of
 * missing and unexpected names, wrong shapes and dtypes named, F16 and BF16
 * converted on import, --reinit's skip, and O2's master weights.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "base/half.h"
#include "io/safetensors.h"
#include "examples/models.h"
#include "loom.h"
#include "loom_io.h"

#define BATCH 4
#define PIX (28 * 28)

static char dir[4096];

static char *in_dir(const char *name)
{
	char *p;
	if (!dir[0]) {
		const char *base = getenv("TEST_TMPDIR");
		snprintf(dir, sizeof(dir), "%s/loomweightsXXXXXX", base && base[0] ? base : "/tmp");
		cr_assert_not_null(mkdtemp(dir), "mkdtemp: %s", strerror(errno));
	}
	cr_assert_geq(asprintf(&p, "%s/%s", dir, name), 0);
	return p;
}

typedef struct net {
	loom_program *p;
	loom_value logits;
} net;

static net build(uint64_t seed, loom_opt_level level)
{
	net n;
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_graph_set_seed(g, seed);
	loom_value loss = loom_model_convnet(g, BATCH, &n.logits);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.amp.level = level;
	cr_assert_eq(loom_compile(g, loss, &o, &n.p), LOOM_OK, "%s", loom_last_error());
	loom_graph_free(g);
	return n;
}

static void feed(loom_program *p, unsigned seed)
{
	float x[BATCH * PIX];
	int32_t y[BATCH];
	srand(seed);
	for (int i = 0; i < BATCH * PIX; i++)
		x[i] = (float)rand() / RAND_MAX * 2 - 1;
	for (int i = 0; i < BATCH; i++)
		y[i] = rand() % 10;
	cr_assert_eq(loom_set_input(p, "image", x, LOOM_F32, BATCH * PIX), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "label", y, LOOM_I32, BATCH), LOOM_OK);
}

static void train(loom_program *p, int steps)
{
	for (int s = 0; s < steps; s++) {
		feed(p, 100 + s);
		cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	}
}

static void eval_logits(net *n, float *out)
{
	feed(n->p, 7);
	cr_assert_eq(loom_run(n->p, LOOM_RUN_EVAL), LOOM_OK, "%s", loom_program_error(n->p));
	cr_assert_eq(loom_read(n->p, n->logits, out, BATCH * 10), LOOM_OK);
}

static loom_weights_opts torch_names(void)
{
	loom_weights_opts o;
	loom_convnet_weights_opts(&o);
	return o;
}

static loom_st_file *read_st(const char *path)
{
	char err[512];
	loom_st_file *f = NULL;
	cr_assert_eq(loom_st_read(path, &f, err, sizeof(err)), LOOM_OK, "%s", err);
	return f;
}

static int is_nbt(const char *name)
{
	return strstr(name, ".num_batches_tracked") != NULL;
}

/* Every tensor of a (but num_batches_tracked) in b, byte for byte. */
static void same_tensors(const char *pa, const char *pb)
{
	loom_st_file *a = read_st(pa), *b = read_st(pb);
	cr_assert_eq(loom_st_count(a), loom_st_count(b));
	for (int i = 0; i < loom_st_count(a); i++) {
		const loom_st_tensor *x = loom_st_at(a, i), *y = loom_st_find(b, x->name);
		cr_assert_not_null(y, "%s missing", x->name);
		if (is_nbt(x->name))
			continue;
		cr_expect_eq(x->dtype, y->dtype, "%s", x->name);
		cr_expect_eq(x->bytes, y->bytes, "%s", x->name);
		cr_expect_eq(memcmp(x->data, y->data, x->bytes), 0, "%s differs", x->name);
	}
	loom_st_free(a);
	loom_st_free(b);
}

/* Writes f's tensors to path, with edit() changing the list first. */
typedef int (*edit_fn)(loom_st_tensor *t, int n, void *user);

static void rewrite(const char *src, const char *dst, edit_fn edit, void *user)
{
	loom_st_file *f = read_st(src);
	int n = loom_st_count(f);
	loom_st_tensor *t = calloc(n + 1, sizeof(*t));
	for (int i = 0; i < n; i++)
		t[i] = *loom_st_at(f, i);
	n = edit(t, n, user);
	char err[512];
	cr_assert_eq(loom_st_write(dst, t, n, NULL, 0, err, sizeof(err)), LOOM_OK, "%s", err);
	free(t);
	loom_st_free(f);
}

/* A trained ConvNet exported to "ref.safetensors". */
static net reference(char **path)
{
	net a = build(1, LOOM_O0);
	train(a.p, 2);
	*path = in_dir("ref.safetensors");
	loom_weights_opts o = torch_names();
	cr_assert_eq(loom_export_safetensors(a.p, *path, &o), LOOM_OK, "%s",
		     loom_program_error(a.p));
	return a;
}

Test(weights, export_has_pytorch_names)
{
	char *path;
	net a = reference(&path);
	loom_st_file *f = read_st(path);
	static const char *names[] = {
		"layer1.0.weight", "layer1.0.bias", "layer1.1.weight", "layer1.1.bias",
		"layer1.1.running_mean", "layer1.1.running_var", "layer1.1.num_batches_tracked",
		"layer2.0.weight", "layer2.0.bias", "layer2.1.weight", "layer2.1.bias",
		"layer2.1.running_mean", "layer2.1.running_var", "layer2.1.num_batches_tracked",
		"fc.weight", "fc.bias",
	};
	cr_expect_eq(loom_st_count(f), 16);
	for (size_t i = 0; i < sizeof(names) / sizeof(names[0]); i++)
		cr_expect_not_null(loom_st_find(f, names[i]), "no %s", names[i]);
	const loom_st_tensor *nbt = loom_st_find(f, "layer1.1.num_batches_tracked");
	cr_expect_eq(nbt->dtype, LOOM_ST_I64);
	cr_expect_eq(nbt->ndim, 0);
	int64_t count;
	memcpy(&count, nbt->data, 8);
	cr_expect_eq(count, 2, "two training steps, counted %lld", (long long)count);
	const loom_st_tensor *w = loom_st_find(f, "layer1.0.weight");
	cr_expect_eq(w->dtype, LOOM_ST_F32);
	cr_expect(w->ndim == 4 && w->dims[0] == 16 && w->dims[1] == 1 && w->dims[2] == 5 &&
		  w->dims[3] == 5);
	cr_expect_str_eq(loom_st_metadata(f, "format"), "pt");
	loom_st_free(f);
	loom_program_free(a.p);
	free(path);
}

Test(weights, round_trip_is_bit_exact)
{
	char *path, *again = in_dir("again.safetensors");
	net a = reference(&path), b = build(2, LOOM_O0);
	float za[BATCH * 10], zb[BATCH * 10];
	loom_weights_opts o = torch_names();
	loom_weights_report r;

	eval_logits(&b, zb);
	eval_logits(&a, za);
	cr_assert_neq(memcmp(za, zb, sizeof(za)), 0, "two seeds gave the same model");
	cr_assert_eq(loom_import_safetensors(b.p, path, &o, &r), LOOM_OK, "%s",
		     loom_program_error(b.p));
	cr_expect_eq(r.loaded, 14);
	cr_expect_eq(r.missing + r.unexpected + r.skipped, 0);
	eval_logits(&b, zb);
	cr_expect_eq(memcmp(za, zb, sizeof(za)), 0, "eval logits differ after the import");
	cr_assert_eq(loom_export_safetensors(b.p, again, &o), LOOM_OK);
	same_tensors(path, again);
	loom_program_free(a.p);
	loom_program_free(b.p);
	free(path);
	free(again);
}

static int drop_bn2_var(loom_st_tensor *t, int n, void *user)
{
	(void)user;
	int k = 0;
	for (int i = 0; i < n; i++)
		if (strcmp(t[i].name, "layer2.1.running_var") != 0)
			t[k++] = t[i];
	return k;
}

static int add_extra(loom_st_tensor *t, int n, void *user)
{
	t[n] = t[0];
	t[n].name = user;
	return n + 1;
}

Test(weights, strict_names_missing_and_unexpected)
{
	char *path, *miss = in_dir("miss.safetensors"), *extra = in_dir("extra.safetensors");
	char *check = in_dir("check.safetensors"), *before = in_dir("before.safetensors");
	net a = reference(&path), b = build(2, LOOM_O0);
	loom_weights_opts o = torch_names();
	loom_weights_report r;

	cr_assert_eq(loom_export_safetensors(b.p, before, &o), LOOM_OK);
	rewrite(path, miss, drop_bn2_var, NULL);
	cr_expect_eq(loom_import_safetensors(b.p, miss, &o, &r), LOOM_ERR_NOT_FOUND);
	cr_expect(strstr(loom_program_error(b.p), "no tensor 'layer2.1.running_var'"), "%s",
		  loom_program_error(b.p));
	rewrite(path, extra, add_extra, "head.weight");
	cr_expect_eq(loom_import_safetensors(b.p, extra, &o, &r), LOOM_ERR_MISMATCH);
	cr_expect(strstr(loom_program_error(b.p), "'head.weight' is not in the program"), "%s",
		  loom_program_error(b.p));
	/* Refused imports changed nothing. */
	cr_assert_eq(loom_export_safetensors(b.p, check, &o), LOOM_OK);
	same_tensors(before, check);

	o.strict = 0;
	cr_expect_eq(loom_import_safetensors(b.p, extra, &o, &r), LOOM_OK, "%s",
		     loom_program_error(b.p));
	cr_expect_eq(r.unexpected, 1);
	cr_expect_str_eq(r.first_unexpected, "head.weight");
	cr_expect_eq(loom_import_safetensors(b.p, miss, &o, &r), LOOM_OK);
	cr_expect_eq(r.missing, 1);
	cr_expect_eq(r.loaded, 13);
	cr_expect_str_eq(r.first_missing, "layer2.1.running_var");
	loom_program_free(a.p);
	loom_program_free(b.p);
	free(path), free(miss), free(extra), free(check), free(before);
}

/* fc.weight as [5, 3136]: the same bytes, another shape. */
static int reshape_fc(loom_st_tensor *t, int n, void *user)
{
	(void)user;
	for (int i = 0; i < n; i++)
		if (strcmp(t[i].name, "fc.weight") == 0) {
			t[i].dims[0] = 5;
			t[i].dims[1] = 3136;
		}
	return n;
}

/* fc.* as a 7-class head: fc.weight [7, 1568], fc.bias [7] (prefixes of the
 * data: the writer takes any bytes). */
static int seven_classes(loom_st_tensor *t, int n, void *user)
{
	(void)user;
	for (int i = 0; i < n; i++)
		if (strncmp(t[i].name, "fc.", 3) == 0) {
			t[i].dims[0] = 7;
			t[i].bytes = t[i].bytes / 10 * 7;
		}
	return n;
}

Test(weights, wrong_shape_is_named_and_skip_reinitialises)
{
	char *path, *bad = in_dir("bad.safetensors"), *seven = in_dir("seven.safetensors");
	char *fresh = in_dir("fresh.safetensors"), *out = in_dir("out.safetensors");
	net a = reference(&path), b = build(2, LOOM_O0);
	loom_weights_opts o = torch_names();
	loom_weights_report r;

	rewrite(path, bad, reshape_fc, NULL);
	o.strict = 0; /* a shape is refused even then, as PyTorch */
	cr_expect_eq(loom_import_safetensors(b.p, bad, &o, &r), LOOM_ERR_SHAPE);
	cr_expect(strstr(loom_program_error(b.p),
			 "tensor 'fc.weight' is [5, 3136] in the file, the program's is [10, 1568]"),
		  "%s", loom_program_error(b.p));

	/* --reinit fc: the head of another size stays as initialised. */
	o.strict = 1;
	rewrite(path, seven, seven_classes, NULL);
	cr_expect_eq(loom_import_safetensors(b.p, seven, &o, &r), LOOM_ERR_SHAPE);
	cr_assert_eq(loom_export_safetensors(b.p, fresh, &o), LOOM_OK);
	const char *skip[] = { "fc" };
	o.skip = skip;
	o.n_skip = 1;
	cr_expect_eq(loom_import_safetensors(b.p, seven, &o, &r), LOOM_OK, "%s",
		     loom_program_error(b.p));
	cr_expect_eq(r.skipped, 2);
	cr_expect_eq(r.loaded, 12);
	cr_assert_eq(loom_export_safetensors(b.p, out, &o), LOOM_OK);
	loom_st_file *fo = read_st(out), *ff = read_st(fresh), *fr = read_st(path);
	for (int i = 0; i < loom_st_count(fo); i++) {
		const loom_st_tensor *x = loom_st_at(fo, i);
		const loom_st_tensor *want = loom_st_find(strncmp(x->name, "fc.", 3) ? fr : ff, x->name);
		if (!is_nbt(x->name))
			cr_expect_eq(memcmp(x->data, want->data, x->bytes), 0, "%s", x->name);
	}
	loom_st_free(fo), loom_st_free(ff), loom_st_free(fr);
	loom_program_free(a.p);
	loom_program_free(b.p);
	free(path), free(bad), free(seven), free(fresh), free(out);
}

/* Every float tensor converted to the half type in user (F16 or BF16); the
 * converted copies live in a static pool. */
static uint16_t pool[1 << 16];

static int to_half(loom_st_tensor *t, int n, void *user)
{
	loom_st_dtype dt = *(loom_st_dtype *)user;
	size_t at = 0;
	for (int i = 0; i < n; i++) {
		if (t[i].dtype != LOOM_ST_F32)
			continue;
		size_t cnt = t[i].bytes / 4;
		cr_assert_leq(at + cnt, sizeof(pool) / 2);
		for (size_t k = 0; k < cnt; k++) {
			float x;
			memcpy(&x, (const char *)t[i].data + 4 * k, 4);
			pool[at + k] = dt == LOOM_ST_F16 ? loom_f32_to_f16(x) : loom_f32_to_bf16(x);
		}
		t[i].data = pool + at;
		t[i].dtype = dt;
		t[i].bytes = cnt * 2;
		at += cnt;
	}
	return n;
}

static void half_import(loom_st_dtype dt)
{
	char *path, *half = in_dir("half.safetensors"), *out = in_dir("out16.safetensors");
	net a = reference(&path), b = build(2, LOOM_O0);
	loom_weights_opts o = torch_names();

	rewrite(path, half, to_half, &dt);
	cr_assert_eq(loom_import_safetensors(b.p, half, &o, NULL), LOOM_OK, "%s",
		     loom_program_error(b.p));
	cr_assert_eq(loom_export_safetensors(b.p, out, &o), LOOM_OK);
	loom_st_file *fo = read_st(out), *fh = read_st(half);
	int checked = 0;
	for (int i = 0; i < loom_st_count(fo); i++) {
		const loom_st_tensor *x = loom_st_at(fo, i), *h = loom_st_find(fh, x->name);
		if (x->dtype != LOOM_ST_F32)
			continue;
		cr_assert_eq(h->dtype, dt);
		for (size_t k = 0; k < x->bytes / 4; k++) {
			float got;
			uint16_t hv;
			memcpy(&got, (const char *)x->data + 4 * k, 4);
			memcpy(&hv, (const char *)h->data + 2 * k, 2);
			float want = dt == LOOM_ST_F16 ? loom_f16_to_f32(hv) : loom_bf16_to_f32(hv);
			cr_assert_eq(got, want, "%s[%zu]: %g, want %g", x->name, k, got, want);
		}
		checked++;
	}
	cr_expect_eq(checked, 14);
	loom_st_free(fo), loom_st_free(fh);
	loom_program_free(a.p);
	loom_program_free(b.p);
	free(path), free(half), free(out);
}

Test(weights, f16_converted_on_import) { half_import(LOOM_ST_F16); }
Test(weights, bf16_converted_on_import) { half_import(LOOM_ST_BF16); }

static int int_fc_bias(loom_st_tensor *t, int n, void *user)
{
	(void)user;
	for (int i = 0; i < n; i++)
		if (strcmp(t[i].name, "fc.bias") == 0)
			t[i].dtype = LOOM_ST_I32;
	return n;
}

Test(weights, integer_tensor_is_refused)
{
	char *path, *bad = in_dir("int.safetensors");
	net a = reference(&path), b = build(2, LOOM_O0);
	loom_weights_opts o = torch_names();
	rewrite(path, bad, int_fc_bias, NULL);
	cr_expect_eq(loom_import_safetensors(b.p, bad, &o, NULL), LOOM_ERR_DTYPE);
	cr_expect(strstr(loom_program_error(b.p), "tensor 'fc.bias' is I32"), "%s",
		  loom_program_error(b.p));
	loom_program_free(a.p);
	loom_program_free(b.p);
	free(path), free(bad);
}

Test(weights, malformed_file_is_named)
{
	char *path = in_dir("junk.safetensors");
	FILE *f = fopen(path, "wb");
	fputs("not a safetensors file at all", f);
	fclose(f);
	net b = build(2, LOOM_O0);
	cr_expect_eq(loom_import_safetensors(b.p, path, NULL, NULL), LOOM_ERR_FORMAT);
	cr_expect(strstr(loom_program_error(b.p), path), "%s", loom_program_error(b.p));
	cr_expect_eq(loom_import_safetensors(b.p, "/nonexistent.safetensors", NULL, NULL),
		     LOOM_ERR_NOT_FOUND);
	loom_program_free(b.p);
	free(path);
}

/* O2: the import fills the fp32 masters (an export gives the f32 values
 * back exactly) and the fp16 model copies (the eval logits differ from O0's
 * only by half precision). */
Test(weights, o2_masters_take_the_import)
{
	char *path, *out = in_dir("o2.safetensors");
	net a = reference(&path), b = build(2, LOOM_O2);
	loom_weights_opts o = torch_names();
	float za[BATCH * 10], zb[BATCH * 10];
	cr_assert_eq(loom_import_safetensors(b.p, path, &o, NULL), LOOM_OK, "%s",
		     loom_program_error(b.p));
	cr_assert_eq(loom_export_safetensors(b.p, out, &o), LOOM_OK);
	same_tensors(path, out);
	eval_logits(&a, za);
	eval_logits(&b, zb);
	for (int i = 0; i < BATCH * 10; i++)
		cr_expect_float_eq(za[i], zb[i], 0.05, "logit %d: O0 %g, O2 %g", i, za[i], zb[i]);
	loom_program_free(a.p);
	loom_program_free(b.p);
	free(path), free(out);
}

/* Hugging Face's Conv1D layout (GPT-2): fc.weight standing in for a listed
 * projection, [in, out] in the file: written transposed by conv1d_export,
 * read back through the transpose bit for bit, refused without the list;
 * ignored names (a whole '.'-separated suffix only); of two renames that
 * match, the one the file holds. */
static int add_mask(loom_st_tensor *t, int n, void *user)
{
	t[n] = t[0];
	t[n].name = user;
	return n + 1;
}

Test(weights, conv1d_layout_ignored_names_and_alternative_renames)
{
	char *path, *conv = in_dir("conv1d.safetensors"), *mask = in_dir("mask.safetensors");
	char *xmask = in_dir("xmask.safetensors");
	net a = reference(&path), b = build(2, LOOM_O0), c = build(3, LOOM_O0);
	float za[BATCH * 10], zb[BATCH * 10];
	loom_weights_opts o = torch_names();
	loom_weights_report r;
	static const char *const conv1d[] = { "fc.weight" };

	o.conv1d = conv1d;
	o.n_conv1d = 1;
	o.conv1d_export = 1;
	cr_assert_eq(loom_export_safetensors(a.p, conv, &o), LOOM_OK, "%s", loom_program_error(a.p));
	loom_st_file *fc = read_st(conv), *fp = read_st(path);
	const loom_st_tensor *tw = loom_st_find(fc, "fc.weight"), *pw = loom_st_find(fp, "fc.weight");
	cr_assert(tw && pw);
	cr_expect(tw->ndim == 2 && tw->dims[0] == 1568 && tw->dims[1] == 10, "[%lld, %lld]",
		  (long long)tw->dims[0], (long long)tw->dims[1]);
	const float *x = tw->data, *y = pw->data;
	int transposed = 1;
	for (int i = 0; i < 10; i++)
		for (int j = 0; j < 1568; j++)
			transposed &= x[j * 10 + i] == y[i * 1568 + j];
	cr_expect(transposed, "fc.weight is not the transpose of the program's");
	cr_expect_eq(memcmp(loom_st_find(fc, "fc.bias")->data, loom_st_find(fp, "fc.bias")->data,
			    40), 0, "a 1-D tensor of a listed name's layer changed");
	loom_st_free(fc);
	loom_st_free(fp);

	cr_expect_eq(loom_import_safetensors(b.p, conv, &o, &r), LOOM_OK, "%s",
		     loom_program_error(b.p));
	cr_expect_eq(r.transposed, 1);
	cr_expect_eq(r.loaded, 14);
	eval_logits(&a, za);
	eval_logits(&b, zb);
	cr_expect_eq(memcmp(za, zb, sizeof(za)), 0, "eval logits differ after a Conv1D import");
	/* The program's own layout is read as it is, the list given or not. */
	cr_expect_eq(loom_import_safetensors(c.p, path, &o, &r), LOOM_OK, "%s",
		     loom_program_error(c.p));
	cr_expect_eq(r.transposed, 0);
	o.n_conv1d = 0;
	cr_expect_eq(loom_import_safetensors(c.p, conv, &o, &r), LOOM_ERR_SHAPE);
	cr_expect(strstr(loom_program_error(c.p), "'fc.weight' is [1568, 10] in the file"), "%s",
		  loom_program_error(c.p));

	static const char *const ignore[] = { "mask" };
	rewrite(path, mask, add_mask, "fc.mask");
	rewrite(path, xmask, add_mask, "fc.xmask");
	cr_expect_eq(loom_import_safetensors(c.p, mask, &o, &r), LOOM_ERR_MISMATCH);
	o.ignore = ignore;
	o.n_ignore = 1;
	cr_expect_eq(loom_import_safetensors(c.p, mask, &o, &r), LOOM_OK, "%s",
		     loom_program_error(c.p));
	cr_expect_eq(r.ignored, 1);
	cr_expect_eq(loom_import_safetensors(c.p, xmask, &o, &r), LOOM_ERR_MISMATCH,
		     "'fc.xmask' ignored by the entry 'mask'");

	/* Two renames of conv1.: the first names a tensor the file lacks. */
	loom_name_map names[LOOM_CONVNET_TORCH_NAMES + 1] = { { .loom = "conv1.", .file = "nope." } };
	memcpy(names + 1, o.names, sizeof(loom_name_map) * LOOM_CONVNET_TORCH_NAMES);
	o.names = names;
	o.n_names = LOOM_CONVNET_TORCH_NAMES + 1;
	cr_expect_eq(loom_import_safetensors(c.p, path, &o, &r), LOOM_OK, "%s",
		     loom_program_error(c.p));
	cr_expect_eq(r.loaded, 14);
	loom_program_free(a.p);
	loom_program_free(b.p);
	loom_program_free(c.p);
	free(path), free(conv), free(mask), free(xmask);
}
