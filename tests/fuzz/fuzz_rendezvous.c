/*
 * tests/fuzz/fuzz_rendezvous.c — libFuzzer target for the env:// rendezvous
 * decoders (comm/wire.c): what rank 0 reads from any process that connects
 * to MASTER_PORT, and what the other ranks read back from whatever answers
 * there. The sockets deliver fixed sizes (hello, head, go) or the length
 * the head announced (payload), so the harness hands the decoders exactly
 * those buffers.
 *
 * Input: byte 0 picks the message (low 3 bits: 0 hello, 1 reply head, 2 OK
 * payload, 3 error payload, 4 turn signal, 5 a script of connections to rank
 * 0's server, which comm/rendezvous.c judges: see server() below; 6 a
 * progress link's first bytes and record, comm/progress.c; 7 what the
 * launchers hand a rank: with byte 1 even, the bytes torchrun's TCP store
 * answers a WAIT and a GET with (comm/store.c: the answer byte, the length,
 * rank 0's published address), with byte 1 odd, a Slurm host list
 * (comm/env.c)); with bit 7 set the harness
 * makes an OK payload's world and blob length agree with its size first,
 * so that mutations reach the peer table. Byte 1 gives the world (1..16),
 * byte 2 this rank; the rest is the message.
 */
#include "fuzz_common.h"

#include <stdint.h>
#include <string.h>

#include "comm/comm_internal.h"

static int terminated(const char *s, size_t n)
{
	return memchr(s, 0, n) != NULL;
}

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = v, p[1] = v >> 8, p[2] = v >> 16, p[3] = v >> 24;
}

/* A fixed-size message: the input cut or zero-padded to n bytes, as a
 * socket read of n bytes would have delivered it. */
static void fixed(uint8_t *m, size_t n, const uint8_t *data, size_t size)
{
	memset(m, 0, n);
	memcpy(m, data, size < n ? size : n);
}

static void hello(const uint8_t *data, size_t size, int world)
{
	uint8_t m[LOOM_RDV_HELLO_BYTES], again[LOOM_RDV_HELLO_BYTES];
	loom_comm_peer p, q;
	char err[LOOM_COMM_ERRLEN] = "";

	fixed(m, sizeof(m), data, size);
	if (loom_rdv_decode_hello(m, world, "10.0.0.1:5", &p, err, sizeof(err)) != LOOM_OK) {
		FUZZ_CHECK(err[0] && terminated(err, sizeof(err)));
		return;
	}
	FUZZ_CHECK(p.rank >= 1 && p.rank < (uint32_t)world);
	FUZZ_CHECK(p.probe_port <= 65535);
	FUZZ_CHECK(terminated(p.host, sizeof(p.host)) && p.addr[0] == 0);
	/* What a rank would send for what was read reads back the same. */
	loom_rdv_encode_hello(&p, world, again);
	FUZZ_CHECK(loom_rdv_decode_hello(again, world, "10.0.0.1:5", &q, err, sizeof(err)) ==
		   LOOM_OK);
	FUZZ_CHECK(q.rank == p.rank && q.pid == p.pid && q.probe_port == p.probe_port &&
		   strcmp(q.host, p.host) == 0);
}

static void head(const uint8_t *data, size_t size, int world)
{
	uint8_t m[LOOM_RDV_HEAD_BYTES];
	uint32_t kind = 0, len = 0;
	char err[LOOM_COMM_ERRLEN] = "";

	fixed(m, sizeof(m), data, size);
	if (loom_rdv_decode_head(m, world, "reply", &kind, &len, err, sizeof(err)) != LOOM_OK) {
		FUZZ_CHECK(err[0]);
		return;
	}
	FUZZ_CHECK(kind == LOOM_RDV_REPLY_OK || kind == LOOM_RDV_REPLY_ERR);
	/* The caller mallocs what the head claims: it must be bounded. */
	FUZZ_CHECK(len <= loom_rdv_welcome_bytes(world, LOOM_RDV_MAX_BLOB));
}

