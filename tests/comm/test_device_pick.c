/*
 * tests/comm/test_device_pick.c — which CUDA device a rank uses
 * (loom_comm_pick_device, comm/env.c): its LOCAL_RANK where the host shows
 * that many devices, else LOCAL_RANK % visible with a note saying so, so
 * that a launcher giving each rank its own CUDA_VISIBLE_DEVICES (one
 * visible device per rank) works instead of being refused; and whether two
 * ranks sit on one GPU (loom_comm_seats_shared, comm/nccl_load.c), where
 * the group opens no NCCL and the collectives are staged through host
 * memory.
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

Test(device_pick, ranks_on_one_gpu_of_one_host_share_it)
{
	/* --nproc 2 on a one-GPU host: both pick device 0 */
	loom_comm_seat one_gpu[2] = { { 7, 0, 0 }, { 7, 0, 0 } };
	int a = -1;

	cr_assert_eq(loom_comm_seats_shared(one_gpu, 2, &a), 1);
	cr_assert_eq(a, 0);
	/* ranks 1 and 3 of four on two GPUs of one host, round-robin */
	loom_comm_seat four[4] = { { 7, 0, 0 }, { 7, 0, 1 }, { 8, 0, 0 }, { 7, 0, 1 } };
	cr_assert_eq(loom_comm_seats_shared(four, 4, &a), 3);
	cr_assert_eq(a, 1);
}

Test(device_pick, a_gpu_each_or_another_host_shares_nothing)
{
	int a;
	/* a GPU each; each its own CUDA_VISIBLE_DEVICES (device 0 of each);
	 * two hosts; no device at all */
	loom_comm_seat own[2] = { { 7, 0, 0 }, { 7, 0, 1 } };
	loom_comm_seat cvd[2] = { { 7, 11, 0 }, { 7, 12, 0 } };
	loom_comm_seat hosts[2] = { { 7, 0, 0 }, { 8, 0, 0 } };
	loom_comm_seat none[2] = { { 7, 0, -1 }, { 7, 0, -1 } };

	cr_assert_eq(loom_comm_seats_shared(own, 2, &a), -1);
	cr_assert_eq(loom_comm_seats_shared(cvd, 2, &a), -1);
	cr_assert_eq(loom_comm_seats_shared(hosts, 2, &a), -1);
	cr_assert_eq(loom_comm_seats_shared(none, 2, &a), -1);
}
