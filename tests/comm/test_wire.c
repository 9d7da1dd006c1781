/*
 * tests/comm/test_wire.c — the rendezvous messages, progress records and
 * fingerprint records (comm/wire.c) without sockets or MPI: what each
 * encoder writes reads back, and each lie a message can tell is refused
 * with a message naming it.
 */
#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

#include "comm/comm_internal.h"

static loom_comm_peer peer(uint32_t rank, const char *host, const char *addr)
{
	loom_comm_peer p;

	memset(&p, 0, sizeof(p));
	p.rank = rank;
	p.pid = 1000 + rank;
	p.probe_port = 40000 + rank;
	snprintf(p.host, sizeof(p.host), "%s", host);
	snprintf(p.addr, sizeof(p.addr), "%s", addr);
	return p;
}

Test(wire, hello_round_trip_and_refusals)
{
	uint8_t m[LOOM_RDV_HELLO_BYTES];
	loom_comm_peer self = peer(2, "node-b", ""), p;
	char err[256];

	loom_rdv_encode_hello(&self, 3, m);
	cr_assert_eq(loom_rdv_decode_hello(m, 3, "10.0.0.2:5", &p, err, sizeof(err)), LOOM_OK);
	cr_assert_eq(p.rank, 2);
	cr_assert_eq(p.pid, 1002);
	cr_assert_eq(p.probe_port, 40002);
	cr_assert_str_eq(p.host, "node-b");

	cr_assert_eq(loom_rdv_decode_hello(m, 4, "10.0.0.2:5", &p, err, sizeof(err)),
		     LOOM_ERR_MISMATCH);
	cr_assert_str_eq(err, "rendezvous: rank 2 (10.0.0.2:5) has WORLD_SIZE=3, rank 0 has 4");
	cr_assert_eq(loom_rdv_decode_hello(m, 2, "10.0.0.2:5", &p, err, sizeof(err)),
		     LOOM_ERR_MISMATCH);
	self.rank = 0;
	loom_rdv_encode_hello(&self, 3, m);
	cr_assert_eq(loom_rdv_decode_hello(m, 3, "10.0.0.2:5", &p, err, sizeof(err)),
		     LOOM_ERR_INVALID);
	cr_assert_str_eq(err, "rendezvous: 10.0.0.2:5 claims rank 0, expected 1..2");
	self.rank = 1;
	self.probe_port = 70000;
	loom_rdv_encode_hello(&self, 3, m);
	cr_assert_eq(loom_rdv_decode_hello(m, 3, "x:1", &p, err, sizeof(err)), LOOM_ERR_FORMAT);
	cr_assert_str_eq(err, "rendezvous: rank 1 (x:1) sent probe port 70000");
	m[0] = 'X';
	cr_assert_eq(loom_rdv_decode_hello(m, 3, "x:1", &p, err, sizeof(err)), LOOM_ERR_FORMAT);
	cr_assert(strstr(err, "wrong magic"));
	/* A rank of another protocol version. */
	loom_rdv_encode_hello(&self, 3, m);
	m[8] = 2;
	cr_assert_eq(loom_rdv_decode_hello(m, 3, "x:1", &p, err, sizeof(err)), LOOM_ERR_FORMAT);
	cr_assert_str_eq(err, "rendezvous: x:1 speaks version 2, rank 0 speaks 1");
}

Test(wire, welcome_round_trip)
{
	loom_comm_peer peers[3] = { peer(0, "a", "10.0.0.1"), peer(1, "b", "10.0.0.2"),
				    peer(2, "c", "10.0.0.3") },
		       got[3];
	const char blob[] = "server-uri";
	uint8_t head[LOOM_RDV_HEAD_BYTES];
	size_t n = loom_rdv_welcome_bytes(3, sizeof(blob)), bl;
	uint8_t *m = malloc(n);
	uint32_t kind, len;
	void *b;
	char err[256];

	loom_rdv_encode_head(LOOM_RDV_REPLY_OK, (uint32_t)n, head);
	cr_assert_eq(loom_rdv_decode_head(head, 3, "reply", &kind, &len, err, sizeof(err)), LOOM_OK);
	cr_assert_eq(kind, LOOM_RDV_REPLY_OK);
	cr_assert_eq(len, n);
	loom_rdv_encode_welcome(3, blob, sizeof(blob), peers, m);
	cr_assert_eq(loom_rdv_decode_reply(m, n, kind, 1, 3, "reply", got, &b, &bl, err, sizeof(err)),
		     LOOM_OK);
	cr_assert_eq(bl, sizeof(blob));
	cr_assert_str_eq(b, blob);
	for (int k = 0; k < 3; k++) {
		cr_assert_eq(got[k].rank, (uint32_t)k);
		cr_assert_eq(got[k].probe_port, 40000u + k);
		cr_assert_str_eq(got[k].addr, peers[k].addr);
	}
	free(b);
	/* One byte short, another world, a table out of order. */
	cr_assert_eq(loom_rdv_decode_reply(m, n - 1, kind, 1, 3, "reply", got, &b, &bl, err,
					   sizeof(err)),
		     LOOM_ERR_FORMAT);
	cr_assert(strstr(err, "does not match its blob of 11 bytes and 3 peers"));
	cr_assert_null(b);
	cr_assert_eq(loom_rdv_decode_reply(m, n, kind, 1, 4, "reply", got, &b, &bl, err, sizeof(err)),
		     LOOM_ERR_MISMATCH);
	cr_assert_str_eq(err, "reply: rank 0 has WORLD_SIZE=3, rank 1 has 4");
	peers[2].rank = 1;
	loom_rdv_encode_welcome(3, blob, sizeof(blob), peers, m);
	cr_assert_eq(loom_rdv_decode_reply(m, n, kind, 1, 3, "reply", got, &b, &bl, err, sizeof(err)),
		     LOOM_ERR_FORMAT);
	cr_assert_str_eq(err, "reply: peer table entry 2 names rank 1");
	free(m);
}

