/*
 * comm/wire.h — the bytes comm/ takes from other processes: the env://
 * rendezvous messages (TCP, comm/rendezvous.c) and the fingerprint records
 * every rank gathers at start-up (comm/fingerprint.c). Encoders and strict
 * decoders on plain buffers, with no socket, MPI or clock behind them, so
 * that tests/fuzz drives every decoder directly.
 */
#ifndef LOOM_COMM_WIRE_H
#define LOOM_COMM_WIRE_H

#include <stddef.h>
#include <stdint.h>

#include "comm/comm.h"

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_COMM_HOSTLEN 64

/* What each rank tells the others at start-up (metadata only). */
typedef struct loom_comm_peer {
	uint32_t rank;
	uint32_t pid;
	uint32_t probe_port;               /* its liveness listener */
	char host[LOOM_COMM_HOSTLEN];      /* gethostname() */
	char addr[LOOM_COMM_HOSTLEN];      /* where others reach it (rank 0 fills it) */
} loom_comm_peer;

/* ------------------------------------------------------------- rendezvous */

/*
 * Little-endian u32 fields:
 *   hello  "LMRDVHI1" version rank world pid probe_port host[64]
 *   reply  "LMRDVRE1" kind payload_len, then payload_len bytes:
 *          LOOM_RDV_REPLY_OK: world blob_len blob peer[world]
 *                             (peer: rank pid probe_port host[64] addr[64])
 *          LOOM_RDV_REPLY_ERR: rank 0's message (text, not terminated)
 *   go     "LMRDVGO1" rank
 */
#define LOOM_RDV_VERSION 1
#define LOOM_RDV_REPLY_OK 1
#define LOOM_RDV_REPLY_ERR 2
#define LOOM_RDV_MAX_BLOB (1u << 20)
#define LOOM_RDV_HELLO_BYTES (8 + 4 * 5 + LOOM_COMM_HOSTLEN)
#define LOOM_RDV_HEAD_BYTES 16
#define LOOM_RDV_PEER_BYTES (4 * 3 + 2 * LOOM_COMM_HOSTLEN)
#define LOOM_RDV_GO_BYTES 12

void loom_rdv_encode_hello(const loom_comm_peer *self, int world, uint8_t *out);
/* The reply's 16-byte head. */
void loom_rdv_encode_head(uint32_t kind, uint32_t payload_len, uint8_t *out);
/* The OK payload's size, and the payload itself into out (that many bytes). */
size_t loom_rdv_welcome_bytes(int world, size_t blob_len);
void loom_rdv_encode_welcome(int world, const void *blob, size_t blob_len,
			     const loom_comm_peer *peers, uint8_t *out);
void loom_rdv_encode_go(int rank, uint8_t *out);

/* Whether the first n bytes a connection sent agree with a hello's magic
 * (n < 8: as far as they go), so that rank 0 drops a stranger early. */
int loom_rdv_hello_could_be(const uint8_t *m, size_t n);
/*
 * Rank 0 reads a hello that came from `from` ("address:port") in a group of
 * `world`: wrong magic or version, another world size, a rank outside
 * 1..world-1 or a probe port above 65535 is an error naming the rank (or
 * `from` while the rank is unknown). On success *p has rank, pid, probe
 * port and a terminated host; addr is left empty for the caller.
 */
loom_status loom_rdv_decode_hello(const uint8_t *m, int world, const char *from,
				  loom_comm_peer *p, char *err, size_t errlen);
/* A rank reads the head of rank 0's reply: magic, kind, and a payload
 * length no larger than an OK reply of `world` peers can be. */
loom_status loom_rdv_decode_head(const uint8_t *head, int world, const char *who,
				 uint32_t *kind, uint32_t *payload_len, char *err, size_t errlen);
/*
 * A rank (`rank` of `world`) reads the payload of kind `kind`. An error reply
 * becomes LOOM_ERR_MISMATCH with rank 0's text. An OK reply must hold this
 * world size, a blob of at most LOOM_RDV_MAX_BLOB bytes and exactly world
 * peers, entry k naming rank k: then peers[0..world) are filled (each string
 * terminated) and *blob is a malloc'd copy (never NULL on success; the
 * caller frees it). On failure *blob is NULL and peers may be half filled.
 */
