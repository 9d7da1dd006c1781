/*
 * tests/graph/test_build_errors.c — user mistakes while building, compiling
 * and running a graph: each returns a status and a message that names the
 * thing at fault, the graph's error is sticky, and nothing aborts (Criterion
 * reports a crash as a failure of its own).
 */
#include <criterion/criterion.h>
#include <string.h>

#include "loom.h"

static loom_graph *graph(void)
{
	loom_graph *g = NULL;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	cr_assert_not_null(g);
	return g;
}

/* The graph failed with status st and a message holding every needle. */
#define expect_fail(g, st, ...)                                                          \
	do {                                                                             \
		const char *needles_[] = { __VA_ARGS__ };                                \
		cr_assert_eq(loom_graph_status(g), (st), "status %s, expected %s (msg: %s)", \
			     loom_status_string(loom_graph_status(g)),                   \
			     loom_status_string(st), loom_graph_error(g));               \
		for (size_t i_ = 0; i_ < sizeof(needles_) / sizeof(*needles_); i_++)     \
			cr_assert_not_null(strstr(loom_graph_error(g), needles_[i_]),    \
					   "message '%s' lacks '%s'", loom_graph_error(g), \
					   needles_[i_]);                                \
	} while (0)

#define expect_msg(msg, ...)                                                             \
	do {                                                                             \
		const char *m_ = (msg);                                                  \
		const char *needles_[] = { __VA_ARGS__ };                                \
		for (size_t i_ = 0; i_ < sizeof(needles_) / sizeof(*needles_); i_++)     \
			cr_assert_not_null(strstr(m_, needles_[i_]),                     \
					   "message '%s' lacks '%s'", m_, needles_[i_]); \
	} while (0)

static loom_value in4(loom_graph *g, const char *name, loom_dtype dt, int64_t n, int64_t c,
		      int64_t h, int64_t w)
{
	int64_t d[4] = { n, c, h, w };
	return loom_input(g, name, dt, 4, d);
}

static loom_value par(loom_graph *g, const char *name, loom_dtype dt, int ndim,
		      const int64_t *d)
{
	return loom_param(g, name, dt, ndim, d, LOOM_INIT_ZEROS, 0);
}

/* A fresh graph on which conv2d of an f32 input [xd] and a weight [wd] of
 * dtype wdt (with a bias [bd[0]] where bd) is refused; the graph, for
 * expect_fail. */
static loom_graph *conv_refused(const int64_t xd[4], loom_dtype wdt, const int64_t wd[4],
				const int64_t *bd, int stride, int pad)
{
	loom_graph *g = graph();
	loom_value x = loom_input(g, "x", LOOM_F32, 4, xd);
	loom_value w = par(g, "w", wdt, 4, wd);
	loom_value b = bd ? par(g, "b", LOOM_F32, 1, bd) : LOOM_NONE;
	cr_assert_eq(loom_conv2d(g, x, w, b, stride, pad), LOOM_NONE);
	return g;
}

static void compile_opts_cpu(loom_compile_opts *o)
{
	loom_compile_opts_default(o);
	o->device = LOOM_DEVICE_CPU;
}

/* ------------------------------------------------------------ the builder */

Test(build_errors, fresh_graph_is_sound)
{
	loom_graph *g = graph();
	cr_assert_eq(loom_graph_status(g), LOOM_OK);
	cr_assert_str_eq(loom_graph_error(g), "");
	loom_graph_free(g);
}

Test(build_errors, conv_channel_mismatch_names_op_and_shapes)
{
	int64_t xd[4] = { 2, 3, 8, 8 }, wd[4] = { 4, 5, 3, 3 };
	loom_graph *g = conv_refused(xd, LOOM_F32, wd, NULL, 1, 1);
	expect_fail(g, LOOM_ERR_SHAPE, "conv2d", "[2, 3, 8, 8]", "[4, 5, 3, 3]", "3 channels");
	loom_graph_free(g);
}

Test(build_errors, conv_layer_channel_mismatch_downstream)
{
	/* The layer helper sizes its weight from the input, so a mismatch shows
	 * up at the next raw conv that was sized by hand. */
	loom_graph *g = graph();
	loom_value x = in4(g, "x", LOOM_F32, 1, 1, 8, 8);
	loom_value h = loom_layer_conv2d(g, "c1", x, 16, 3, 1, 1, 1);
	cr_assert_neq(h, LOOM_NONE, "%s", loom_graph_error(g));
	int64_t wd[4] = { 8, 8, 3, 3 };
	loom_value w = par(g, "c2.weight", LOOM_F32, 4, wd);
	cr_assert_eq(loom_conv2d(g, h, w, LOOM_NONE, 1, 1), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "conv2d", "[1, 16, 8, 8]", "[8, 8, 3, 3]");
	loom_graph_free(g);
}

Test(build_errors, conv_wrong_ndim)
{
	loom_graph *g = graph();
	int64_t xd[3] = { 3, 8, 8 }, wd[4] = { 4, 3, 3, 3 };
	loom_value x = loom_input(g, "x", LOOM_F32, 3, xd);
	loom_value w = par(g, "w", LOOM_F32, 4, wd);
	cr_assert_eq(loom_conv2d(g, x, w, LOOM_NONE, 1, 0), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "conv2d", "input", "4 dims", "[3, 8, 8]");
	loom_graph_free(g);
}

