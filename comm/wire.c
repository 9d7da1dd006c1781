/*
 * comm/wire.c — encoders and strict decoders of the rendezvous messages and
 * the fingerprint records (formats in comm/wire.h). Every decoder trusts
 * nothing it reads: lengths are checked before they are used, strings are
 * terminated here, and a failure says what was wrong and from whom.
 */
#include "comm/comm_internal.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static const char HELLO_MAGIC[8] = { 'L', 'M', 'R', 'D', 'V', 'H', 'I', '1' };
static const char REPLY_MAGIC[8] = { 'L', 'M', 'R', 'D', 'V', 'R', 'E', '1' };
static const char GO_MAGIC[8] = { 'L', 'M', 'R', 'D', 'V', 'G', 'O', '1' };
static const char FP_MAGIC[8] = { 'L', 'M', 'F', 'P', 'R', 'T', '0', '1' };
static const char LINK_MAGIC[8] = { 'L', 'M', 'P', 'R', 'G', 'L', 'K', '1' };
static const char RECORD_MAGIC[8] = { 'L', 'M', 'P', 'R', 'G', 'R', 'C', '1' };

static void put32(uint8_t *p, uint32_t v)
{
	p[0] = v, p[1] = v >> 8, p[2] = v >> 16, p[3] = v >> 24;
}

static uint32_t get32(const uint8_t *p)
{
	return p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

/* ------------------------------------------------------------- rendezvous */

void loom_rdv_encode_hello(const loom_comm_peer *self, int world, uint8_t *out)
{
	memcpy(out, HELLO_MAGIC, 8);
	put32(out + 8, LOOM_RDV_VERSION);
	put32(out + 12, self->rank);
	put32(out + 16, (uint32_t)world);
	put32(out + 20, self->pid);
	put32(out + 24, self->probe_port);
	memcpy(out + 28, self->host, LOOM_COMM_HOSTLEN);
	out[28 + LOOM_COMM_HOSTLEN - 1] = 0;
}

void loom_rdv_encode_head(uint32_t kind, uint32_t payload_len, uint8_t *out)
{
	memcpy(out, REPLY_MAGIC, 8);
	put32(out + 8, kind);
	put32(out + 12, payload_len);
}

static void encode_peer(const loom_comm_peer *p, uint8_t *out)
{
	put32(out, p->rank);
	put32(out + 4, p->pid);
	put32(out + 8, p->probe_port);
	memcpy(out + 12, p->host, LOOM_COMM_HOSTLEN);
	memcpy(out + 12 + LOOM_COMM_HOSTLEN, p->addr, LOOM_COMM_HOSTLEN);
}

static void decode_peer(const uint8_t *in, loom_comm_peer *p)
{
	p->rank = get32(in);
	p->pid = get32(in + 4);
	p->probe_port = get32(in + 8);
	memcpy(p->host, in + 12, LOOM_COMM_HOSTLEN);
	memcpy(p->addr, in + 12 + LOOM_COMM_HOSTLEN, LOOM_COMM_HOSTLEN);
	p->host[LOOM_COMM_HOSTLEN - 1] = p->addr[LOOM_COMM_HOSTLEN - 1] = 0;
}

size_t loom_rdv_welcome_bytes(int world, size_t blob_len)
{
	return 8 + blob_len + (size_t)world * LOOM_RDV_PEER_BYTES;
}

void loom_rdv_encode_welcome(int world, const void *blob, size_t blob_len,
			     const loom_comm_peer *peers, uint8_t *out)
{
	put32(out, (uint32_t)world);
	put32(out + 4, (uint32_t)blob_len);
	if (blob_len)
		memcpy(out + 8, blob, blob_len);
	for (int k = 0; k < world; k++)
		encode_peer(&peers[k], out + 8 + blob_len + (size_t)k * LOOM_RDV_PEER_BYTES);
}

void loom_rdv_encode_go(int rank, uint8_t *out)
{
	memcpy(out, GO_MAGIC, 8);
	put32(out + 8, (uint32_t)rank);
}

int loom_rdv_hello_could_be(const uint8_t *m, size_t n)
{
	return memcmp(m, HELLO_MAGIC, n < 8 ? n : 8) == 0;
}

loom_status loom_rdv_decode_hello(const uint8_t *m, int world, const char *from,
				  loom_comm_peer *p, char *err, size_t errlen)
{
	uint32_t rank, claimed;

	if (memcmp(m, HELLO_MAGIC, 8))
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				      "rendezvous: %s sent a message with a wrong magic "
				      "(not a loom rank?)",
				      from);
	if (get32(m + 8) != LOOM_RDV_VERSION)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				      "rendezvous: %s speaks version %u, rank 0 speaks %d", from,
				      get32(m + 8), LOOM_RDV_VERSION);
	rank = get32(m + 12);
	claimed = get32(m + 16);
	if (claimed != (uint32_t)world)
		return loom_errnf(err, errlen, LOOM_ERR_MISMATCH,
				      "rendezvous: rank %u (%s) has WORLD_SIZE=%u, rank 0 has %d",
				      rank, from, claimed, world);
	if (rank == 0 || rank >= (uint32_t)world)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "rendezvous: %s claims rank %u, expected 1..%d", from, rank,
				      world - 1);
	memset(p, 0, sizeof(*p));
	p->rank = rank;
	p->pid = get32(m + 20);
	p->probe_port = get32(m + 24);
	memcpy(p->host, m + 28, LOOM_COMM_HOSTLEN);
	p->host[LOOM_COMM_HOSTLEN - 1] = 0;
	if (p->probe_port > 65535)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				      "rendezvous: rank %u (%s) sent probe port %u", rank, from,
				      p->probe_port);
	return LOOM_OK;
}