Test(wire, head_error_reply_and_go)
{
	uint8_t head[LOOM_RDV_HEAD_BYTES], go[LOOM_RDV_GO_BYTES];
	uint32_t kind, len;
	void *b;
	size_t bl;
	char err[256];
	const char why[] = "rank 2 did not arrive"; /* not terminated on the wire */

	loom_rdv_encode_head(LOOM_RDV_REPLY_OK, loom_rdv_welcome_bytes(2, LOOM_RDV_MAX_BLOB) + 1,
			     head);
	cr_assert_eq(loom_rdv_decode_head(head, 2, "reply", &kind, &len, err, sizeof(err)),
		     LOOM_ERR_FORMAT);
	cr_assert(strstr(err, "too many"));
	loom_rdv_encode_head(3, 0, head);
	cr_assert_eq(loom_rdv_decode_head(head, 2, "reply", &kind, &len, err, sizeof(err)),
		     LOOM_ERR_FORMAT);
	cr_assert(strstr(err, "wrong magic or kind"));
	cr_assert_eq(loom_rdv_decode_reply((const uint8_t *)why, 6, LOOM_RDV_REPLY_ERR, 1, 2, "reply",
					   NULL, &b, &bl, err, sizeof(err)),
		     LOOM_ERR_MISMATCH);
	cr_assert_str_eq(err, "rank 0 refused the group: rank 2");

	loom_rdv_encode_go(2, go);
	cr_assert_eq(loom_rdv_decode_go(go, 2, err, sizeof(err)), LOOM_OK);
	cr_assert_eq(loom_rdv_decode_go(go, 1, err, sizeof(err)), LOOM_ERR_FORMAT);
	cr_assert_str_eq(err, "rendezvous: malformed turn signal from rank 0");
}

Test(wire, fingerprint_parse_compare_say)
{
	uint64_t items[3] = { 11, 22, 33 }, other[4] = { 11, 99, 33, 44 };
	const char head[] = "opts";
	loom_fingerprint fa = { .head = head, .head_len = 4, .items = items, .n_items = 3 };
	loom_fingerprint fb = { .head = head, .head_len = 4, .items = other, .n_items = 4 };
	uint8_t *a, *b;
	size_t la, lb;
	loom_fp_view va, vb;
	uint64_t at;
	char buf[256];

	cr_assert_eq(loom_fingerprint_serialize(&fa, &a, &la), LOOM_OK);
	cr_assert_eq(loom_fingerprint_serialize(&fb, &b, &lb), LOOM_OK);
	cr_assert_null(loom_fingerprint_parse(a, la, &va));
	cr_assert_null(loom_fingerprint_parse(b, lb, &vb));
	cr_assert_eq(va.n_items, 3);
	cr_assert_eq(loom_fingerprint_item(&va, 2), 33);
	cr_assert_eq(loom_fingerprint_compare(&vb, &va, &at), LOOM_FP_ITEM);
	cr_assert_eq(at, 1);
	other[1] = 22;
	free(b);
	loom_fingerprint_serialize(&fb, &b, &lb);
	loom_fingerprint_parse(b, lb, &vb);
	cr_assert_eq(loom_fingerprint_compare(&vb, &va, &at), LOOM_FP_COUNT);
	cr_assert_eq(at, 3);
	cr_assert_eq(loom_fingerprint_compare(&va, &va, &at), LOOM_FP_SAME);

	cr_assert_str_eq(loom_fingerprint_parse(a, 10, &va), "shorter than its 24-byte header");
	cr_assert_str_eq(loom_fingerprint_parse(a, la - 1, &va),
			 "its lengths do not add up to its size");
	/* A head length near 2^64 must not wrap the size check around. */
	uint64_t huge = ~0ull - 10;
	memcpy(a + 8, &huge, 8);
	cr_assert_str_eq(loom_fingerprint_parse(a, la, &va),
			 "its lengths do not add up to its size");
	a[0] = 'X';
	cr_assert_str_eq(loom_fingerprint_parse(a, la, &va), "wrong magic");

	loom_fingerprint_say_item(buf, sizeof(buf), 1, "node 14 conv2d has shape [100,32,14,14]",
				  "node 14 conv2d has shape [50,32,14,14]");
	cr_assert_str_eq(buf, "rank 1: node 14 conv2d has shape [100,32,14,14], rank 0 has "
			      "[50,32,14,14]");
	loom_fingerprint_say_item(buf, sizeof(buf), 2, "bucket 3", "node 9");
	cr_assert_str_eq(buf, "rank 2: bucket 3; rank 0: node 9");
	free(a);
	free(b);
}