static void reply(uint8_t *data, size_t size, uint32_t kind, int rank, int world, int seal)
{
	loom_comm_peer peers[16], again[16];
	void *blob = (void *)1, *blob2 = NULL;
	size_t blob_len = 7, blob_len2 = 0;
	char err[LOOM_COMM_ERRLEN] = "";
	uint8_t *enc;

	if (seal && size >= 8) {
		size_t fixed_part = loom_rdv_welcome_bytes(world, 0);

		put32(data, (uint32_t)world);
		put32(data + 4, size >= fixed_part ? (uint32_t)(size - fixed_part) : 0);
		/* The peer table's ranks in order too, when there is one. */
		if (size >= fixed_part)
			for (int k = 0; k < world; k++)
				put32(data + 8 + (size - fixed_part) + (size_t)k * LOOM_RDV_PEER_BYTES,
				      (uint32_t)k);
	}
	if (loom_rdv_decode_reply(data, size, kind, rank, world, "reply", peers, &blob, &blob_len,
				  err, sizeof(err)) != LOOM_OK) {
		FUZZ_CHECK(err[0] && blob == NULL && blob_len == 0);
		return;
	}
	FUZZ_CHECK(kind == LOOM_RDV_REPLY_OK && blob != NULL);
	FUZZ_CHECK(blob_len <= LOOM_RDV_MAX_BLOB && size == loom_rdv_welcome_bytes(world, blob_len));
	FUZZ_CHECK(memcmp(blob, data + 8, blob_len) == 0);
	for (int k = 0; k < world; k++)
		FUZZ_CHECK(peers[k].rank == (uint32_t)k && terminated(peers[k].host, LOOM_COMM_HOSTLEN) &&
			   terminated(peers[k].addr, LOOM_COMM_HOSTLEN));
	/* Rank 0's encoder on what was read: read back, the same table. */
	enc = malloc(size);
	FUZZ_CHECK(enc != NULL);
	loom_rdv_encode_welcome(world, blob, blob_len, peers, enc);
	FUZZ_CHECK(loom_rdv_decode_reply(enc, size, kind, rank, world, "reply", again, &blob2,
					 &blob_len2, err, sizeof(err)) == LOOM_OK);
	FUZZ_CHECK(blob_len2 == blob_len && memcmp(blob2, blob, blob_len) == 0);
	for (int k = 0; k < world; k++)
		FUZZ_CHECK(again[k].pid == peers[k].pid && again[k].probe_port == peers[k].probe_port &&
			   !strcmp(again[k].host, peers[k].host) &&
			   !strcmp(again[k].addr, peers[k].addr));
	free(enc);
	free(blob);
	free(blob2);
}

static void go(const uint8_t *data, size_t size, int rank)
{
	uint8_t m[LOOM_RDV_GO_BYTES], want[LOOM_RDV_GO_BYTES];
	char err[LOOM_COMM_ERRLEN] = "";
	loom_status st;

	fixed(m, sizeof(m), data, size);
	st = loom_rdv_decode_go(m, rank, err, sizeof(err));
	loom_rdv_encode_go(rank, want);
	/* Exactly the one message that names this rank is accepted. */
	FUZZ_CHECK((st == LOOM_OK) == (memcmp(m, want, sizeof(m)) == 0));
	FUZZ_CHECK(st == LOOM_OK || err[0]);
}

/*
 * Rank 0's server (comm/rendezvous.c's loom_rdv_srv_judge) over a script of
 * up to 8 connections: each op byte's low 3 bits pick the connection, bits
 * 3-4 what happens: 0 it sends the next byte's count of bytes (taken from
 * the input), 1 it closes or stalls (bit 5), 2 it sends a whole valid hello
 * for the next byte's rank and world (bit 5: another world), 3 it sends the
 * first next-byte bytes of a valid hello. The server's promises: it waits
 * only for a prefix of a hello, takes each rank of 1..world-1 at most once,
 * counts what it turned away, names the connection in every line; and after
 * any such traffic, the real ranks' hellos complete the group.
 */
typedef struct fconn {
	uint8_t m[LOOM_RDV_HELLO_BYTES];
	size_t got;
} fconn;

static void valid_hello(uint8_t *m, int rank, int world)
{
	loom_comm_peer p;

	memset(&p, 0, sizeof(p));
	p.rank = (uint32_t)rank;
	p.pid = 4000 + (uint32_t)rank;
	p.probe_port = 30000 + (uint32_t)rank;
	snprintf(p.host, sizeof(p.host), "node-%d", rank);
	loom_rdv_encode_hello(&p, world, m);
}

/* Judges what conn k holds; returns the verdict and checks its promises. */
static int judge(loom_rdv_srv *s, fconn *c, int k, int ended, int *taken)
{
	char from[32], why[LOOM_COMM_ERRLEN];
	int rank = -1, before = s->arrived, turned = s->dropped + s->refused, v;

	snprintf(from, sizeof(from), "10.0.0.%d:4%d", k, k);
	why[0] = 0;
	v = loom_rdv_srv_judge(s, c->m, c->got, ended, from, &rank, why, sizeof(why));
	switch (v) {
	case LOOM_RDV_MORE:
		FUZZ_CHECK(!ended && c->got < LOOM_RDV_HELLO_BYTES &&
			   loom_rdv_hello_could_be(c->m, c->got));
		FUZZ_CHECK(s->arrived == before && s->dropped + s->refused == turned);
		return v;
	case LOOM_RDV_TAKE:
		FUZZ_CHECK(rank >= 1 && rank < s->world && !taken[rank]);
		FUZZ_CHECK(c->got == LOOM_RDV_HELLO_BYTES && s->arrived == before + 1);
		FUZZ_CHECK(s->peers[rank].rank == (uint32_t)rank && s->peers[rank].pid != 0);
		snprintf(from, sizeof(from), "10.0.0.%d", k);
		FUZZ_CHECK(!strcmp(s->peers[rank].addr, from));
		taken[rank] = 1;
		break;
	case LOOM_RDV_DROP:
	case LOOM_RDV_REFUSE:
		FUZZ_CHECK(s->arrived == before && s->dropped + s->refused == turned + 1);
		FUZZ_CHECK(terminated(why, sizeof(why)) && strstr(why, from));
		FUZZ_CHECK(strlen(s->turned) < LOOM_RDV_TURNED_LEN);
		break;
	default:
		FUZZ_CHECK(!"a verdict outside the four");
	}
	c->got = 0;
	return v;
}

