/*
 * tests/base/test_errors.c — the one error path: each handle's getter
 * (graph, program, process group, sampler, loader, prefetch) returns the
 * message of that handle's last failure, a call without a handle leaves its
 * message in the thread's loom_last_error, and the log sink takes what the
 * library prints.
 */
#include <stdlib.h>
#include <string.h>

#include <criterion/criterion.h>

#include "comm/comm.h"
#include "loom.h"
#include "loom_data.h"

static int has(const char *msg, const char *part)
{
	return msg && strstr(msg, part) != NULL;
}

Test(errors, graph_keeps_its_first_failure)
{
	loom_graph *g;
	int64_t xd[2] = { 2, 3 }, wd[2] = { 4, 5 };

	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	cr_assert_str_eq(loom_graph_error(g), "");
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value w = loom_input(g, "w", LOOM_F32, 2, wd);
	cr_assert_eq(loom_matmul(g, x, w), LOOM_NONE);
	cr_assert_neq(loom_graph_status(g), LOOM_OK);
	cr_assert(has(loom_graph_error(g), "3") && has(loom_graph_error(g), "4"), "%s",
		  loom_graph_error(g));
	loom_graph_free(g);
}

Test(errors, program_and_thread)
{
	loom_graph *g;
	loom_program *p = NULL;
	loom_compile_opts o;
	int64_t xd[2] = { 5, 4 }, yd[1] = { 5 };
	float x[20] = { 0 };

	/* A call without a handle: the thread's object. */
	cr_assert_eq(loom_compile(NULL, 0, NULL, &p), LOOM_ERR_INVALID);
	cr_assert_null(p);
	cr_assert(has(loom_last_error(), "graph is NULL"), "%s", loom_last_error());

	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value xv = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc", xv, 3, 1), y);
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	cr_assert_str_eq(loom_program_error(p), "");
	cr_assert_eq(loom_set_input(p, "nope", x, LOOM_F32, 20), LOOM_ERR_NOT_FOUND);
	cr_assert(has(loom_program_error(p), "'nope'"), "%s", loom_program_error(p));
	/* The last failure, not the first. */
	cr_assert_eq(loom_set_input(p, "x", x, LOOM_F32, 19), LOOM_ERR_SHAPE);
	cr_assert(has(loom_program_error(p), "19") && !has(loom_program_error(p), "nope"), "%s",
		  loom_program_error(p));
	loom_program_free(p);
	loom_graph_free(g);
}

Test(errors, process_group)
{
	loom_pg *pg = NULL;
	loom_comm_options co = { .bootstrap = LOOM_COMM_BOOT_AUTO };

	unsetenv("OMPI_COMM_WORLD_SIZE");
	setenv("RANK", "3", 1);
	setenv("WORLD_SIZE", "2", 1);
	setenv("MASTER_ADDR", "127.0.0.1", 1);
	setenv("MASTER_PORT", "29999", 1);
	cr_assert_neq(loom_pg_init(&co, &pg), LOOM_OK);
	cr_assert_not_null(pg);
	cr_assert(has(loom_pg_error(pg), "RANK"), "%s", loom_pg_error(pg));
	loom_pg_free(pg);
}

Test(errors, data_handles_and_thread)
{
	loom_dataset ds;
	loom_sampler *s = NULL;
	loom_loader *l = NULL;
	loom_prefetch *pf = NULL;
	char buf[256] = "x";
	float img[4 * 16];
	int32_t lab[4];
	int count;
	const float *pi;
	const int32_t *pl;

	/* Constructors without a handle: the thread's object, and the buffer. */
	cr_assert_eq(loom_sampler_new(8, 0, 0, 0, 1, 0, &s, buf, sizeof buf), LOOM_ERR_INVALID);
	cr_assert(has(loom_last_error(), "world size 0"), "%s", loom_last_error());
	cr_assert_str_eq(buf, loom_last_error());
	cr_assert_eq(loom_sampler_new(8, 5, 2, 0, 1, 0, &s, NULL, 0), LOOM_ERR_INVALID);
	cr_assert(has(loom_last_error(), "rank 5"), "%s", loom_last_error());

	cr_assert_eq(loom_synthetic_load(8, 1, 4, 4, 2, 1, &ds, NULL, 0), LOOM_OK, "%s",
		     loom_last_error());
	cr_assert_eq(loom_sampler_new(8, 0, 1, 0, 1, 0, &s, NULL, 0), LOOM_OK);
	cr_assert_eq(loom_sampler_set_epoch(s, -2), LOOM_ERR_INVALID);
	cr_assert(has(loom_sampler_error(s), "epoch -2"), "%s", loom_sampler_error(s));
	cr_assert_eq(loom_sampler_set_epoch(s, 0), LOOM_OK);
	cr_assert_str_eq(loom_sampler_error(s), "");

	cr_assert_eq(loom_loader_new(&ds, s, 4, 0, 0.5f, 0.5f, &l, NULL, 0), LOOM_OK);
	cr_assert_eq(loom_loader_get(l, 7, img, lab, &count), LOOM_ERR_INVALID);
	cr_assert(has(loom_loader_error(l), "batch 7"), "%s", loom_loader_error(l));
	cr_assert_eq(loom_loader_get(l, 0, img, NULL, &count), LOOM_ERR_INVALID);
	cr_assert(has(loom_loader_error(l), "labels") && !has(loom_loader_error(l), "batch 7"),
		  "%s", loom_loader_error(l));

	cr_assert_eq(loom_prefetch_new(l, &pf, NULL, 0), LOOM_OK);
	cr_assert_eq(loom_prefetch_next(pf, &pi, &pl, &count), LOOM_ERR_STATE);
	cr_assert(has(loom_prefetch_error(pf), "loom_prefetch_start"), "%s",
		  loom_prefetch_error(pf));
	loom_prefetch_free(pf);
	loom_loader_free(l);
	loom_sampler_free(s);
	loom_dataset_free(&ds);
}

static char logged[4096];

static void sink(void *user, const char *message)
{
	(void)user;
	strncat(logged, message, sizeof(logged) - strlen(logged) - 1);
}

Test(errors, log_sink_takes_what_the_library_prints)
{
	loom_graph *g;
	loom_program *p = NULL;
	loom_compile_opts o;
	int64_t xd[2] = { 5, 4 }, yd[1] = { 5 };

	loom_set_log(sink, NULL);
	cr_assert_eq(loom_graph_new(&g), LOOM_OK);
	loom_value x = loom_input(g, "x", LOOM_F32, 2, xd);
	loom_value y = loom_input(g, "y", LOOM_I32, 1, yd);
	loom_value loss = loom_softmax_cross_entropy(g, loom_layer_linear(g, "fc", x, 3, 1), y);
	loom_compile_opts_default(&o);
	o.device = LOOM_DEVICE_CPU;
	o.verbose = 1;
	cr_assert_eq(loom_compile(g, loss, &o, &p), LOOM_OK, "%s", loom_last_error());
	loom_set_log(NULL, NULL);
	cr_assert(has(logged, "loom: compiled"), "%s", logged);
	loom_program_free(p);
	loom_graph_free(g);
}
