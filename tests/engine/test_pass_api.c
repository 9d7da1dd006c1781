/*
 * tests/engine/test_pass_api.c — p's backend as a pass sees it
 * (engine/pass.h's loom_pass_*, engine/pass_api.c), asked as parallel/
 * asks it, with the backend's table out of sight: the name, host memory,
 * streams and synchronize of the CPU backend; its sharded group's host
 * checks and sums dispatched over pieces; what it lacks (the device
 * checks, or the whole group) refused with a message naming the backend.
 */
#include <criterion/criterion.h>

#include <string.h>

#include "engine/pass.h"
#include "loom.h"
#include "tests/engine/tiny_linear.h"

/* The table, for the one test that takes the sharded group away. */
#include "engine/backend.h"

/* tiny_linear.h's program, one run of forward and backward done (the
 * gradients are there). */
static loom_program *compile_with_grads(void)
{
	loom_program *p = tiny_linear_compile(LOOM_O0);
	float xs[20];
	int32_t ys[5] = { 0, 1, 2, 1, 0 };
	for (int i = 0; i < 20; i++)
		xs[i] = 0.1f * (float)(i % 7) - 0.3f;
	cr_assert_eq(loom_set_input(p, "x", xs, LOOM_F32, 20), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_set_input(p, "y", ys, LOOM_I32, 5), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_run(p, LOOM_RUN_GRAD), LOOM_OK, "%s", loom_program_error(p));
	return p;
}

Test(pass_api, cpu_backend_as_a_pass_sees_it)
{
	loom_program *p = compile_with_grads();
	cr_assert_str_eq(loom_pass_backend_name(p), "cpu");
	cr_assert_eq(loom_pass_host_memory(p), 1);
	cr_assert_null(loom_pass_stream(p, LOOM_STREAM_COMPUTE));
	cr_assert_null(loom_pass_stream(p, LOOM_STREAM_COMM));
	cr_assert_eq(loom_pass_sync(p), LOOM_OK, "%s", loom_program_error(p));
	loom_program_free(p);
}

Test(pass_api, sharded_host_checks_and_sums)
{
	loom_program *p = compile_with_grads();
	cr_assert_eq(loom_pass_shard_caps(p), LOOM_SHARD_OPTIM | LOOM_SHARD_SUMSQ);
	int n = p->plan.n_pieces, finite = -1;
	cr_assert_gt(n, 0);
	cr_assert_eq(loom_pass_grads_finite(p, 0, n, &finite), LOOM_OK, "%s",
		     loom_program_error(p));
	cr_assert_eq(finite, 1);
	/* Every piece's sum of squares adds up to the whole one, and the
	 * gradients of a first step are not all zero. */
	double all = -1, part, sum = 0;
	cr_assert_eq(loom_pass_grad_sumsq(p, 0, n, &all), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_gt(all, 0.0);
	for (int i = 0; i < n; i++) {
		cr_assert_eq(loom_pass_grad_sumsq(p, i, i + 1, &part), LOOM_OK);
		sum += part;
	}
	cr_assert_float_eq(sum, all, 1e-12 * all);
	cr_assert_eq(loom_pass_grad_sumsq(p, 0, 0, &part), LOOM_OK);
	cr_assert_eq(part, 0.0);
	loom_program_free(p);
}

Test(pass_api, device_checks_refused_naming_the_backend)
{
	loom_program *p = compile_with_grads();
	void *out = &out;
	cr_assert_eq(loom_pass_grads_finite_device(p, 0, 1, &out), LOOM_ERR_UNSUPPORTED);
	cr_assert(strstr(loom_program_error(p), "the cpu backend cannot check a shard on the device"),
		  "%s", loom_program_error(p));
	cr_assert_eq(loom_pass_grad_sumsq_device(p, 0, 1, &out), LOOM_ERR_UNSUPPORTED);
	cr_assert(strstr(loom_program_error(p),
			 "the cpu backend cannot take a shard's gradient norm on the device"),
		  "%s", loom_program_error(p));
	cr_assert_eq(out, &out, "a refusal leaves the output alone");
	loom_program_free(p);
}

Test(pass_api, no_sharded_group_refused_naming_the_backend)
{
	loom_program *p = compile_with_grads();
	loom_backend bare = loom_cpu_backend;
	bare.name = "bare";
	bare.sharded = NULL;
	const struct loom_backend *was = p->be;
	p->be = &bare;
	int finite = -1;
	double sumsq = -1;
	cr_assert_eq(loom_pass_shard_caps(p), 0u);
	cr_assert_eq(loom_pass_grads_finite(p, 0, 1, &finite), LOOM_ERR_UNSUPPORTED);
	cr_assert(strstr(loom_program_error(p), "the bare backend cannot check a shard"), "%s",
		  loom_program_error(p));
	cr_assert_eq(loom_pass_grad_sumsq(p, 0, 1, &sumsq), LOOM_ERR_UNSUPPORTED);
	cr_assert(strstr(loom_program_error(p), "the bare backend cannot take a shard's gradient norm"),
		  "%s", loom_program_error(p));
	cr_assert_eq(finite, -1);
	cr_assert_eq(sumsq, -1);
	p->be = was;
	loom_program_free(p);
}
