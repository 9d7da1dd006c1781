/*
 * comm/store.c — a client of PyTorch's TCP store (c10d's TCPStore wire
 * protocol), for the store torchrun's agent already keeps on MASTER_PORT
 * (TORCHELASTIC_USE_AGENT_STORE=True): rank 0 publishes where its own
 * rendezvous listens, every other rank waits for that key and reads it.
 * Written from the protocol as PyTorch implements it; the encoders and the
 * decoders of what the store sends back are plain functions on buffers, so
 * that tests/fuzz/fuzz_rendezvous drives them without a socket.
 *
 * The protocol (every number in the host's order, little-endian on the
 * machines torch ships for): a command is one byte, then its arguments; a
 * string or a value is a u64 length and its bytes.
 *   VALIDATE (0) u32 0x3C85F7CE                     -> nothing
 *   SET      (1) key value                           -> nothing
 *   GET      (3) key                                 -> u64 length, bytes
 *   WAIT     (6) u64 count, keys                     -> u8 STOP_WAITING (0)
 *   CANCEL_WAIT (12)                                 -> u8 WAIT_CANCELED (1),
 *                            perhaps after a STOP_WAITING that crossed it
 *   PING     (13) u32 nonce                          -> the same u32
 * A PyTorch 2.x client sends VALIDATE then PING first; so does this one.
 */
#include "comm/comm_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------------ encoders */

static size_t put_u64(uint8_t *p, uint64_t v)
{
	int i;

	for (i = 0; i < 8; i++)
		p[i] = (uint8_t)(v >> (8 * i));
	return 8;
}

static size_t put_u32(uint8_t *p, uint32_t v)
{
	int i;

	for (i = 0; i < 4; i++)
		p[i] = (uint8_t)(v >> (8 * i));
	return 4;
}

static size_t put_bytes(uint8_t *p, const void *s, size_t n)
{
	size_t k = put_u64(p, n);

	memcpy(p + k, s, n);
	return k + n;
}

size_t loom_store_encode_u32(int cmd, uint32_t v, uint8_t *out)
{
	out[0] = (uint8_t)cmd;
	return 1 + put_u32(out + 1, v);
}

size_t loom_store_encode_set(const char *key, const void *val, size_t len, uint8_t *out,
			     size_t cap)
{
	size_t klen = strlen(key), n = 0;

	if (1 + 16 + klen + len > cap)
		return 0;
	out[n++] = LOOM_STORE_SET;
	n += put_bytes(out + n, key, klen);
	n += put_bytes(out + n, val, len);
	return n;
}

size_t loom_store_encode_key(int cmd, const char *key, uint8_t *out, size_t cap)
{
	size_t klen = strlen(key), n = 0;

	if (1 + 16 + klen > cap)
		return 0;
	out[n++] = (uint8_t)cmd;
	if (cmd == LOOM_STORE_WAIT)
		n += put_u64(out + n, 1);
	n += put_bytes(out + n, key, klen);
	return n;
}

/* ------------------------------------------------------------ decoders */

uint64_t loom_store_get_u64(const uint8_t *p)
{
	uint64_t v = 0;
	int i;

	for (i = 7; i >= 0; i--)
		v = v << 8 | p[i];
	return v;
}

uint32_t loom_store_get_u32(const uint8_t *p)
{
	return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

loom_status loom_store_decode_len(const uint8_t m[8], size_t cap, const char *key,
				  size_t *len, char *err, size_t errlen)
{
	uint64_t n = loom_store_get_u64(m);

	if (n > cap)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				      "torchrun's store: the value of '%s' is %llu bytes, more than "
				      "the %zu a loom address takes (not loom's key?)",
				      key, (unsigned long long)n, cap);
	*len = (size_t)n;
	return LOOM_OK;
}

size_t loom_store_format_addr(const char *host, int port, char *out, size_t cap)
{
	int n = snprintf(out, cap, "%s%s %d", LOOM_STORE_ADDR_TAG, host, port);

	return n < 0 || (size_t)n >= cap ? 0 : (size_t)n;
}

/* A host as a numeric address or a name: letters, digits and . - _ : %
 * (IPv6 with a zone), nothing that a shell or a resolver would read twice. */
static int host_char(uint8_t c)
{
	return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z') || (c >= '0' && c <= '9') ||
	       c == '.' || c == '-' || c == '_' || c == ':' || c == '%';
}

loom_status loom_store_parse_addr(const uint8_t *v, size_t n, char *host, size_t hostcap,
				  int *port, char *err, size_t errlen)
{
	size_t tag = strlen(LOOM_STORE_ADDR_TAG), i, h;
	long p = 0;

	if (n < tag || memcmp(v, LOOM_STORE_ADDR_TAG, tag))
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				      "torchrun's store: rank 0's address (%zu bytes) does not "
				      "begin with '%s'",
				      n, LOOM_STORE_ADDR_TAG);
	for (i = tag; i < n && host_char(v[i]); i++)
		;
	h = i - tag;
	if (!h || h >= hostcap || i >= n || v[i] != ' ' || i + 1 == n)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				      "torchrun's store: rank 0's address is not '%shost port' "
				      "(%zu bytes)",
				      LOOM_STORE_ADDR_TAG, n);
	for (i++; i < n; i++) {
		if (v[i] < '0' || v[i] > '9' || p > 65535)
			return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
					      "torchrun's store: rank 0's port is not a number");
		p = p * 10 + (v[i] - '0');
	}
	if (p < 1 || p > 65535)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				      "torchrun's store: rank 0's port %ld is outside 1..65535", p);
	memcpy(host, v + tag, h);
	host[h] = 0;
	*port = (int)p;
	return LOOM_OK;
}