Test(build_errors, conv_bias_shape)
{
	int64_t xd[4] = { 1, 3, 8, 8 }, wd[4] = { 4, 3, 3, 3 }, bd[1] = { 5 };
	loom_graph *g = conv_refused(xd, LOOM_F32, wd, bd, 1, 0);
	expect_fail(g, LOOM_ERR_SHAPE, "conv2d", "bias", "[5]", "[4]");
	loom_graph_free(g);
}

Test(build_errors, conv_kernel_larger_than_input)
{
	int64_t xd[4] = { 1, 1, 2, 2 }, wd[4] = { 1, 1, 5, 5 };
	loom_graph *g = conv_refused(xd, LOOM_F32, wd, NULL, 1, 0);
	expect_fail(g, LOOM_ERR_SHAPE, "conv2d", "[1, 1, 5, 5]", "[1, 1, 2, 2]");
	loom_graph_free(g);
}

Test(build_errors, conv_bad_stride)
{
	int64_t xd[4] = { 1, 1, 8, 8 }, wd[4] = { 1, 1, 3, 3 };
	loom_graph *g = conv_refused(xd, LOOM_F32, wd, NULL, 0, 0);
	expect_fail(g, LOOM_ERR_INVALID, "conv2d", "stride 0");
	loom_graph_free(g);
}

Test(build_errors, conv_f64_weight_with_f32_input)
{
	int64_t xd[4] = { 1, 3, 8, 8 }, wd[4] = { 4, 3, 3, 3 };
	loom_graph *g = conv_refused(xd, LOOM_F64, wd, NULL, 1, 0);
	expect_fail(g, LOOM_ERR_DTYPE, "conv2d", "f32", "f64");
	loom_graph_free(g);
}

Test(build_errors, i32_logits)
{
	loom_graph *g = graph();
	int64_t ld[2] = { 4, 10 }, yd[1] = { 4 };
	loom_value logits = loom_input(g, "logits", LOOM_I32, 2, ld);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	cr_assert_eq(loom_softmax_cross_entropy(g, logits, y), LOOM_NONE);
	expect_fail(g, LOOM_ERR_DTYPE, "softmax_cross_entropy", "logits", "i32");
	loom_graph_free(g);
}

Test(build_errors, labels_not_i32)
{
	loom_graph *g = graph();
	int64_t ld[2] = { 4, 10 }, yd[1] = { 4 };
	loom_value logits = loom_input(g, "logits", LOOM_F32, 2, ld);
	loom_value y = loom_input(g, "y", LOOM_F32, 1, yd);
	cr_assert_eq(loom_softmax_cross_entropy(g, logits, y), LOOM_NONE);
	expect_fail(g, LOOM_ERR_DTYPE, "softmax_cross_entropy", "labels", "f32", "i32");
	loom_graph_free(g);
}

Test(build_errors, labels_batch_mismatch)
{
	loom_graph *g = graph();
	int64_t ld[2] = { 4, 10 }, yd[1] = { 5 };
	loom_value logits = loom_input(g, "logits", LOOM_F32, 2, ld);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	cr_assert_eq(loom_softmax_cross_entropy(g, logits, y), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "softmax_cross_entropy", "[4, 10]", "[5]");
	loom_graph_free(g);
}

Test(build_errors, relu_of_i32)
{
	loom_graph *g = graph();
	int64_t d[1] = { 4 };
	loom_value y = loom_input(g, "y", LOOM_I32, 1, d);
	cr_assert_eq(loom_relu(g, y), LOOM_NONE);
	expect_fail(g, LOOM_ERR_DTYPE, "relu", "i32");
	loom_graph_free(g);
}

Test(build_errors, i32_param_refused)
{
	loom_graph *g = graph();
	int64_t d[1] = { 4 };
	cr_assert_eq(loom_param(g, "w", LOOM_I32, 1, d, LOOM_INIT_ZEROS, 0), LOOM_NONE);
	expect_fail(g, LOOM_ERR_DTYPE, "param 'w'", "i32");
	loom_graph_free(g);
}

Test(build_errors, unknown_dtype)
{
	loom_graph *g = graph();
	int64_t d[1] = { 4 };
	cr_assert_eq(loom_input(g, "x", (loom_dtype)42, 1, d), LOOM_NONE);
	expect_fail(g, LOOM_ERR_DTYPE, "input 'x'", "42");
	loom_graph_free(g);
}

/* FP8 is storage only for now (base/fp8.h): no leaf of it, so no op,
 * kernel or collective ever sees one. */
Test(build_errors, fp8_leaves_refused)
{
	const loom_dtype dts[2] = { LOOM_FP8_E4M3, LOOM_FP8_E5M2 };
	int64_t d[1] = { 4 };

	for (int i = 0; i < 2; i++) {
		const char *name = loom_dtype_name(dts[i]);
		loom_graph *g = graph();
		cr_assert_eq(loom_input(g, "x", dts[i], 1, d), LOOM_NONE);
		expect_fail(g, LOOM_ERR_DTYPE, "input 'x'", name, "not supported by graph ops");
		loom_graph_free(g);
		g = graph();
		cr_assert_eq(loom_param(g, "w", dts[i], 1, d, LOOM_INIT_ZEROS, 0), LOOM_NONE);
		expect_fail(g, LOOM_ERR_DTYPE, "param 'w'", name);
		loom_graph_free(g);
		g = graph();
		cr_assert_eq(loom_buffer(g, "b", dts[i], 1, d, LOOM_INIT_ZEROS), LOOM_NONE);
		expect_fail(g, LOOM_ERR_DTYPE, "buffer 'b'", name);
		loom_graph_free(g);
	}
}

