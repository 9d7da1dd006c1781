/*
 * tests/engine/tiny_linear.c — tiny_linear.h's program.
 */
#include <criterion/criterion.h>

#include "tests/engine/tiny_linear.h"

loom_program *tiny_linear_compile(loom_opt_level level)
{
	loom_graph *g;
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	int64_t xd[2] = { 5, 4 }, yd[1] = { 5 };
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc", x, 3, 1), y);
	cr_assert_eq(loom_graph_status(g), LOOM_OK, "%s", loom_graph_error(g));
	loom_compile_opts o;
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.amp.level = level;
	loom_program *p;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	loom_graph_free(g);
	return p;
}