/* ------------------------------------------------------------ sockets */

static int wait_fd_in(int fd, double deadline)
{
	struct pollfd p = { fd, POLLIN, 0 };
	int rc;

	do {
		double left = deadline - loom_comm_now();

		if (left <= 0)
			return 0;
		rc = poll(&p, 1, (int)(left * 1000) + 1);
	} while (rc < 0 && errno == EINTR);
	return rc;
}

static loom_status send_all(loom_store *s, const uint8_t *m, size_t n, const char *what,
			    char *err, size_t errlen)
{
	char who[320];

	snprintf(who, sizeof(who), "torchrun's store at %s:%d: %s", s->host, s->port, what);
	return loom_sock_write(s->fd, m, n, s->deadline, who, err, errlen);
}

static loom_status recv_all(loom_store *s, void *m, size_t n, const char *what, char *err,
			    size_t errlen)
{
	char who[320];

	snprintf(who, sizeof(who), "torchrun's store at %s:%d: %s", s->host, s->port, what);
	return loom_sock_read(s->fd, m, n, s->deadline, who, err, errlen);
}

/* A PING's round trip: the store answered everything sent before it. */
static loom_status ping(loom_store *s, char *err, size_t errlen)
{
	uint8_t m[5], r[4];
	uint32_t nonce = (uint32_t)getpid();
	loom_status st;

	loom_store_encode_u32(LOOM_STORE_PING, nonce, m);
	if ((st = send_all(s, m, sizeof(m), "ping", err, errlen)) ||
	    (st = recv_all(s, r, sizeof(r), "ping's answer", err, errlen)))
		return st;
	if (loom_store_get_u32(r) != nonce)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				      "torchrun's store at %s:%d answered the ping with %u, not %u: "
				      "is MASTER_PORT torchrun's store?",
				      s->host, s->port, loom_store_get_u32(r), nonce);
	return LOOM_OK;
}

loom_status loom_store_open(loom_store *s, const char *host, int port, double deadline,
			    char *err, size_t errlen)
{
	uint8_t m[16];
	loom_status st;

	memset(s, 0, sizeof(*s));
	s->fd = -1;
	snprintf(s->host, sizeof(s->host), "%s", host);
	s->port = port;
	s->deadline = deadline;
	/* The agent opened its store before it started us: a refusal is
	 * retried only briefly (a store restarting between attempts). */
	for (;;) {
		double now = loom_comm_now();

		/* Each try a second of its own, so that the last one ends with
		 * its real reason (refused, unreachable), not the deadline's. */
		s->fd = loom_sock_connect(host, port, deadline > now + 1.0 ? deadline : now + 1.0);
		if (s->fd >= 0)
			break;
		if (loom_comm_now() >= deadline)
			return loom_errnf(err, errlen, LOOM_ERR_IO,
					      "torchrun's store at MASTER_ADDR=%s MASTER_PORT=%d: %s "
					      "(TORCHELASTIC_USE_AGENT_STORE=True: torchrun's agent "
					      "should be listening there)",
					      host, port, strerror(errno));
		usleep(50000);
	}
	/* Back to blocking: every read and write below polls with the deadline. */
	{
		int fl = fcntl(s->fd, F_GETFL);

		if (fl >= 0)
			fcntl(s->fd, F_SETFL, fl & ~O_NONBLOCK);
	}
	if ((st = send_all(s, m, loom_store_encode_u32(LOOM_STORE_VALIDATE,
							LOOM_STORE_VALIDATION_MAGIC, m),
			   "validate", err, errlen)) ||
	    (st = ping(s, err, errlen))) {
		loom_store_close(s);
		return st;
	}
	return LOOM_OK;
}

loom_status loom_store_set(loom_store *s, const char *key, const void *val, size_t len,
			   char *err, size_t errlen)
{
	uint8_t m[1024];
	size_t n = loom_store_encode_set(key, val, len, m, sizeof(m));
	loom_status st;

	if (!n)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "torchrun's store: key '%s' and its value are too long", key);
	if ((st = send_all(s, m, n, "set", err, errlen)))
		return st;
	return ping(s, err, errlen);
}