Test(build_errors, none_value)
{
	loom_graph *g = graph();
	cr_assert_eq(loom_relu(g, LOOM_NONE), LOOM_NONE);
	expect_fail(g, LOOM_ERR_INVALID, "relu", "-1");
	loom_graph_free(g);
}

Test(build_errors, out_of_range_value)
{
	loom_graph *g = graph();
	loom_value x = in4(g, "x", LOOM_F32, 1, 1, 4, 4);
	cr_assert_eq(loom_add(g, x, 999), LOOM_NONE);
	expect_fail(g, LOOM_ERR_INVALID, "add", "999");
	loom_graph_free(g);
}

Test(build_errors, null_graph_never_crashes)
{
	int64_t d[4] = { 1, 1, 4, 4 };
	cr_assert_eq(loom_graph_new(NULL), LOOM_ERR_INVALID);
	cr_assert_eq(loom_graph_status(NULL), LOOM_ERR_INVALID);
	cr_assert_not_null(loom_graph_error(NULL));
	cr_assert_eq(loom_input(NULL, "x", LOOM_F32, 4, d), LOOM_NONE);
	cr_assert_eq(loom_param(NULL, "w", LOOM_F32, 4, d, LOOM_INIT_ZEROS, 0), LOOM_NONE);
	cr_assert_eq(loom_buffer(NULL, "b", LOOM_F32, 4, d, LOOM_INIT_ZEROS), LOOM_NONE);
	cr_assert_eq(loom_conv2d(NULL, 0, 1, LOOM_NONE, 1, 0), LOOM_NONE);
	cr_assert_eq(loom_batchnorm2d(NULL, 0, 1, 2, 3, 4, 0.1, 1e-5), LOOM_NONE);
	cr_assert_eq(loom_relu(NULL, 0), LOOM_NONE);
	cr_assert_eq(loom_maxpool2d(NULL, 0, 2, 2, 0), LOOM_NONE);
	cr_assert_eq(loom_linear(NULL, 0, 1, LOOM_NONE), LOOM_NONE);
	cr_assert_eq(loom_matmul(NULL, 0, 1), LOOM_NONE);
	cr_assert_eq(loom_add(NULL, 0, 1), LOOM_NONE);
	cr_assert_eq(loom_reshape(NULL, 0, 4, d), LOOM_NONE);
	cr_assert_eq(loom_flatten(NULL, 0), LOOM_NONE);
	cr_assert_eq(loom_sum(NULL, 0), LOOM_NONE);
	cr_assert_eq(loom_mean(NULL, 0), LOOM_NONE);
	cr_assert_eq(loom_softmax_cross_entropy(NULL, 0, 1), LOOM_NONE);
	cr_assert_eq(loom_layer_conv2d(NULL, "c", 0, 4, 3, 1, 1, 1), LOOM_NONE);
	cr_assert_eq(loom_layer_batchnorm2d(NULL, "bn", 0), LOOM_NONE);
	cr_assert_eq(loom_layer_linear(NULL, "fc", 0, 4, 1), LOOM_NONE);
	cr_assert_eq(loom_mark_output(NULL, 0), LOOM_ERR_INVALID);
	cr_assert_eq(loom_set_name(NULL, 0, "x"), 0);
	cr_assert_eq(loom_value_dtype(NULL, 0), LOOM_DTYPE_COUNT);
	cr_assert_eq(loom_value_shape(NULL, 0).ndim, 0);
	loom_graph_set_seed(NULL, 1);
	loom_graph_dump(NULL, stderr);
	loom_graph_free(NULL);
}

/* include/loom.h documents what a bad value reads as, and that asking does
 * not put the graph in error. */
Test(build_errors, bad_value_reads_as_the_documented_sentinels)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t d[2] = { 2, 3 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, d);
	loom_value bad[3] = { LOOM_NONE, x + 1, 1000 };
	for (int i = 0; i < 3; i++) {
		cr_assert_eq(loom_value_dtype(g, bad[i]), LOOM_DTYPE_COUNT);
		cr_assert_eq(loom_value_shape(g, bad[i]).ndim, 0);
	}
	cr_assert_eq(loom_graph_status(g), LOOM_OK);
	cr_assert_eq(loom_value_dtype(g, x), LOOM_F32);
	cr_assert_eq(loom_value_shape(g, x).dims[1], 3);
	loom_graph_free(g);
}