static void server(const uint8_t *data, size_t size, int world)
{
	loom_comm_peer peers[16];
	loom_rdv_srv s;
	fconn conns[8];
	int taken[16] = { 0 }, k;
	size_t i = 0;

	memset(peers, 0, sizeof(peers));
	memset(conns, 0, sizeof(conns));
	memset(&s, 0, sizeof(s));
	peers[0].pid = 1;
	s.world = world;
	s.peers = peers;
	s.arrived = 1;
	while (i < size) {
		uint8_t op = data[i++], arg = i < size ? data[i] : 0;
		fconn *c = &conns[op & 7];
		int what = (op >> 3) & 3, alt = (op >> 5) & 1;
		size_t n;

		switch (what) {
		case 0: /* raw bytes */
			i = i < size ? i + 1 : size;
			n = arg;
			if (n > size - i)
				n = size - i;
			if (n > sizeof(c->m) - c->got)
				n = sizeof(c->m) - c->got;
			memcpy(c->m + c->got, data + i, n);
			i += n;
			c->got += n;
			break;
		case 1: /* it closes or stalls */
			judge(&s, c, op & 7, alt ? LOOM_RDV_STALLED : LOOM_RDV_CLOSED, taken);
			continue;
		case 2: /* a whole hello of a rank (of another world with bit 5) */
		case 3: /* the start of one */
			i++;
			c->got = 0;
			valid_hello(c->m, 1 + arg % (world > 1 ? world - 1 : 1),
				    alt ? world + 1 + (arg >> 4) : world);
			c->got = what == 2 ? LOOM_RDV_HELLO_BYTES : arg % LOOM_RDV_HELLO_BYTES;
			break;
		}
		judge(&s, c, op & 7, LOOM_RDV_OPEN, taken);
	}
	/* The real ranks come now: each not taken yet is taken (one already
	 * taken by the script is refused as a duplicate). */
	for (k = 1; k < world; k++) {
		fconn c = { .got = LOOM_RDV_HELLO_BYTES };
		int was = taken[k];

		valid_hello(c.m, k, world);
		FUZZ_CHECK(judge(&s, &c, 0, LOOM_RDV_OPEN, taken) ==
			   (was ? LOOM_RDV_REFUSE : LOOM_RDV_TAKE));
	}
	FUZZ_CHECK(s.arrived == world);
	for (k = 1; k < world; k++)
		FUZZ_CHECK(taken[k]);
}

/* What a rank's liveness listener reads from a progress link (comm/
 * progress.c): the link's first 16 bytes, then a record of 144. */
static void progress(const uint8_t *data, size_t size, int rank, int world)
{
	uint8_t m[LOOM_PROG_RECORD_BYTES], again[LOOM_PROG_RECORD_BYTES];
	char label[LOOM_PROG_LABEL_BYTES], back[LOOM_PROG_LABEL_BYTES];
	uint64_t seq, seq2;
	int from;

	fixed(m, LOOM_PROG_LINK_BYTES, data, size);
	if (loom_prog_decode_link(m, world, rank, &from) == 0) {
		FUZZ_CHECK(from >= 0 && from < world && from != rank);
		loom_prog_encode_link(from, world, again);
		FUZZ_CHECK(memcmp(again, m, LOOM_PROG_LINK_BYTES) == 0);
	}
	fixed(m, sizeof(m), data, size);
	if (loom_prog_decode_record(m, &seq, label, sizeof(label)))
		return;
	FUZZ_CHECK(terminated(label, sizeof(label)));
	for (size_t i = 0; label[i]; i++)
		FUZZ_CHECK(label[i] >= 32 && label[i] < 127);
	/* What was read, sent again, reads back the same. */
	loom_prog_encode_record(seq, label, again);
	FUZZ_CHECK(loom_prog_decode_record(again, &seq2, back, sizeof(back)) == 0);
	FUZZ_CHECK(seq2 == seq && strcmp(back, label) == 0);
}