loom_status loom_store_wait_get(loom_store *s, const char *key, void *val, size_t cap,
				size_t *len, char *err, size_t errlen)
{
	uint8_t m[1024], b[8];
	size_t n = loom_store_encode_key(LOOM_STORE_WAIT, key, m, sizeof(m));
	loom_status st;

	if (!n)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
				      "torchrun's store: key '%s' is too long", key);
	if ((st = send_all(s, m, n, "wait", err, errlen)))
		return st;
	if (wait_fd_in(s->fd, s->deadline) <= 0) {
		/* Tell the store we stopped waiting, so that it drops the
		 * waiter; what it answers no longer matters. */
		m[0] = LOOM_STORE_CANCEL_WAIT;
		send(s->fd, m, 1, MSG_NOSIGNAL);
		return loom_errnf(err, errlen, LOOM_ERR_IO,
				      "torchrun's store at %s:%d: key '%s' did not appear",
				      s->host, s->port, key);
	}
	if ((st = recv_all(s, b, 1, "wait's answer", err, errlen)))
		return st;
	if (b[0] != LOOM_STORE_STOP_WAITING)
		return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
				      "torchrun's store at %s:%d answered a wait with %u, not "
				      "STOP_WAITING",
				      s->host, s->port, b[0]);
	n = loom_store_encode_key(LOOM_STORE_GET, key, m, sizeof(m));
	if ((st = send_all(s, m, n, "get", err, errlen)) ||
	    (st = recv_all(s, b, 8, "get's length", err, errlen)) ||
	    (st = loom_store_decode_len(b, cap, key, len, err, errlen)))
		return st;
	return recv_all(s, val, *len, "get's value", err, errlen);
}

void loom_store_close(loom_store *s)
{
	if (s->fd >= 0)
		close(s->fd);
	s->fd = -1;
}

/* ------------------------------------------------------------ the rendezvous */

void loom_store_key(const loom_comm_env *e, char *key, size_t len)
{
	/* A fresh key per restart: torch's own env:// workers used the
	 * prefix "/worker/attempt_<restart>" on the agent's store (PyTorch
	 * 2.15's agent makes a new store per attempt instead); a restarted
	 * rank must never read the address of an attempt that is gone. */
	snprintf(key, len, "/worker/attempt_%d/loom_rank0_addr", e->restart);
}

/* Rank 0's address as the others should dial it. Its listener is IPv4
 * (loom_sock_listen), so an IPv6 side of the store connection becomes its
 * IPv4 form (mapped, or loopback), else the host name, which the others
 * resolve as they resolve MASTER_ADDR. */
static void own_address(const struct sockaddr_storage *ss, char *addr, size_t len)
{
	if (ss->ss_family == AF_INET) {
		inet_ntop(AF_INET, &((const struct sockaddr_in *)ss)->sin_addr, addr, (socklen_t)len);
	} else if (ss->ss_family == AF_INET6) {
		const struct in6_addr *a = &((const struct sockaddr_in6 *)ss)->sin6_addr;

		if (IN6_IS_ADDR_V4MAPPED(a))
			inet_ntop(AF_INET, &a->s6_addr[12], addr, (socklen_t)len);
		else if (IN6_IS_ADDR_LOOPBACK(a))
			snprintf(addr, len, "127.0.0.1");
		else if (gethostname(addr, len - 1) == 0)
			addr[len - 1] = 0;
		else
			addr[0] = 0;
	}
}

loom_status loom_store_rendezvous(const loom_comm_env *e, loom_rdv *r, char *addr,
				  size_t addrlen, double timeout_s, char *err, size_t errlen)
{
	loom_store s;
	char key[128], val[LOOM_STORE_MAX_VALUE + 1];
	size_t n;
	loom_status st;

	loom_store_key(e, key, sizeof(key));
	st = loom_store_open(&s, e->master_addr, e->master_port, loom_comm_now() + timeout_s,
			     err, errlen);
	if (st)
		return st;
	if (e->rank == 0) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		int port = 0;

		/* Where the others reach rank 0: the address this host used
		 * to reach the store, which they reach too. */
		addr[0] = 0;
		if (getsockname(s.fd, (struct sockaddr *)&ss, &sl) == 0)
			own_address(&ss, addr, addrlen);
		if (!addr[0])
			snprintf(addr, addrlen, "%s", e->master_addr);
		st = loom_sock_listen(0, &r->listen_fd, &port, err, errlen);
		if (!st) {
			r->listen_given = 1;
			n = loom_store_format_addr(addr, port, val, sizeof(val));
			st = n ? loom_store_set(&s, key, val, n, err, errlen)
			       : loom_errnf(err, errlen, LOOM_ERR_INVALID,
						"torchrun's store: address '%s' is too long", addr);
		}
		r->master_port = port;
	} else {
		st = loom_store_wait_get(&s, key, val, LOOM_STORE_MAX_VALUE, &n, err, errlen);
		if (!st)
			st = loom_store_parse_addr((const uint8_t *)val, n, addr, addrlen,
						   &r->master_port, err, errlen);
	}
	loom_store_close(&s);
	if (st && e->rank != 0 && strstr(err, "did not appear")) {
		char why[LOOM_COMM_ERRLEN];

		snprintf(why, sizeof(why), "%s", err);
		loom_errnf(err, errlen, LOOM_ERR_IO,
			       "rendezvous: rank %d waited %.1f s for rank 0's address in "
			       "torchrun's store (%s)",
			       e->rank, timeout_s, why);
	}
	r->master_addr = addr;
	return st;
}