Test(build_errors, duplicate_names)
{
	loom_graph *g = graph();
	int64_t d[1] = { 4 };
	cr_assert_neq(par(g, "w", LOOM_F32, 1, d), LOOM_NONE);
	cr_assert_eq(par(g, "w", LOOM_F32, 1, d), LOOM_NONE);
	expect_fail(g, LOOM_ERR_INVALID, "param 'w'", "already taken");
	loom_graph_free(g);

	/* Names are shared among inputs, parameters and buffers. */
	g = graph();
	cr_assert_neq(loom_input(g, "x", LOOM_F32, 1, d), LOOM_NONE);
	cr_assert_eq(loom_buffer(g, "x", LOOM_F32, 1, d, LOOM_INIT_ZEROS), LOOM_NONE);
	expect_fail(g, LOOM_ERR_INVALID, "buffer 'x'", "already taken");
	loom_graph_free(g);

	/* Two layers with one name collide on "name.weight". */
	g = graph();
	loom_value x = in4(g, "img", LOOM_F32, 1, 1, 8, 8);
	loom_value h = loom_layer_conv2d(g, "conv", x, 2, 3, 1, 1, 1);
	cr_assert_eq(loom_layer_conv2d(g, "conv", h, 2, 3, 1, 1, 1), LOOM_NONE);
	expect_fail(g, LOOM_ERR_INVALID, "conv.weight", "already taken");
	loom_graph_free(g);
}

Test(build_errors, missing_or_long_name)
{
	loom_graph *g = graph();
	int64_t d[1] = { 4 };
	cr_assert_eq(loom_input(g, "", LOOM_F32, 1, d), LOOM_NONE);
	expect_fail(g, LOOM_ERR_INVALID, "input", "name is required");
	loom_graph_free(g);

	g = graph();
	char longname[200];
	memset(longname, 'a', sizeof(longname) - 1);
	longname[sizeof(longname) - 1] = 0;
	cr_assert_eq(par(g, longname, LOOM_F32, 1, d), LOOM_NONE);
	expect_fail(g, LOOM_ERR_INVALID, "name longer than");
	loom_graph_free(g);
}

Test(build_errors, bad_leaf_shapes)
{
	loom_graph *g = graph();
	int64_t d[2] = { 4, 0 };
	cr_assert_eq(loom_input(g, "x", LOOM_F32, 2, d), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "input 'x'", "dim 1 is 0");
	loom_graph_free(g);

	g = graph();
	int64_t e[7] = { 1, 1, 1, 1, 1, 1, 1 };
	cr_assert_eq(loom_input(g, "x", LOOM_F32, 7, e), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "input 'x'", "7 dims");
	loom_graph_free(g);
}

Test(build_errors, uniform_init_needs_fan_in)
{
	loom_graph *g = graph();
	int64_t d[1] = { 4 };
	cr_assert_eq(loom_param(g, "w", LOOM_F32, 1, d, LOOM_INIT_KAIMING_UNIFORM, 0), LOOM_NONE);
	expect_fail(g, LOOM_ERR_INVALID, "param 'w'", "fan_in");
	loom_graph_free(g);
}

Test(build_errors, bad_reshape)
{
	loom_graph *g = graph();
	int64_t xd[3] = { 2, 3, 4 }, nd[2] = { 5, 5 };
	loom_value x = loom_input(g, "x", LOOM_F32, 3, xd);
	cr_assert_eq(loom_reshape(g, x, 2, nd), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "reshape", "[2, 3, 4]", "24", "25");
	loom_graph_free(g);

	g = graph();
	x = loom_input(g, "x", LOOM_F32, 3, xd);
	int64_t split[2] = { -1, 5 };
	cr_assert_eq(loom_reshape(g, x, 2, split), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "reshape", "[2, 3, 4]", "5");
	loom_graph_free(g);

	g = graph();
	x = loom_input(g, "x", LOOM_F32, 3, xd);
	int64_t two[2] = { -1, -1 };
	cr_assert_eq(loom_reshape(g, x, 2, two), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "reshape", "-1");
	loom_graph_free(g);

	/* And a good one, with an inferred dim. */
	g = graph();
	x = loom_input(g, "x", LOOM_F32, 3, xd);
	int64_t ok[2] = { -1, 6 };
	loom_value r = loom_reshape(g, x, 2, ok);
	cr_assert_neq(r, LOOM_NONE, "%s", loom_graph_error(g));
	loom_shape s = loom_value_shape(g, r);
	cr_assert_eq(s.ndim, 2);
	cr_assert_eq(s.dims[0], 4);
	cr_assert_eq(s.dims[1], 6);
	loom_graph_free(g);
}

Test(build_errors, maxpool_pad_over_half_kernel)
{
	loom_graph *g = graph();
	loom_value x = in4(g, "x", LOOM_F32, 1, 1, 8, 8);
	cr_assert_eq(loom_maxpool2d(g, x, 3, 2, 2), LOOM_NONE);
	expect_fail(g, LOOM_ERR_INVALID, "maxpool2d", "pad 2", "half the kernel");
	loom_graph_free(g);

	/* PyTorch's limit is pad <= kernel / 2: kernel 2 pad 1 is allowed. */
	g = graph();
	x = in4(g, "x", LOOM_F32, 1, 1, 8, 8);
	loom_value y = loom_maxpool2d(g, x, 2, 2, 1);
	cr_assert_neq(y, LOOM_NONE, "%s", loom_graph_error(g));
	loom_shape s = loom_value_shape(g, y);
	cr_assert_eq(s.dims[2], 5);
	cr_assert_eq(s.dims[3], 5);
	loom_graph_free(g);
}

