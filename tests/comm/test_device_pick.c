/*
 * tests/comm/test_device_pick.c — which CUDA device a rank uses
 * (loom_comm_pick_device, comm/env.c): its LOCAL_RANK where the host shows
 * that many devices, else LOCAL_RANK % visible with a note saying so, so
 * that a launcher giving each rank its own CUDA_VISIBLE_DEVICES (one
 * visible device per rank) works instead of being refused.
 */
#include <criterion/criterion.h>
#include <string.h>

#include "comm/comm_internal.h"

Test(device_pick, local_rank_when_enough_devices)
{
	char note[192] = "stale";

	cr_assert_eq(loom_comm_pick_device(0, 1, note, sizeof(note)), 0);
	cr_assert_str_eq(note, "");
	cr_assert_eq(loom_comm_pick_device(3, 8, note, sizeof(note)), 3);
	cr_assert_str_eq(note, "");
	cr_assert_eq(loom_comm_pick_device(7, 8, NULL, 0), 7);
}

Test(device_pick, one_visible_device_per_rank_is_device_0)
{
	char note[192];

	cr_assert_eq(loom_comm_pick_device(3, 1, note, sizeof(note)), 0);
	cr_assert_str_eq(note, "LOCAL_RANK 3 but 1 visible CUDA device: using device 0 (one "
			       "device per rank, e.g. CUDA_VISIBLE_DEVICES per rank)");
}

Test(device_pick, more_ranks_than_devices_share_round_robin)
{
	char note[192];

	cr_assert_eq(loom_comm_pick_device(5, 2, note, sizeof(note)), 1);
	cr_assert_str_eq(note, "LOCAL_RANK 5 but 2 visible CUDA devices: using device 1 (ranks "
			       "share devices round-robin)");
	cr_assert_eq(loom_comm_pick_device(4, 2, note, sizeof(note)), 0);
}

Test(device_pick, no_device_or_bad_rank_is_minus_one)
{
	char note[8];

	cr_assert_eq(loom_comm_pick_device(0, 0, note, sizeof(note)), -1);
	cr_assert_eq(loom_comm_pick_device(-1, 4, note, sizeof(note)), -1);
	/* A short buffer is cut, never overrun. */
	cr_assert_eq(loom_comm_pick_device(9, 4, note, sizeof(note)), 1);
	cr_assert_eq(strlen(note), sizeof(note) - 1);
}