loom_status loom_rdv_decode_head(const uint8_t *head, int world, const char *who,
				 uint32_t *kind, uint32_t *payload_len, char *err, size_t errlen)
{
	*kind = get32(head + 8);
	*payload_len = get32(head + 12);
	if (memcmp(head, REPLY_MAGIC, 8) ||
	    (*kind != LOOM_RDV_REPLY_OK && *kind != LOOM_RDV_REPLY_ERR))
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				      "%s: wrong magic or kind (is MASTER_PORT another service?)",
				      who);
	if (*payload_len > loom_rdv_welcome_bytes(world, LOOM_RDV_MAX_BLOB))
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT, "%s: claims %u bytes, too many",
				      who, *payload_len);
	return LOOM_OK;
}

loom_status loom_rdv_decode_reply(const uint8_t *payload, size_t len, uint32_t kind, int rank,
				  int world, const char *who, loom_comm_peer *peers, void **blob,
				  size_t *blob_len, char *err, size_t errlen)
{
	uint32_t claimed, bl;

	*blob = NULL;
	*blob_len = 0;
	if (kind == LOOM_RDV_REPLY_ERR)
		return loom_errnf(err, errlen, LOOM_ERR_MISMATCH, "rank 0 refused the group: %.*s",
				      (int)(len < 65536 ? len : 65536), (const char *)payload);
	if (len < 8)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				      "%s: %zu bytes, shorter than its header", who, len);
	claimed = get32(payload);
	bl = get32(payload + 4);
	if (claimed != (uint32_t)world)
		return loom_errnf(err, errlen, LOOM_ERR_MISMATCH,
				      "%s: rank 0 has WORLD_SIZE=%u, rank %d has %d", who, claimed,
				      rank, world);
	if (bl > LOOM_RDV_MAX_BLOB || len != loom_rdv_welcome_bytes(world, bl))
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				      "%s: length %zu does not match its blob of %u bytes and %u peers",
				      who, len, bl, claimed);
	for (int k = 0; k < world; k++) {
		decode_peer(payload + 8 + bl + (size_t)k * LOOM_RDV_PEER_BYTES, &peers[k]);
		if (peers[k].rank != (uint32_t)k)
			return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
					      "%s: peer table entry %d names rank %u", who, k,
					      peers[k].rank);
	}
	*blob = malloc(bl ? bl : 1);
	if (!*blob)
		return loom_errnf(err, errlen, LOOM_ERR_NOMEM, "rendezvous: out of memory");
	memcpy(*blob, payload + 8, bl);
	*blob_len = bl;
	return LOOM_OK;
}

loom_status loom_rdv_decode_go(const uint8_t *m, int rank, char *err, size_t errlen)
{
	if (memcmp(m, GO_MAGIC, 8) || get32(m + 8) != (uint32_t)rank)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				      "rendezvous: malformed turn signal from rank 0");
	return LOOM_OK;
}

/* ------------------------------------------------------------ fingerprint */

loom_status loom_fingerprint_serialize(const loom_fingerprint *fp, uint8_t **out, size_t *len)
{
	uint64_t hl = fp->head_len, n = fp->n_items;
	size_t total = LOOM_FP_HEADER + fp->head_len + 8 * fp->n_items;
	uint8_t *p = malloc(total);

	*out = p;
	*len = total;
	if (!p)
		return LOOM_ERR_NOMEM;
	memcpy(p, FP_MAGIC, 8);
	memcpy(p + 8, &hl, 8);
	memcpy(p + 16, &n, 8);
	if (hl)
		memcpy(p + LOOM_FP_HEADER, fp->head, hl);
	if (n)
		memcpy(p + LOOM_FP_HEADER + hl, fp->items, 8 * n);
	return LOOM_OK;
}

