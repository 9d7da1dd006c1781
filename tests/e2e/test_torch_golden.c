/*
 * tests/e2e/test_torch_golden.c — weights from PyTorch: the tutorial's
 * ConvNet as PyTorch defines it, trained three steps and saved with
 * safetensors.torch.save_file (tools/torch_golden.py, committed under
 * tests/e2e/golden/), loaded by loom under PyTorch's names; loom's eval
 * logits on the committed batch match PyTorch's within 1e-5, and loom's
 * export of the loaded model holds PyTorch's bytes exactly. No Python runs.
 */
#define _GNU_SOURCE
#include <criterion/criterion.h>

#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "io/safetensors.h"
#include "examples/models.h"
#include "loom.h"
#include "loom_io.h"

#define GOLDEN "tests/e2e/golden/convnet_torch.safetensors"
#define BATCHFILE "tests/e2e/golden/convnet_torch_batch.safetensors"
#define BATCH 4

static loom_st_file *read_st(const char *path)
{
	char err[512];
	loom_st_file *f = NULL;
	cr_assert_eq(loom_st_read(path, &f, err, sizeof(err)), LOOM_OK, "%s", err);
	return f;
}

static loom_program *convnet(loom_opt_level level, loom_value *logits)
{
	loom_graph *g;
	loom_program *p;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_graph_set_seed(g, 5);
	loom_value loss = loom_model_convnet(g, BATCH, logits);
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.amp.level = level;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	loom_graph_free(g);
	return p;
}

static loom_weights_opts torch_names(void)
{
	loom_weights_opts o;
	loom_convnet_weights_opts(&o);
	return o;
}

/* Eval logits of p on the committed batch, and PyTorch's. */
static void logits_on_batch(loom_program *p, loom_value logits, float *got, float *want)
{
	loom_st_file *b = read_st(BATCHFILE);
	const loom_st_tensor *img = loom_st_find(b, "image"), *ref = loom_st_find(b, "logits");
	cr_assert(img && ref && img->dtype == LOOM_ST_F32 && ref->dtype == LOOM_ST_F32);
	cr_assert_eq(img->bytes, sizeof(float) * BATCH * 28 * 28);
	cr_assert_eq(ref->bytes, sizeof(float) * BATCH * 10);
	float *x = malloc(img->bytes);
	memcpy(x, img->data, img->bytes);
	memcpy(want, ref->data, ref->bytes);
	int32_t y[BATCH] = { 0 };
	cr_assert_eq(loom_set_input(p, "image", x, LOOM_F32, BATCH * 28 * 28), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "label", y, LOOM_I32, BATCH), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_EVAL), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_read(p, logits, got, BATCH * 10), LOOM_OK);
	free(x);
	loom_st_free(b);
}

Test(torch_golden, pytorch_weights_give_pytorch_logits)
{
	loom_value logits;
	loom_program *p = convnet(LOOM_O0, &logits);
	loom_weights_opts o = torch_names();
	loom_weights_report r;
	float got[BATCH * 10], want[BATCH * 10];

	cr_assert_eq(loom_import_safetensors(p, GOLDEN, &o, &r), LOOM_OK, "%s",
		     loom_program_error(p));
	cr_expect_eq(r.loaded, 14, "14 parameters and running statistics");
	logits_on_batch(p, logits, got, want);
	double worst = 0;
	for (int i = 0; i < BATCH * 10; i++) {
		double d = fabs((double)got[i] - want[i]);
		worst = d > worst ? d : worst;
		cr_expect_leq(d, 1e-5, "logit %d: loom %.8g, PyTorch %.8g", i, got[i], want[i]);
	}
	cr_log_info("largest difference from PyTorch's logits: %.3g", worst);
	loom_program_free(p);
}

/* The way back: loom's export of PyTorch's weights is PyTorch's file's
 * tensors, byte for byte, under the same names (num_batches_tracked is
 * loom's own step count). */
Test(torch_golden, export_holds_pytorch_bytes)
{
	loom_value logits;
	loom_program *p = convnet(LOOM_O0, &logits);
	loom_weights_opts o = torch_names();
	char path[] = "/tmp/loom-golden-XXXXXX";
	int fd = mkstemp(path);
	cr_assert(fd >= 0);
	close(fd);
	cr_assert_eq(loom_import_safetensors(p, GOLDEN, &o, NULL), LOOM_OK, "%s",
		     loom_program_error(p));
	cr_assert_eq(loom_export_safetensors(p, path, &o), LOOM_OK, "%s", loom_program_error(p));
	loom_st_file *a = read_st(GOLDEN), *b = read_st(path);
	cr_expect_eq(loom_st_count(a), loom_st_count(b));
	for (int i = 0; i < loom_st_count(a); i++) {
		const loom_st_tensor *x = loom_st_at(a, i), *y = loom_st_find(b, x->name);
		cr_assert_not_null(y, "loom's export lacks %s", x->name);
		cr_expect_eq(x->dtype, y->dtype, "%s", x->name);
		cr_expect_eq(x->ndim, y->ndim, "%s", x->name);
		if (strstr(x->name, "num_batches_tracked"))
			continue;
		cr_assert_eq(x->bytes, y->bytes, "%s", x->name);
		cr_expect_eq(memcmp(x->data, y->data, x->bytes), 0, "%s differs", x->name);
	}
	loom_st_free(a);
	loom_st_free(b);
	unlink(path);
	loom_program_free(p);
}

/* Under O2 the import fills the fp32 masters and the fp16 model copy: the
 * logits stay within half precision of PyTorch's. */
Test(torch_golden, o2_program_takes_pytorch_weights)
{
	loom_value logits;
	loom_program *p = convnet(LOOM_O2, &logits);
	loom_weights_opts o = torch_names();
	float got[BATCH * 10], want[BATCH * 10];
	cr_assert_eq(loom_import_safetensors(p, GOLDEN, &o, NULL), LOOM_OK, "%s",
		     loom_program_error(p));
	logits_on_batch(p, logits, got, want);
	for (int i = 0; i < BATCH * 10; i++)
		cr_expect_leq(fabs((double)got[i] - want[i]), 0.05 * (1 + fabs(want[i])),
			      "logit %d: loom O2 %.6g, PyTorch %.6g", i, got[i], want[i]);
	loom_program_free(p);
}
