/*
 * tests/engine/test_io_view.c — engine/io_view.h, what io/ reads of a
 * program, used here as io/ uses it (the program's struct opaque): values
 * by handle whole (a parameter, an O2 master), the shards and stages calls
 * refused with a message on a program without them, the stage info of a
 * plain program, and the ZeRO table's hooks that the engine now reaches
 * sharded values through.
 */
#include <criterion/criterion.h>

#include <string.h>

#include "engine/io_view.h"
#include "loom.h"
#include "parallel/parallel.h"
#include "parallel/shards.h"
#include "tests/engine/tiny_linear.h"

Test(io_view, plain_program_has_one_stage)
{
	loom_program *p = tiny_linear_compile(LOOM_O0);
	loom_stage_info si;
	memset(&si, 0x55, sizeof(si));
	cr_assert_eq(loom_io_stages(p, &si), 0);
	cr_assert_eq(si.stages, 1);
	cr_assert_eq(si.stage, 0);
	cr_assert_eq(si.replicas, 1);
	cr_assert_eq(si.replica, 0);
	cr_assert_eq(si.group_rank, 0);
	cr_assert_eq(si.n_graph, loom_io_plan(p)->g->n);
	cr_assert_eq(loom_io_has_host(p), 0);
	loom_program_free(p);
}

Test(io_view, no_shards_no_stages_refused_by_name)
{
	loom_program *p = tiny_linear_compile(LOOM_O0);
	float buf[12];
	int k = 7;
	cr_assert_eq(loom_value_shard(p, 2, &k), -1);
	cr_assert_eq(loom_shard_gather(p, 0, 0, buf), LOOM_ERR_STATE);
	cr_assert(strstr(loom_program_error(p), "parameter 0"), "%s", loom_program_error(p));
	cr_assert_eq(loom_shard_scatter(p, 1, 0, buf), LOOM_ERR_STATE);
	cr_assert(strstr(loom_program_error(p), "parameter 1"), "%s", loom_program_error(p));
	cr_assert_eq(loom_io_stage_fetch(p, 1, buf, buf, sizeof(buf)), LOOM_ERR_STATE);
	cr_assert(strstr(loom_program_error(p), "stage 1"), "%s", loom_program_error(p));
	cr_assert_neq(loom_io_host_broadcast(p, buf, 4, 0, "here"), LOOM_OK);
	cr_assert(strstr(loom_program_error(p), "here: the program has no process group"), "%s",
		  loom_program_error(p));
	loom_program_free(p);
}

Test(io_view, value_whole_round_trip)
{
	loom_program *p = tiny_linear_compile(LOOM_O0);
	float w[12], back[12];
	double d[12];
	for (int i = 0; i < 12; i++)
		w[i] = 0.25f * (float)i - 1.0f;
	cr_assert_eq(loom_io_value_bytes(p, 2), sizeof(w));
	cr_assert_eq(loom_value_write_whole(p, 2, w), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_read_f64(p, 2, d, 12), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_value_read_whole(p, 2, back), LOOM_OK, "%s", loom_program_error(p));
	for (int i = 0; i < 12; i++) {
		cr_assert_eq(d[i], (double)w[i], "element %d", i);
		cr_assert_eq(back[i], w[i], "element %d", i);
	}
	loom_program_free(p);
}

/* O2: the f32 master of fc.weight, whole, written and read back; a write
 * by handle (loom_write_f64) keeps master and half copy together. */
Test(io_view, o2_master_round_trip)
{
	loom_program *p = tiny_linear_compile(LOOM_O2);
	float m[12], back[12];
	double d[12];
	for (int i = 0; i < 12; i++)
		m[i] = 1.0f / (float)(i + 3);
	cr_assert_eq(loom_master_write(p, 2, m), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_master_read(p, 2, back), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(memcmp(m, back, sizeof(m)), 0);
	for (int i = 0; i < 12; i++)
		d[i] = 0.5 * i;
	cr_assert_eq(loom_write_f64(p, 2, d, 12), LOOM_OK, "%s", loom_program_error(p));
	cr_assert_eq(loom_master_read(p, 2, back), LOOM_OK, "%s", loom_program_error(p));
	for (int i = 0; i < 12; i++)
		cr_assert_eq(back[i], (float)d[i], "element %d", i);
	loom_program_free(p);
}

/* What the engine reaches ZeRO's sharded values and report through. */
Test(io_view, zero_table_carries_the_value_hooks)
{
	cr_assert_eq(loom_zero_shards.shard_of, loom_zero_shard_of);
	cr_assert_eq(loom_zero_shards.master_slot, loom_zero_master_slot);
	cr_assert_eq(loom_zero_shards.gather, loom_zero_gather);
	cr_assert_eq(loom_zero_shards.scatter, loom_zero_scatter);
	cr_assert_not_null(loom_zero_shards.info);
	/* a pipeline's stages hold whole values */
	cr_assert_null(loom_stage_shards.shard_of);
	cr_assert_null(loom_stage_shards.gather);
}