Test(build_errors, maxpool_wrong_ndim)
{
	loom_graph *g = graph();
	int64_t d[2] = { 4, 4 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, d);
	cr_assert_eq(loom_maxpool2d(g, x, 2, 2, 0), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "maxpool2d", "4 dims", "[4, 4]");
	loom_graph_free(g);
}

Test(build_errors, linear_feature_mismatch)
{
	loom_graph *g = graph();
	int64_t xd[2] = { 8, 5 }, wd[2] = { 3, 6 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value w = par(g, "w", LOOM_F32, 2, wd);
	cr_assert_eq(loom_linear(g, x, w, LOOM_NONE), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "linear", "[8, 5]", "[3, 6]", "5 features");
	loom_graph_free(g);
}

/* linear reads the last dim of any input of 2 or more dims ([B, T, C]):
 * an NCHW map is not flattened for it. */
Test(build_errors, linear_last_dim_mismatch)
{
	loom_graph *g = graph();
	loom_value x = in4(g, "x", LOOM_F32, 2, 3, 4, 4);
	int64_t wd[2] = { 3, 48 };
	loom_value w = par(g, "w", LOOM_F32, 2, wd);
	cr_assert_eq(loom_linear(g, x, w, LOOM_NONE), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "linear", "[2, 3, 4, 4]", "4 features");
	loom_graph_free(g);
}

Test(build_errors, linear_vector_input)
{
	loom_graph *g = graph();
	int64_t xd[1] = { 4 }, wd[2] = { 3, 4 };
	loom_value x = loom_input(g, "x", LOOM_F32, 1, xd);
	loom_value w = par(g, "w", LOOM_F32, 2, wd);
	cr_assert_eq(loom_linear(g, x, w, LOOM_NONE), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "linear", "at least 2 dims", "[4]");
	loom_graph_free(g);
}

Test(build_errors, attention_heads_do_not_divide)
{
	loom_graph *g = graph();
	int64_t qd[3] = { 2, 4, 12 };
	loom_value q = loom_input(g, "qkv", LOOM_F32, 3, qd);
	cr_assert_eq(loom_causal_self_attention(g, q, 3), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "attn_probs", "[2, 4, 12]", "3 heads");
	loom_graph_free(g);
}

Test(build_errors, embedding_float_ids)
{
	loom_graph *g = graph();
	int64_t id[1] = { 4 }, td[2] = { 10, 3 };
	loom_value ids = loom_input(g, "ids", LOOM_F32, 1, id);
	loom_value t = par(g, "t", LOOM_F32, 2, td);
	cr_assert_eq(loom_embedding(g, ids, t), LOOM_NONE);
	expect_fail(g, LOOM_ERR_DTYPE, "embedding", "ids", "f32");
	loom_graph_free(g);
}

Test(build_errors, layernorm_gamma_size)
{
	loom_graph *g = graph();
	int64_t xd[3] = { 2, 3, 8 }, pd[1] = { 4 }, bd[1] = { 8 };
	loom_value x = loom_input(g, "x", LOOM_F32, 3, xd);
	loom_value gm = par(g, "g", LOOM_F32, 1, pd);
	loom_value bt = par(g, "b", LOOM_F32, 1, bd);
	cr_assert_eq(loom_layernorm(g, x, gm, bt, 1e-5), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "layernorm", "gamma [4]", "[8]");
	loom_graph_free(g);
}

Test(build_errors, matmul_inner_mismatch)
{
	loom_graph *g = graph();
	int64_t ad[2] = { 3, 4 }, bd[2] = { 5, 2 };
	loom_value a = par(g, "a", LOOM_F32, 2, ad);
	loom_value b = par(g, "b", LOOM_F32, 2, bd);
	cr_assert_eq(loom_matmul(g, a, b), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "matmul", "[3, 4]", "[5, 2]");
	loom_graph_free(g);
}

Test(build_errors, add_shape_and_dtype_mismatch)
{
	loom_graph *g = graph();
	int64_t ad[2] = { 3, 4 }, bd[2] = { 4, 3 };
	loom_value a = par(g, "a", LOOM_F32, 2, ad);
	loom_value b = par(g, "b", LOOM_F32, 2, bd);
	cr_assert_eq(loom_add(g, a, b), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "add", "[3, 4]", "[4, 3]");
	loom_graph_free(g);

	g = graph();
	a = par(g, "a", LOOM_F32, 2, ad);
	b = par(g, "b", LOOM_F16, 2, ad);
	cr_assert_eq(loom_add(g, a, b), LOOM_NONE);
	expect_fail(g, LOOM_ERR_DTYPE, "add", "f32", "f16");
	loom_graph_free(g);
}

Test(build_errors, batchnorm_param_shape_mismatch)
{
	loom_graph *g = graph();
	loom_value x = in4(g, "x", LOOM_F32, 2, 4, 5, 5);
	int64_t c3[1] = { 3 }, c4[1] = { 4 };
	loom_value gm = par(g, "gamma", LOOM_F32, 1, c3);
	loom_value bt = par(g, "beta", LOOM_F32, 1, c4);
	loom_value rm = loom_buffer(g, "rm", LOOM_F32, 1, c4, LOOM_INIT_ZEROS);
	loom_value rv = loom_buffer(g, "rv", LOOM_F32, 1, c4, LOOM_INIT_ONES);
	cr_assert_eq(loom_batchnorm2d(g, x, gm, bt, rm, rv, 0.1, 1e-5), LOOM_NONE);
	expect_fail(g, LOOM_ERR_SHAPE, "batchnorm2d", "weight", "[3]", "[4]", "[2, 4, 5, 5]");
	loom_graph_free(g);

	g = graph();
	x = in4(g, "x", LOOM_F32, 2, 4, 5, 5);
	gm = par(g, "gamma", LOOM_F32, 1, c4);
	bt = par(g, "beta", LOOM_F32, 1, c4);
	rm = loom_buffer(g, "rm", LOOM_F32, 1, c4, LOOM_INIT_ZEROS);
	rv = loom_buffer(g, "rv", LOOM_F64, 1, c4, LOOM_INIT_ONES);
	cr_assert_eq(loom_batchnorm2d(g, x, gm, bt, rm, rv, 0.1, 1e-5), LOOM_NONE);
	expect_fail(g, LOOM_ERR_DTYPE, "batchnorm2d", "running_var", "f64");
	loom_graph_free(g);

	g = graph();
	x = in4(g, "x", LOOM_F32, 2, 4, 5, 5);
	gm = par(g, "gamma", LOOM_F32, 1, c4);
	bt = par(g, "beta", LOOM_F32, 1, c4);
	rm = loom_buffer(g, "rm", LOOM_F32, 1, c4, LOOM_INIT_ZEROS);
	rv = loom_buffer(g, "rv", LOOM_F32, 1, c4, LOOM_INIT_ONES);
	cr_assert_eq(loom_batchnorm2d(g, x, gm, bt, rm, rv, 1.5, 1e-5), LOOM_NONE);
	expect_fail(g, LOOM_ERR_INVALID, "batchnorm2d", "momentum 1.5");
	loom_graph_free(g);
}

Test(build_errors, mark_output_bad_value)
{
	loom_graph *g = graph();
	cr_assert_eq(loom_mark_output(g, 7), LOOM_ERR_INVALID);
	expect_fail(g, LOOM_ERR_INVALID, "mark_output", "7");
	loom_graph_free(g);
}

/* ------------------------------------------------------- the sticky error */

Test(build_errors, error_is_sticky_and_first_wins)
{
	loom_graph *g = graph();
	loom_value x = in4(g, "x", LOOM_F32, 2, 3, 8, 8);
	int64_t wd[4] = { 4, 5, 3, 3 };
	loom_value w = par(g, "w", LOOM_F32, 4, wd);
	cr_assert_eq(loom_conv2d(g, x, w, LOOM_NONE, 1, 1), LOOM_NONE);
	char first[512];
	snprintf(first, sizeof(first), "%s", loom_graph_error(g));
	/* Good calls now return LOOM_NONE too, and add nothing. */
	cr_assert_eq(loom_relu(g, x), LOOM_NONE);
	int64_t d[1] = { 4 };
	cr_assert_eq(par(g, "fresh", LOOM_F32, 1, d), LOOM_NONE);
	cr_assert_eq(loom_sum(g, x), LOOM_NONE);
	cr_assert_eq(loom_flatten(g, x), LOOM_NONE);
	/* A second, different mistake does not overwrite the first. */
	cr_assert_eq(loom_maxpool2d(g, x, 3, 1, 5), LOOM_NONE);
	cr_assert_eq(loom_relu(g, LOOM_NONE), LOOM_NONE);
	cr_assert_eq(loom_graph_status(g), LOOM_ERR_SHAPE);
	cr_assert_str_eq(loom_graph_error(g), first);

	/* And compile refuses the graph with that first message. */
	loom_compile_opts o;
	compile_opts_cpu(&o);
	loom_program *p = (loom_program *)0x1;
	cr_assert_eq(loom_compile(g, x, &o, &p), LOOM_ERR_SHAPE);
	cr_assert_null(p);
	cr_assert_str_eq(loom_last_error(), first);
	loom_graph_free(g);
}

/* ---------------------------------------------------------------- compile */

/* A small sound model: linear + cross-entropy on f32. */
typedef struct tiny {
	loom_graph *g;
	loom_value x, y, w, logits, loss;
} tiny;

static tiny tiny_build(void)
{
	tiny t;
	t.g = graph();
	int64_t xd[2] = { 4, 3 }, yd[1] = { 4 }, wd[2] = { 5, 3 };
	t.x = loom_input(t.g, "x", LOOM_F32, 2, xd);
	t.y = loom_input(t.g, "labels", LOOM_I32, 1, yd);
	t.w = loom_param(t.g, "w", LOOM_F32, 2, wd, LOOM_INIT_KAIMING_UNIFORM, 3);
	t.logits = loom_linear(t.g, t.x, t.w, LOOM_NONE);
	t.loss = loom_softmax_cross_entropy(t.g, t.logits, t.y);
	cr_assert_eq(loom_graph_status(t.g), LOOM_OK, "%s", loom_graph_error(t.g));
	return t;
}

static void compile_fails(tiny *t, loom_value loss, const loom_compile_opts *o,
			  loom_status st, const char *needle)
{
	loom_program *p = (loom_program *)0x1;
	loom_status got = loom_compile(t->g, loss, o, &p);
	cr_assert_eq(got, st, "compile: %s, expected %s (%s)", loom_status_string(got),
		     loom_status_string(st), loom_last_error());
	cr_assert_null(p, "a failed compile must leave *out NULL");
	expect_msg(loom_last_error(), needle);
}

Test(build_errors, compile_non_scalar_loss)
{
	tiny t = tiny_build();
	loom_compile_opts o;
	compile_opts_cpu(&o);
	compile_fails(&t, t.logits, &o, LOOM_ERR_SHAPE, "not a scalar");
	expect_msg(loom_last_error(), "linear");
	/* The graph itself is still sound: compile did not poison it. */
	cr_assert_eq(loom_graph_status(t.g), LOOM_OK);
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(t.g, t.loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	cr_assert_str_eq(loom_last_error(), "");
	loom_program_free(p);
	loom_graph_free(t.g);
}

Test(build_errors, compile_bad_loss_value)
{
	tiny t = tiny_build();
	loom_compile_opts o;
	compile_opts_cpu(&o);
	compile_fails(&t, LOOM_NONE, &o, LOOM_ERR_INVALID, "loss");
	compile_fails(&t, 1000, &o, LOOM_ERR_INVALID, "loss");
	loom_graph_free(t.g);
}

Test(build_errors, compile_null_arguments)
{
	tiny t = tiny_build();
	loom_program *p = (loom_program *)0x1;
	cr_assert_eq(loom_compile(NULL, 0, NULL, &p), LOOM_ERR_INVALID);
	cr_assert_null(p);
	expect_msg(loom_last_error(), "graph is NULL");
	cr_assert_eq(loom_compile(t.g, t.loss, NULL, NULL), LOOM_ERR_INVALID);
	expect_msg(loom_last_error(), "out is NULL");
	loom_graph_free(t.g);
}

Test(build_errors, compile_negative_lr)
{
	tiny t = tiny_build();
	loom_compile_opts o;
	compile_opts_cpu(&o);
	o.optim.lr = -0.1;
	compile_fails(&t, t.loss, &o, LOOM_ERR_INVALID, "learning rate");
	o.optim.lr = 1.0 / 0.0;
	compile_fails(&t, t.loss, &o, LOOM_ERR_INVALID, "learning rate");
	loom_graph_free(t.g);
}

Test(build_errors, compile_bad_betas)
{
	tiny t = tiny_build();
	loom_compile_opts o;
	compile_opts_cpu(&o);
	o.optim.kind = LOOM_OPTIM_ADAMW;
	o.optim.beta1 = 1.0;
	compile_fails(&t, t.loss, &o, LOOM_ERR_INVALID, "betas");
	o.optim.beta1 = 0.9;
	o.optim.beta2 = -0.5;
	compile_fails(&t, t.loss, &o, LOOM_ERR_INVALID, "betas");
	o.optim.beta2 = 0.999;
	o.optim.eps = 0;
	compile_fails(&t, t.loss, &o, LOOM_ERR_INVALID, "eps");
	loom_graph_free(t.g);
}

Test(build_errors, compile_nesterov_without_momentum)
{
	tiny t = tiny_build();
	loom_compile_opts o;
	compile_opts_cpu(&o);
	o.optim.nesterov = 1;
	o.optim.momentum = 0;
	compile_fails(&t, t.loss, &o, LOOM_ERR_INVALID, "nesterov");
	o.optim.momentum = 0.9;
	o.optim.dampening = 0.1;
	compile_fails(&t, t.loss, &o, LOOM_ERR_INVALID, "nesterov");
	loom_graph_free(t.g);
}

Test(build_errors, compile_negative_weight_decay_and_momentum)
{
	tiny t = tiny_build();
	loom_compile_opts o;
	compile_opts_cpu(&o);
	o.optim.weight_decay = -1;
	compile_fails(&t, t.loss, &o, LOOM_ERR_INVALID, "weight decay");
	o.optim.weight_decay = 0;
	o.optim.momentum = -0.5;
	compile_fails(&t, t.loss, &o, LOOM_ERR_INVALID, "momentum");
	loom_graph_free(t.g);
}

Test(build_errors, compile_unknown_device_and_optimizer)
{
	tiny t = tiny_build();
	loom_compile_opts o;
	compile_opts_cpu(&o);
	o.device = (loom_device)77;
	compile_fails(&t, t.loss, &o, LOOM_ERR_INVALID, "device");
	expect_msg(loom_last_error(), "77");
	compile_opts_cpu(&o);
	o.optim.kind = (loom_optim_kind)9;
	compile_fails(&t, t.loss, &o, LOOM_ERR_INVALID, "optimizer");
	loom_graph_free(t.g);
}

/* ------------------------------------------------------------ set / run */

static loom_program *tiny_compile(tiny *t)
{
	loom_compile_opts o;
	compile_opts_cpu(&o);
	loom_program *p = NULL;
	cr_assert_eq(loom_compile(t->g, t->loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	cr_assert_str_eq(loom_program_error(p), "");
	return p;
}

Test(build_errors, set_input_unknown_name)
{
	tiny t = tiny_build();
	loom_program *p = tiny_compile(&t);
	float x[12] = { 0 };
	cr_assert_eq(loom_set_input(p, "images", x, LOOM_F32, 12), LOOM_ERR_NOT_FOUND);
	expect_msg(loom_program_error(p), "'images'");
	/* A parameter is not an input. */
	cr_assert_eq(loom_set_input(p, "w", x, LOOM_F32, 12), LOOM_ERR_NOT_FOUND);
	expect_msg(loom_program_error(p), "'w'");
	cr_assert_eq(loom_set_input(p, NULL, x, LOOM_F32, 12), LOOM_ERR_INVALID);
	cr_assert_eq(loom_set_input(p, "x", NULL, LOOM_F32, 12), LOOM_ERR_INVALID);
	cr_assert_eq(loom_set_input(NULL, "x", x, LOOM_F32, 12), LOOM_ERR_INVALID);
	loom_program_free(p);
	loom_graph_free(t.g);
}

Test(build_errors, set_input_wrong_count)
{
	tiny t = tiny_build();
	loom_program *p = tiny_compile(&t);
	float x[13] = { 0 };
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, 13), LOOM_ERR_SHAPE);
	expect_msg(loom_program_error(p), "'x'", "13", "[4, 3]", "12");
	loom_program_free(p);
	loom_graph_free(t.g);
}

Test(build_errors, set_input_wrong_dtype)
{
	tiny t = tiny_build();
	loom_program *p = tiny_compile(&t);
	double x[12] = { 0 };
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F64, 12), LOOM_ERR_DTYPE);
	expect_msg(loom_program_error(p), "'x'", "f64", "f32");
	float y[4] = { 0 };
	cr_assert_eq(loom_set_input(p, "labels", y, LOOM_F32, 4), LOOM_ERR_DTYPE);
	expect_msg(loom_program_error(p), "'labels'", "f32", "i32");
	loom_program_free(p);
	loom_graph_free(t.g);
}