/* What loom_store_wait_get reads: WAIT's answer byte, GET's length, the
 * value; then the address parser on the value. */
static void store_reply(const uint8_t *m, size_t n)
{
	char host[LOOM_COMM_HOSTLEN], again[LOOM_STORE_MAX_VALUE + 1], err[LOOM_COMM_ERRLEN];
	char host2[LOOM_COMM_HOSTLEN];
	size_t len = 0, k;
	int port = 0, port2 = 0;

	if (n < 9 || m[0] != LOOM_STORE_STOP_WAITING)
		return;
	if (loom_store_decode_len(m + 1, LOOM_STORE_MAX_VALUE, "k", &len, err, sizeof(err))) {
		FUZZ_CHECK(err[0] && terminated(err, sizeof(err)));
		return;
	}
	FUZZ_CHECK(len <= LOOM_STORE_MAX_VALUE);
	if (n - 9 < len)
		return; /* the socket read would time out */
	if (loom_store_parse_addr(m + 9, len, host, sizeof(host), &port, err, sizeof(err))) {
		FUZZ_CHECK(err[0] && terminated(err, sizeof(err)));
		return;
	}
	FUZZ_CHECK(host[0] && terminated(host, sizeof(host)));
	FUZZ_CHECK(port >= 1 && port <= 65535);
	for (k = 0; host[k]; k++)
		FUZZ_CHECK(host[k] > ' ' && host[k] < 127);
	/* What rank 0 would publish for what was read reads back the same. */
	k = loom_store_format_addr(host, port, again, sizeof(again));
	FUZZ_CHECK(k > 0);
	FUZZ_CHECK(loom_store_parse_addr((const uint8_t *)again, k, host2, sizeof(host2), &port2,
					 err, sizeof(err)) == LOOM_OK);
	FUZZ_CHECK(!strcmp(host, host2) && port == port2);
}

/* A Slurm host list: the count, the first, a chosen and the last host. */
static void hostlist(const uint8_t *m, size_t n, int pick)
{
	char *list = malloc(n + 1), out[LOOM_COMM_HOSTLEN], first[LOOM_COMM_HOSTLEN];
	char err[LOOM_COMM_ERRLEN] = "";
	long count, i;

	FUZZ_CHECK(list != NULL);
	memcpy(list, m, n);
	list[n] = 0;
	count = loom_slurm_hostlist_count(list, err, sizeof(err));
	if (count < 0) {
		FUZZ_CHECK(err[0] && terminated(err, sizeof(err)));
		FUZZ_CHECK(loom_slurm_hostlist_nth(list, 0, out, sizeof(out), err, sizeof(err)) !=
			   LOOM_OK);
		free(list);
		return;
	}
	FUZZ_CHECK(count >= 1);
	if (loom_slurm_hostlist_nth(list, 0, first, sizeof(first), err, sizeof(err)) == LOOM_OK)
		FUZZ_CHECK(first[0] && terminated(first, sizeof(first)));
	for (i = pick % count; i < count; i += count - 1 > i ? count - 1 - i : 1) {
		if (loom_slurm_hostlist_nth(list, i, out, sizeof(out), err, sizeof(err)) == LOOM_OK)
			FUZZ_CHECK(out[0] && strlen(out) < sizeof(out) && !strchr(out, ',') &&
				   !strchr(out, '['));
		else
			FUZZ_CHECK(strstr(err, "longer than"));
		if (i == count - 1)
			break;
	}
	FUZZ_CHECK(loom_slurm_hostlist_nth(list, count, out, sizeof(out), err, sizeof(err)) !=
		   LOOM_OK);
	free(list);
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t *copy;
	int world, rank, which, seal;

	if (size < 3)
		return 0;
	which = data[0] & 7;
	seal = data[0] >> 7;
	world = 1 + data[1] % 16;
	rank = data[2] % world;
	data += 3;
	size -= 3;
	/* A private copy: the harness may reseal it, and ASan sees its end. */
	copy = malloc(size ? size : 1);
	FUZZ_CHECK(copy != NULL);
	if (size)
		memcpy(copy, data, size);
	switch (which) {
	case 0: hello(copy, size, world); break;
	case 1: head(copy, size, world); break;
	case 2: reply(copy, size, LOOM_RDV_REPLY_OK, rank, world, seal); break;
	case 3: reply(copy, size, LOOM_RDV_REPLY_ERR, rank, world, 0); break;
	case 4: go(copy, size, rank); break;
	case 5: server(copy, size, world); break;
	case 6: progress(copy, size, rank, world); break;
	case 7:
		if (world & 1)
			store_reply(copy, size);
		else
			hostlist(copy, size, rank * 7919);
		break;
	default: break;
	}
	free(copy);
	return 0;
}