const char *loom_fingerprint_parse(const uint8_t *rec, uint64_t len, loom_fp_view *v)
{
	if (len < LOOM_FP_HEADER)
		return "shorter than its 24-byte header";
	if (memcmp(rec, FP_MAGIC, 8))
		return "wrong magic";
	memcpy(&v->head_len, rec + 8, 8);
	memcpy(&v->n_items, rec + 16, 8);
	/* Each bound before the sum that uses it, so that nothing wraps. */
	if (v->head_len > len - LOOM_FP_HEADER ||
	    v->n_items > (len - LOOM_FP_HEADER - v->head_len) / 8 ||
	    LOOM_FP_HEADER + v->head_len + 8 * v->n_items != len)
		return "its lengths do not add up to its size";
	v->head = rec + LOOM_FP_HEADER;
	v->items = v->head + v->head_len;
	return NULL;
}

uint64_t loom_fingerprint_item(const loom_fp_view *v, uint64_t i)
{
	uint64_t x;

	memcpy(&x, v->items + 8 * i, 8);
	return x;
}

int loom_fingerprint_compare(const loom_fp_view *a, const loom_fp_view *b, uint64_t *at)
{
	uint64_t i, n = a->n_items < b->n_items ? a->n_items : b->n_items;

	if (a->head_len != b->head_len || memcmp(a->head, b->head, a->head_len)) {
		uint64_t m = a->head_len < b->head_len ? a->head_len : b->head_len;

		for (i = 0; i < m && a->head[i] == b->head[i]; i++)
			;
		*at = i;
		return LOOM_FP_HEAD;
	}
	for (i = 0; i < n; i++)
		if (loom_fingerprint_item(a, i) != loom_fingerprint_item(b, i)) {
			*at = i;
			return LOOM_FP_ITEM;
		}
	if (a->n_items != b->n_items) {
		*at = n;
		return LOOM_FP_COUNT;
	}
	return LOOM_FP_SAME;
}

void loom_fingerprint_say_item(char *buf, size_t len, int r, const char *mine, const char *zero)
{
	const char *has = strstr(mine, " has ");
	size_t same = 0;

	while (mine[same] && mine[same] == zero[same])
		same++;
	while (same > 0 && mine[same - 1] != ' ')
		same--;
	if (has && (size_t)(has - mine) + 5 <= same)
		snprintf(buf, len, "rank %d: %s, rank 0 has %s", r, mine, zero + same);
	else
		snprintf(buf, len, "rank %d: %s; rank 0: %s", r, mine, zero);
}

/* ------------------------------------------------------------- settings */

int loom_settings_differ(const uint8_t *all, int world, size_t n, int *rank, size_t *which)
{
	const size_t len = LOOM_COMM_SETTING_LEN;

	for (int r = 1; r < world; r++)
		for (size_t i = 0; i < n; i++) {
			const char *a = (const char *)all + ((size_t)r * n + i) * len;
			const char *z = (const char *)all + i * len;

			if (strncmp(a, z, len - 1)) {
				*rank = r;
				*which = i;
				return 1;
			}
		}
	return 0;
}

/* ------------------------------------------------------------ progress */

void loom_prog_encode_link(int rank, int world, uint8_t *out)
{
	memcpy(out, LINK_MAGIC, 8);
	put32(out + 8, (uint32_t)rank);
	put32(out + 12, (uint32_t)world);
}

void loom_prog_encode_record(uint64_t seq, const char *label, uint8_t *out)
{
	size_t n = strnlen(label, LOOM_PROG_LABEL_BYTES);

	memcpy(out, RECORD_MAGIC, 8);
	put32(out + 8, (uint32_t)seq);
	put32(out + 12, (uint32_t)(seq >> 32));
	memset(out + 16, 0, LOOM_PROG_LABEL_BYTES);
	memcpy(out + 16, label, n);
}

int loom_prog_decode_link(const uint8_t *m, int world, int self, int *rank)
{
	uint32_t r = get32(m + 8);

	if (memcmp(m, LINK_MAGIC, 8) || get32(m + 12) != (uint32_t)world || r >= (uint32_t)world ||
	    r == (uint32_t)self)
		return -1;
	*rank = (int)r;
	return 0;
}

int loom_prog_decode_record(const uint8_t *m, uint64_t *seq, char *label, size_t len)
{
	size_t i;

	if (memcmp(m, RECORD_MAGIC, 8) || !len)
		return -1;
	*seq = (uint64_t)get32(m + 8) | (uint64_t)get32(m + 12) << 32;
	for (i = 0; i < LOOM_PROG_LABEL_BYTES && i + 1 < len && m[16 + i]; i++)
		label[i] = m[16 + i] >= 32 && m[16 + i] < 127 ? (char)m[16 + i] : '?';
	label[i] = 0;
	return 0;
}