Test(wire, settings_first_difference)
{
	/* 3 ranks x 2 settings: rank 2's second value differs, rank 1 agrees. */
	uint8_t all[3 * 2 * LOOM_COMM_SETTING_LEN];
	const char *v[3][2] = { { "O0", "0.1" }, { "O0", "0.1" }, { "O0", "0.2" } };
	int rank = -1;
	size_t which = 99;

	memset(all, 0, sizeof(all));
	for (int r = 0; r < 3; r++)
		for (int i = 0; i < 2; i++)
			strcpy((char *)all + (r * 2 + i) * LOOM_COMM_SETTING_LEN, v[r][i]);
	cr_assert_eq(loom_settings_differ(all, 3, 2, &rank, &which), 1);
	cr_assert_eq(rank, 2);
	cr_assert_eq(which, 1);
	strcpy((char *)all + (2 * 2 + 1) * LOOM_COMM_SETTING_LEN, "0.1");
	cr_assert_eq(loom_settings_differ(all, 3, 2, &rank, &which), 0);
	/* An unterminated value is compared up to the record's last byte. */
	memset(all + (1 * 2 + 0) * LOOM_COMM_SETTING_LEN, 'x', LOOM_COMM_SETTING_LEN);
	memset(all, 'x', LOOM_COMM_SETTING_LEN - 1);
	all[LOOM_COMM_SETTING_LEN - 1] = 0;
	cr_assert_eq(loom_settings_differ(all, 2, 2, &rank, &which), 0);
}

/* The progress link a rank opens to each rank on another host, and its
 * records: what is sent reads back; a link that names the reader, a rank
 * outside the world or another world size, and a record of another magic,
 * are refused; a label's unprintable bytes are shown as '?'. */
Test(wire, progress_link_and_record)
{
	uint8_t m[LOOM_PROG_RECORD_BYTES];
	char label[LOOM_PROG_LABEL_BYTES];
	uint64_t seq = 0;
	int rank = -1;

	loom_prog_encode_link(2, 4, m);
	cr_assert_eq(loom_prog_decode_link(m, 4, 0, &rank), 0);
	cr_assert_eq(rank, 2);
	cr_assert_eq(loom_prog_decode_link(m, 4, 2, &rank), -1, "a link from the reader itself");
	cr_assert_eq(loom_prog_decode_link(m, 3, 0, &rank), -1, "another world size");
	loom_prog_encode_link(5, 4, m);
	cr_assert_eq(loom_prog_decode_link(m, 4, 0, &rank), -1, "rank 5 of 4");
	memset(m, 0, LOOM_PROG_LINK_BYTES); /* a liveness probe sends nothing */
	cr_assert_eq(loom_prog_decode_link(m, 4, 0, &rank), -1);

	loom_prog_encode_record(((uint64_t)7 << 32) | 39, "step 39's all-reduce of 1000 f32", m);
	cr_assert_eq(loom_prog_decode_record(m, &seq, label, sizeof(label)), 0);
	cr_assert_eq(seq, ((uint64_t)7 << 32) | 39);
	cr_assert_str_eq(label, "step 39's all-reduce of 1000 f32");
	m[16 + 4] = 0x1b; /* an escape in the label */
	cr_assert_eq(loom_prog_decode_record(m, &seq, label, 8), 0);
	cr_assert_str_eq(label, "step?39", "cut to the buffer, unprintable shown as '?'");
	m[0] = 'X';
	cr_assert_eq(loom_prog_decode_record(m, &seq, label, sizeof(label)), -1, "wrong magic");
}