loom_status loom_rdv_decode_reply(const uint8_t *payload, size_t len, uint32_t kind, int rank,
				  int world, const char *who, loom_comm_peer *peers, void **blob,
				  size_t *blob_len, char *err, size_t errlen);
/* A rank reads rank 0's turn signal, which must name it. */
loom_status loom_rdv_decode_go(const uint8_t *m, int rank, char *err, size_t errlen);

/* ------------------------------------------------------------ progress */

/*
 * What a rank tells the ranks on other hosts of its progress
 * (comm/progress.c), over a TCP connection to each one's liveness listener:
 *   link    "LMPRGLK1" rank world            (once, when the link opens)
 *   record  "LMPRGRC1" seq(u64) label[128]   (on entry to every collective)
 * Little-endian; the label is text up to its first NUL.
 */
#define LOOM_PROG_LABEL_BYTES 128
#define LOOM_PROG_LINK_BYTES 16
#define LOOM_PROG_RECORD_BYTES (8 + 8 + LOOM_PROG_LABEL_BYTES)

void loom_prog_encode_link(int rank, int world, uint8_t *out);
void loom_prog_encode_record(uint64_t seq, const char *label, uint8_t *out);
/* A link's first bytes, read by rank `self` of `world`: 0 with the sender's
 * rank in *rank (another rank of this world), -1 for anything else (a
 * liveness probe sends nothing; a stranger anything). */
int loom_prog_decode_link(const uint8_t *m, int world, int self, int *rank);
/* A record: 0 with its seq and its label (terminated, unprintable bytes
 * shown as '?', at most len - 1 bytes), -1 when the magic is wrong. */
int loom_prog_decode_record(const uint8_t *m, uint64_t *seq, char *label, size_t len);

/* ------------------------------------------------------------ fingerprint */

/*
 * Record: "LMFPRT01" u64 head_len, u64 n_items, head bytes, n_items u64
 * (host byte order: every rank of a group runs the same build).
 */
#define LOOM_FP_HEADER 24

typedef struct loom_fp_view {
	const uint8_t *head;
	uint64_t head_len;
	const uint8_t *items; /* n_items u64, unaligned */
	uint64_t n_items;
} loom_fp_view;

/* Serializes fp into a malloc'd record (*out; the caller frees it). */
loom_status loom_fingerprint_serialize(const loom_fingerprint *fp, uint8_t **out, size_t *len);
/* Strict parse of len bytes: NULL and *v pointing into rec, or what is wrong
 * ("wrong magic", ...). */
const char *loom_fingerprint_parse(const uint8_t *rec, uint64_t len, loom_fp_view *v);
uint64_t loom_fingerprint_item(const loom_fp_view *v, uint64_t i);

/* How record a differs from record b (rank 0's): the header first, then
 * the items in order, then their count. *at: the header byte or item index
 * where they part (the shorter count for LOOM_FP_COUNT). */
enum { LOOM_FP_SAME, LOOM_FP_HEAD, LOOM_FP_ITEM, LOOM_FP_COUNT };
int loom_fingerprint_compare(const loom_fp_view *a, const loom_fp_view *b, uint64_t *at);

/* The sentence for an item that differs, from rank r's description `mine`
 * and rank 0's `zero` (both terminated): "rank 1: node 14 conv2d has shape
 * [100,..], rank 0 has [50,..]" when both agree up to and past " has ",
 * else both in full. */
void loom_fingerprint_say_item(char *buf, size_t len, int r, const char *mine, const char *zero);

/* ------------------------------------------------------------- settings */

/*
 * Every rank's n setting values, LOOM_COMM_SETTING_LEN bytes each (text,
 * compared up to its first NUL or the record's last byte), rank after rank
 * in `all`. 1 with the first rank (then setting) whose value differs from
 * rank 0's in *rank and *which; 0 when all agree.
 */
int loom_settings_differ(const uint8_t *all, int world, size_t n, int *rank, size_t *which);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_COMM_WIRE_H */