Test(build_errors, label_out_of_range_fails_the_run)
{
	tiny t = tiny_build();
	loom_program *p = tiny_compile(&t);
	float x[12];
	for (int i = 0; i < 12; i++)
		x[i] = 0.1f * i;
	int32_t y[4] = { 0, 4, 7, 1 }; /* 7 is outside [0, 5) */
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, 12), LOOM_OK);
	cr_assert_eq(loom_set_input(p, "labels", y, LOOM_I32, 4), LOOM_OK);
	for (int mode = LOOM_RUN_TRAIN; mode <= LOOM_RUN_EVAL; mode++) {
		cr_assert_eq(loom_run(p, (loom_run_mode)mode), LOOM_ERR_INVALID, "mode %d", mode);
		expect_msg(loom_program_error(p), "softmax_cross_entropy", "label 7", "row 2", "[0, 5)");
	}
	/* Nothing was updated by the failed TRAIN run. */
	cr_assert_eq(loom_step_count(p), 0);

	int32_t neg[4] = { -3, 0, 0, 0 };
	cr_assert_eq(loom_set_input(p, "labels", neg, LOOM_I32, 4), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_ERR_INVALID);
	expect_msg(loom_program_error(p), "label -3", "row 0");

	/* The program recovers once the labels are fixed. */
	int32_t good[4] = { 0, 4, 2, 1 };
	cr_assert_eq(loom_set_input(p, "labels", good, LOOM_I32, 4), LOOM_OK);
	cr_assert_eq(loom_run(p, LOOM_RUN_TRAIN), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_str_eq(loom_program_error(p), "");
	cr_assert_eq(loom_step_count(p), 1);
	loom_program_free(p);
	loom_graph_free(t.g);
}

