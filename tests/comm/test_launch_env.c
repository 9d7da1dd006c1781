/*
 * tests/comm/test_launch_env.c — what the launchers hand a rank, without
 * processes: Slurm's compressed host lists and srun's variables
 * (comm/env.c), torchrun's GROUP_RANK and agent-store variables, the TCP
 * store's messages and the address rank 0 publishes there (comm/store.c),
 * and the JSON of torchrun's error file (comm/errfile.c).
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

static void host(const char *list, long i, const char *want)
{
	char out[64], err[256] = "";

	cr_assert_eq(loom_slurm_hostlist_nth(list, i, out, sizeof(out), err, sizeof(err)), LOOM_OK,
		     "%s [%ld]: %s", list, i, err);
	cr_expect_str_eq(out, want, "%s [%ld]", list, i);
}

static void refused(const char *list, const char *why)
{
	char out[64], err[256] = "";

	cr_expect_eq(loom_slurm_hostlist_count(list, err, sizeof(err)), -1, "%s", list);
	cr_expect(strstr(err, why), "%s: '%s' lacks '%s'", list, err, why);
	cr_expect_neq(loom_slurm_hostlist_nth(list, 0, out, sizeof(out), err, sizeof(err)),
		      LOOM_OK);
}

Test(slurm_hostlist, plain_names_and_ranges_keep_their_width)
{
	cr_expect_eq(loom_slurm_hostlist_count("node[01-04,07]", NULL, 0), 5);
	host("node[01-04,07]", 0, "node01");
	host("node[01-04,07]", 3, "node04");
	host("node[01-04,07]", 4, "node07");
	host("localhost", 0, "localhost");
	host("a,b", 1, "b");
	host("gpu[8-11]", 2, "gpu10");
	host("n[098-101]", 3, "n101");
}

Test(slurm_hostlist, lists_of_names_and_several_brackets)
{
	const char *l = "login1,rack[1-2]-n[01-03],big.example.com";
	const char *want[] = { "login1",   "rack1-n01", "rack1-n02", "rack1-n03",
			       "rack2-n01", "rack2-n02", "rack2-n03", "big.example.com" };
	long i;

	cr_assert_eq(loom_slurm_hostlist_count(l, NULL, 0), 8);
	for (i = 0; i < 8; i++)
		host(l, i, want[i]);
}

Test(slurm_hostlist, malformed_lists_are_named)
{
	refused("", "empty host list");
	refused("node[", "bad range");
	refused("node[01-04", "bad range");
	refused("node[04-01]", "bad range");
	refused("node[]", "bad range");
	refused("node[1-]", "bad range");
	refused("a,,b", "empty host name");
	refused("a,", "empty host name");
	refused("no de", "unexpected character ' '");
	refused("n[0-999999999]", "more than");
	refused("n[0-9999]m[0-9999]", "more than");
}

Test(slurm_hostlist, out_of_range_and_too_long)
{
	char out[8], err[256] = "";

	cr_expect_neq(loom_slurm_hostlist_nth("a[1-2]", 2, out, sizeof(out), err, sizeof(err)),
		      LOOM_OK);
	cr_expect(strstr(err, "host 2 of a list of 2"), "%s", err);
	cr_expect_neq(loom_slurm_hostlist_nth("averylonghost", 0, out, sizeof(out), err,
					      sizeof(err)),
		      LOOM_OK);
	cr_expect(strstr(err, "longer than 7 bytes"), "%s", err);
}

static void clear_env(void)
{
	const char *v[] = { "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID",
			    "SLURM_NNODES", "SLURM_STEP_NODELIST", "SLURM_JOB_ID", "SLURM_STEP_ID",
			    "MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
			    "LOCAL_WORLD_SIZE", "GROUP_RANK", "GROUP_WORLD_SIZE",
			    "TORCHELASTIC_USE_AGENT_STORE", "TORCHELASTIC_RESTART_COUNT" };
	size_t i;

	for (i = 0; i < sizeof(v) / sizeof(v[0]); i++)
		unsetenv(v[i]);
}

Test(slurm_env, srun_variables_make_the_rendezvous, .init = clear_env)
{
	loom_comm_env e;
	char err[512] = "";

	setenv("SLURM_PROCID", "3", 1);
	setenv("SLURM_NTASKS", "8", 1);
	setenv("SLURM_LOCALID", "1", 1);
	setenv("SLURM_NODEID", "1", 1);
	setenv("SLURM_NNODES", "4", 1);
	setenv("SLURM_STEP_NODELIST", "node[07-10]", 1);
	setenv("SLURM_JOB_ID", "4242", 1);
	setenv("SLURM_STEP_ID", "0", 1);
	cr_assert(loom_comm_env_is_slurm());
	cr_assert_eq(loom_comm_env_parse_slurm(&e, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_expect_eq(e.rank, 3);
	cr_expect_eq(e.world, 8);
	cr_expect_eq(e.local_rank, 1);
	cr_expect_eq(e.local_world, -1); /* counted by host name at the rendezvous */
	cr_expect_eq(e.group_rank, 1);
	cr_expect_eq(e.group_world, 4);
	cr_expect_str_eq(e.master_addr, "node07");
	cr_expect_eq(e.master_port, loom_comm_slurm_port(4242, 0));
	cr_expect(e.master_port >= 20000 && e.master_port < 30000);
	cr_expect_neq(loom_comm_slurm_port(4242, 1), e.master_port, "another step, another port");

	setenv("MASTER_ADDR", "10.1.2.3", 1);
	setenv("MASTER_PORT", "29400", 1);
	cr_assert_eq(loom_comm_env_parse_slurm(&e, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_expect_str_eq(e.master_addr, "10.1.2.3");
	cr_expect_eq(e.master_port, 29400);
}

Test(slurm_env, mistakes_are_named, .init = clear_env)
{
	loom_comm_env e;
	char err[512] = "";

	setenv("SLURM_PROCID", "0", 1);
	cr_expect(!loom_comm_env_is_slurm(), "a batch script has no step node list");
	setenv("SLURM_STEP_NODELIST", "n1", 1);
	cr_expect_neq(loom_comm_env_parse_slurm(&e, err, sizeof(err)), LOOM_OK);
	cr_expect(strstr(err, "SLURM_NTASKS is not set"), "%s", err);
	setenv("SLURM_NTASKS", "2", 1);
	setenv("SLURM_PROCID", "2", 1);
	cr_expect_neq(loom_comm_env_parse_slurm(&e, err, sizeof(err)), LOOM_OK);
	cr_expect(strstr(err, "SLURM_PROCID='2' is out of range [0, 1]"), "%s", err);
	setenv("SLURM_PROCID", "1", 1);
	setenv("SLURM_STEP_NODELIST", "n[2-1]", 1);
	cr_expect_neq(loom_comm_env_parse_slurm(&e, err, sizeof(err)), LOOM_OK);
	cr_expect(strstr(err, "SLURM_STEP_NODELIST='n[2-1]': bad range"), "%s", err);
	setenv("SLURM_STEP_NODELIST", "n1", 1);
	setenv("SLURM_JOB_ID", "12x", 1);
	cr_expect_neq(loom_comm_env_parse_slurm(&e, err, sizeof(err)), LOOM_OK);
	cr_expect(strstr(err, "SLURM_JOB_ID='12x'"), "%s", err);
}

static void torchrun_env(void)
{
	clear_env();
	setenv("RANK", "5", 1);
	setenv("WORLD_SIZE", "8", 1);
	setenv("MASTER_ADDR", "node0", 1);
	setenv("MASTER_PORT", "29500", 1);
}

Test(torchrun_env, agent_store_restart_and_node, .init = torchrun_env)
{
	loom_comm_env e;
	char err[512] = "", key[128];

	cr_assert_eq(loom_comm_env_parse(&e, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_expect_eq(e.agent_store, 0);
	cr_expect_eq(e.restart, 0);
	cr_expect_eq(e.group_rank, -1);
	setenv("TORCHELASTIC_USE_AGENT_STORE", "True", 1);
	setenv("TORCHELASTIC_RESTART_COUNT", "2", 1);
	setenv("GROUP_RANK", "1", 1);
	setenv("GROUP_WORLD_SIZE", "2", 1);
	cr_assert_eq(loom_comm_env_parse(&e, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_expect_eq(e.agent_store, 1);
	cr_expect_eq(e.restart, 2);
	cr_expect_eq(e.group_rank, 1);
	cr_expect_eq(e.group_world, 2);
	loom_store_key(&e, key, sizeof(key));
	cr_expect_str_eq(key, "/worker/attempt_2/loom_rank0_addr");
	setenv("TORCHELASTIC_USE_AGENT_STORE", "False", 1);
	cr_assert_eq(loom_comm_env_parse(&e, err, sizeof(err)), LOOM_OK, "%s", err);
	cr_expect_eq(e.agent_store, 0);
}

Test(torchrun_env, mistakes_are_named, .init = torchrun_env)
{
	loom_comm_env e;
	char err[512] = "";

	setenv("TORCHELASTIC_USE_AGENT_STORE", "yes", 1);
	cr_expect_neq(loom_comm_env_parse(&e, err, sizeof(err)), LOOM_OK);
	cr_expect(strstr(err, "TORCHELASTIC_USE_AGENT_STORE='yes' is neither True nor False"),
		  "%s", err);
	unsetenv("TORCHELASTIC_USE_AGENT_STORE");
	setenv("GROUP_RANK", "2", 1);
	setenv("GROUP_WORLD_SIZE", "2", 1);
	cr_expect_neq(loom_comm_env_parse(&e, err, sizeof(err)), LOOM_OK);
	cr_expect(strstr(err, "GROUP_RANK=2 is not below GROUP_WORLD_SIZE=2"), "%s", err);
	unsetenv("GROUP_RANK");
	setenv("TORCHELASTIC_RESTART_COUNT", "-1", 1);
	cr_expect_neq(loom_comm_env_parse(&e, err, sizeof(err)), LOOM_OK);
	cr_expect(strstr(err, "TORCHELASTIC_RESTART_COUNT='-1'"), "%s", err);
}

Test(store, messages_have_pytorchs_layout)
{
	uint8_t m[256];
	size_t n;

	n = loom_store_encode_u32(LOOM_STORE_VALIDATE, LOOM_STORE_VALIDATION_MAGIC, m);
	cr_assert_eq(n, 5);
	cr_expect_eq(m[0], 0);
	cr_expect_eq(memcmp(m + 1, "\xce\xf7\x85\x3c", 4), 0, "the magic, little-endian");
	n = loom_store_encode_set("k1", "vv", 2, m, sizeof(m));
	cr_assert_eq(n, 1 + 8 + 2 + 8 + 2);
	cr_expect_eq(m[0], 1);
	cr_expect_eq(loom_store_get_u64(m + 1), 2);
	cr_expect_eq(memcmp(m + 9, "k1", 2), 0);
	cr_expect_eq(loom_store_get_u64(m + 11), 2);
	n = loom_store_encode_key(LOOM_STORE_WAIT, "abc", m, sizeof(m));
	cr_assert_eq(n, 1 + 8 + 8 + 3);
	cr_expect_eq(m[0], 6);
	cr_expect_eq(loom_store_get_u64(m + 1), 1, "one key");
	cr_expect_eq(loom_store_get_u64(m + 9), 3);
	n = loom_store_encode_key(LOOM_STORE_GET, "abc", m, sizeof(m));
	cr_expect_eq(n, 1 + 8 + 3);
	cr_expect_eq(loom_store_encode_key(LOOM_STORE_GET, "abc", m, 8), 0, "no room");
}

Test(store, rank0_address_round_trip_and_strict_parse)
{
	char v[64], h[64], err[256] = "";
	int port = 0;
	size_t n = loom_store_format_addr("10.0.0.7", 41234, v, sizeof(v));
	const char *bad[] = { "", "loom1 ", "loom1 10.0.0.7", "loom1 10.0.0.7 ", "loom1 10.0.0.7 0",
			      "loom1 10.0.0.7 65536", "loom1 10.0.0.7 12a", "loom1 a;b 1",
			      "loom2 h 1", "loom1  h 1", "loom1 h 99999999999999999999" };
	size_t i;

	cr_assert_str_eq(v, "loom1 10.0.0.7 41234");
	cr_assert_eq(loom_store_parse_addr((const uint8_t *)v, n, h, sizeof(h), &port, err,
					   sizeof(err)),
		     LOOM_OK, "%s", err);
	cr_expect_str_eq(h, "10.0.0.7");
	cr_expect_eq(port, 41234);
	cr_assert_eq(loom_store_parse_addr((const uint8_t *)"loom1 fe80::1%eth0 5", 20, h,
					   sizeof(h), &port, err, sizeof(err)),
		     LOOM_OK, "%s", err);
	cr_expect_str_eq(h, "fe80::1%eth0");
	for (i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		cr_expect_neq(loom_store_parse_addr((const uint8_t *)bad[i], strlen(bad[i]), h,
						    sizeof(h), &port, err, sizeof(err)),
			      LOOM_OK, "'%s' was accepted", bad[i]);
	cr_expect_neq(loom_store_parse_addr((const uint8_t *)"loom1 abcdefgh 1", 16, h, 8, &port,
					    err, sizeof(err)),
		      LOOM_OK, "a host longer than the buffer");
}

Test(store, get_length_is_bounded)
{
	uint8_t m[8] = { 1, 1, 0, 0, 0, 0, 0, 0 }; /* 257 */
	size_t n = 0;
	char err[256] = "";

	cr_expect_neq(loom_store_decode_len(m, 256, "k", &n, err, sizeof(err)), LOOM_OK);
	cr_expect(strstr(err, "the value of 'k' is 257 bytes, more than the 256"), "%s", err);
	m[1] = 1;
	m[0] = 0;
	cr_expect_eq(loom_store_decode_len(m, 256, "k", &n, err, sizeof(err)), LOOM_OK);
	cr_expect_eq(n, 256);
	memset(m, 0xff, 8);
	cr_expect_neq(loom_store_decode_len(m, 256, "k", &n, err, sizeof(err)), LOOM_OK);
}

Test(errfile, torchruns_json)
{
	char out[1024];
	size_t n = loom_errfile_json("rank 1: \"bad\"\\ \x01 caf\xc3\xa9",
				     "line one\nline two", 1700000000, out, sizeof(out));

	cr_assert_gt(n, 0);
	cr_expect_str_eq(out, "{\"message\": {\"message\": \"rank 1: \\\"bad\\\"\\\\ \\u0001 "
			      "caf\\u00c3\\u00a9\", \"extraInfo\": {\"py_callstack\": \"line "
			      "one\\nline two\", \"timestamp\": \"1700000000\"}}}\n");
	cr_expect_eq(loom_errfile_json("m", "c", 1, out, 20), 0, "does not fit");
}