Test(build_errors, run_unknown_mode)
{
	tiny t = tiny_build();
	loom_program *p = tiny_compile(&t);
	cr_assert_eq(loom_run(p, (loom_run_mode)42), LOOM_ERR_INVALID);
	expect_msg(loom_program_error(p), "42");
	cr_assert_eq(loom_run(NULL, LOOM_RUN_TRAIN), LOOM_ERR_INVALID);
	loom_program_free(p);
	loom_graph_free(t.g);
}

Test(build_errors, read_and_write_misuse)
{
	tiny t = tiny_build();
	loom_program *p = tiny_compile(&t);
	double buf[64];
	/* An activation that was not marked as an output is not kept. */
	cr_assert_eq(loom_read_f64(p, t.logits, buf, 20), LOOM_ERR_STATE);
	expect_msg(loom_program_error(p), "loom_mark_output");
	/* Wrong element count. */
	cr_assert_eq(loom_read_f64(p, t.w, buf, 14), LOOM_ERR_SHAPE);
	expect_msg(loom_program_error(p), "14", "[5, 3]");
	/* Gradients exist for parameters only. */
	cr_assert_eq(loom_read_grad_f64(p, t.x, buf, 12), LOOM_ERR_INVALID);
	expect_msg(loom_program_error(p), "not a parameter");
	/* Inputs are not written through loom_write_f64. */
	cr_assert_eq(loom_write_f64(p, t.x, buf, 12), LOOM_ERR_INVALID);
	expect_msg(loom_program_error(p), "not a parameter or buffer");
	cr_assert_eq(loom_read_f64(p, -5, buf, 1), LOOM_ERR_INVALID);
	cr_assert_eq(loom_read_f64(p, t.w, NULL, 15), LOOM_ERR_INVALID);
	cr_assert_eq(loom_set_lr(p, -1), LOOM_ERR_INVALID);
	expect_msg(loom_program_error(p), "set_lr");
	loom_program_free(p);
	loom_graph_free(t.g);
}
