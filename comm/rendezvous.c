/*
 * comm/rendezvous.c — env:// start-up over TCP: rank 0 listens on
 * MASTER_ADDR:MASTER_PORT, checks that every rank arrives within the timeout
 * and hands out its blob (the Open MPI name server's address, the NCCL
 * unique id) and the table of peers. Only metadata travels here; tensors go
 * through MPI or NCCL. Also the liveness probe that names a dead rank.
 *
 * The messages and their strict decoders are in comm/wire.c.
 */
#define _GNU_SOURCE /* accept4 */
#include "comm/comm_internal.h"

#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

/* ------------------------------------------------------------ sockets */

static int wait_fd(int fd, short events, double deadline)
{
	struct pollfd p = { fd, events, 0 };
	double left = deadline - loom_comm_now();
	int rc;

	if (left <= 0)
		return 0;
	do
		rc = poll(&p, 1, (int)(left * 1000) + 1);
	while (rc < 0 && errno == EINTR);
	return rc;
}

loom_status loom_sock_read(int fd, void *buf, size_t n, double deadline, const char *who,
			   char *err, size_t errlen)
{
	size_t got = 0;

	while (got < n) {
		ssize_t k;

		if (wait_fd(fd, POLLIN, deadline) <= 0)
			return loom_comm_errf(err, errlen, LOOM_ERR_IO,
					      "%s: timed out after %zu of %zu bytes", who, got, n);
		k = recv(fd, (char *)buf + got, n - got, 0);
		if (k == 0)
			return loom_comm_errf(err, errlen, LOOM_ERR_FORMAT,
					      "%s: connection closed after %zu of %zu bytes "
					      "(truncated message)",
					      who, got, n);
		if (k < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return loom_comm_errf(err, errlen, LOOM_ERR_IO, "%s: %s after %zu of %zu bytes",
					      who, strerror(errno), got, n);
		}
		got += (size_t)k;
	}
	return LOOM_OK;
}

loom_status loom_sock_write(int fd, const void *buf, size_t n, double deadline,
			    const char *who, char *err, size_t errlen)
{
	size_t put = 0;

	while (put < n) {
		ssize_t k;

		if (wait_fd(fd, POLLOUT, deadline) <= 0)
			return loom_comm_errf(err, errlen, LOOM_ERR_IO, "%s: write timed out", who);
		k = send(fd, (const char *)buf + put, n - put, MSG_NOSIGNAL);
		if (k < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return loom_comm_errf(err, errlen, LOOM_ERR_IO, "%s: %s", who,
					      strerror(errno));
		}
		put += (size_t)k;
	}
	return LOOM_OK;
}

loom_status loom_sock_listen(int port, int *fd, int *port_out, char *err, size_t errlen)
{
	struct sockaddr_in a;
	socklen_t alen = sizeof(a);
	int one = 1;
	int s = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);

	if (s < 0)
		return loom_comm_errf(err, errlen, LOOM_ERR_IO, "socket: %s", strerror(errno));
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_ANY);
	if (bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 128)) {
		int e = errno;

		close(s);
		return loom_comm_errf(err, errlen, LOOM_ERR_IO, "listen on port %d: %s", port,
				      strerror(e));
	}
	getsockname(s, (struct sockaddr *)&a, &alen);
	*fd = s;
	if (port_out)
		*port_out = ntohs(a.sin_port);
	return LOOM_OK;
}

/* One non-blocking connect to host:port, waiting until deadline. Returns the
 * socket, or -1 with errno (ECONNREFUSED for a port nobody listens on). */
static int connect_once(const char *host, int port, double deadline)
{
	struct addrinfo hints, *res = NULL, *ai;
	char service[16];
	int fd = -1;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(service, sizeof(service), "%d", port);
	if (getaddrinfo(host, service, &hints, &res)) {
		errno = EHOSTUNREACH;
		return -1;
	}
	for (ai = res; ai; ai = ai->ai_next) {
		int e = 0;
		socklen_t elen = sizeof(e);

		fd = socket(ai->ai_family, ai->ai_socktype | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
		if (fd < 0)
			continue;
		if (connect(fd, ai->ai_addr, ai->ai_addrlen) == 0)
			break;
		if (errno == EINPROGRESS) {
			if (wait_fd(fd, POLLOUT, deadline) > 0) {
				getsockopt(fd, SOL_SOCKET, SO_ERROR, &e, &elen);
				if (!e)
					break;
			} else {
				e = ETIMEDOUT;
			}
		} else {
			e = errno;
		}
		close(fd);
		fd = -1;
		errno = e;
	}
	freeaddrinfo(res);
	if (fd >= 0) {
		int one = 1;

		setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	}
	return fd;
}

/* ------------------------------------------------------------ messages */

static loom_status send_reply(int fd, int kind, const void *payload, size_t len,
			      double deadline, char *err, size_t errlen)
{
	uint8_t head[LOOM_RDV_HEAD_BYTES];

	loom_rdv_encode_head((uint32_t)kind, (uint32_t)len, head);
	if (loom_sock_write(fd, head, sizeof(head), deadline, "rendezvous reply", err, errlen))
		return LOOM_ERR_IO;
	return loom_sock_write(fd, payload, len, deadline, "rendezvous reply", err, errlen);
}

static void peer_name(int fd, char *buf, size_t len)
{
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	char host[INET6_ADDRSTRLEN] = "?";
	int port = 0;

	if (getpeername(fd, (struct sockaddr *)&ss, &sl) == 0) {
		if (ss.ss_family == AF_INET) {
			struct sockaddr_in *a = (struct sockaddr_in *)&ss;

			inet_ntop(AF_INET, &a->sin_addr, host, sizeof(host));
			port = ntohs(a->sin_port);
		} else if (ss.ss_family == AF_INET6) {
			struct sockaddr_in6 *a = (struct sockaddr_in6 *)&ss;

			inet_ntop(AF_INET6, &a->sin6_addr, host, sizeof(host));
			port = ntohs(a->sin6_port);
		}
	}
	snprintf(buf, len, "%s:%d", host, port);
}

/* Rank 0's side: the hello of one connection, checked. */
static loom_status read_hello(loom_rdv *r, int fd, double deadline, loom_comm_peer *p,
			      char *err, size_t errlen)
{
	uint8_t m[LOOM_RDV_HELLO_BYTES];
	char who[128], from[96];
	loom_status st;

	peer_name(fd, from, sizeof(from));
	snprintf(who, sizeof(who), "rendezvous: hello from %s", from);
	st = loom_sock_read(fd, m, sizeof(m), deadline, who, err, errlen);
	if (st)
		return st;
	st = loom_rdv_decode_hello(m, r->world, from, p, err, errlen);
	if (st)
		return st;
	/* Where the others reach it: the address it came from. */
	snprintf(p->addr, sizeof(p->addr), "%s", from);
	*strrchr(p->addr, ':') = 0;
	return LOOM_OK;
}

static void tell_all(loom_rdv *r, const char *msg, double deadline)
{
	char ignore[64];
	int k;

	for (k = 1; k < r->world; k++)
		if (r->fds[k] >= 0)
			send_reply(r->fds[k], LOOM_RDV_REPLY_ERR, msg, strlen(msg), deadline, ignore,
				   sizeof(ignore));
}

static loom_status serve(loom_rdv *r, char *err, size_t errlen)
{
	double deadline = loom_comm_now() + r->timeout_s;
	int arrived = 1, k;
	uint8_t *payload = NULL;
	size_t plen;
	loom_status st;

	st = loom_sock_listen(r->master_port, &r->listen_fd, NULL, err, errlen);
	if (st) {
		char why[256];

		snprintf(why, sizeof(why), "%s", err);
		return loom_comm_errf(err, errlen, st, "rendezvous: rank 0 (MASTER_PORT): %s", why);
	}
	r->peers[0] = r->self;
	snprintf(r->peers[0].addr, LOOM_COMM_HOSTLEN, "%s", r->master_addr);

	while (arrived < r->world) {
		loom_comm_peer p;
		int fd;

		if (wait_fd(r->listen_fd, POLLIN, deadline) <= 0) {
			char missing[512];
			size_t n = 0;

			for (k = 1; k < r->world && n < sizeof(missing) - 16; k++)
				if (r->fds[k] < 0)
					n += snprintf(missing + n, sizeof(missing) - n, "%s%d",
						      n ? ", " : "", k);
			st = loom_comm_errf(err, errlen, LOOM_ERR_IO,
					    "rendezvous: rank%s %s did not arrive within %.1f s "
					    "(%d of %d ranks came)",
					    r->world - arrived > 1 ? "s" : "", missing, r->timeout_s,
					    arrived, r->world);
			goto out_tell;
		}
		fd = accept4(r->listen_fd, NULL, NULL, SOCK_CLOEXEC);
		if (fd < 0)
			continue;
		st = read_hello(r, fd, deadline, &p, err, errlen);
		if (!st && r->fds[p.rank] >= 0) {
			char a[96];

			peer_name(fd, a, sizeof(a));
			st = loom_comm_errf(err, errlen, LOOM_ERR_INVALID,
					    "rendezvous: rank %u arrived twice (pid %u on %s, then "
					    "pid %u from %s): check RANK",
					    p.rank, r->peers[p.rank].pid, r->peers[p.rank].host, p.pid, a);
		}
		if (st) {
			send_reply(fd, LOOM_RDV_REPLY_ERR, err, strlen(err), deadline, NULL, 0);
			close(fd);
			goto out_tell;
		}
		r->fds[p.rank] = fd;
		r->peers[p.rank] = p;
		arrived++;
	}

	plen = loom_rdv_welcome_bytes(r->world, r->blob_len);
	payload = malloc(plen);
	if (!payload) {
		st = loom_comm_errf(err, errlen, LOOM_ERR_NOMEM, "rendezvous: out of memory");
		goto out_tell;
	}
	loom_rdv_encode_welcome(r->world, r->blob, r->blob_len, r->peers, payload);
	for (k = 1; k < r->world; k++) {
		char who[64];

		snprintf(who, sizeof(who), "rendezvous: reply to rank %d", k);
		st = send_reply(r->fds[k], LOOM_RDV_REPLY_OK, payload, plen, deadline, err, errlen);
		if (st)
			goto out_tell;
	}
	free(payload);
	r->blob_out = malloc(r->blob_len ? r->blob_len : 1);
	if (!r->blob_out)
		return loom_comm_errf(err, errlen, LOOM_ERR_NOMEM, "rendezvous: out of memory");
	memcpy(r->blob_out, r->blob, r->blob_len);
	r->blob_out_len = r->blob_len;
	return LOOM_OK;

out_tell:
	free(payload);
	/* The deadline may be past: the verdict gets a second of its own. */
	tell_all(r, err, loom_comm_now() + 1.0);
	return st;
}

static loom_status join(loom_rdv *r, char *err, size_t errlen)
{
	double deadline = loom_comm_now() + r->timeout_s;
	uint8_t hello[LOOM_RDV_HELLO_BYTES], head[LOOM_RDV_HEAD_BYTES], *payload = NULL;
	char who[320];
	uint32_t kind, plen;
	loom_status st;
	int fd, last_errno = 0;

	snprintf(who, sizeof(who), "rendezvous: reply from rank 0 at %s:%d", r->master_addr,
		 r->master_port);
	/* Rank 0 may not listen yet: retry until the deadline. */
	for (;;) {
		fd = connect_once(r->master_addr, r->master_port, deadline);
		if (fd >= 0)
			break;
		last_errno = errno;
		if (loom_comm_now() >= deadline)
			return loom_comm_errf(err, errlen, LOOM_ERR_IO,
					      "rendezvous: rank %d could not reach rank 0 at "
					      "MASTER_ADDR=%s MASTER_PORT=%d within %.1f s (%s)",
					      r->rank, r->master_addr, r->master_port, r->timeout_s,
					      strerror(last_errno));
		loom_comm_backoff(1.0);
		usleep(20000);
	}
	r->fds[0] = fd;
	loom_rdv_encode_hello(&r->self, r->world, hello);
	st = loom_sock_write(fd, hello, sizeof(hello), deadline, "rendezvous: hello", err, errlen);
	if (st)
		return st;
	/* Rank 0 decides when its own deadline passes: wait a little longer
	 * than it, so that its verdict arrives rather than a timeout of ours. */
	deadline += 1.5;
	st = loom_sock_read(fd, head, sizeof(head), deadline, who, err, errlen);
	if (st)
		return st;
	st = loom_rdv_decode_head(head, r->world, who, &kind, &plen, err, errlen);
	if (st)
		return st;
	payload = malloc(plen ? plen : 1);
	if (!payload)
		return loom_comm_errf(err, errlen, LOOM_ERR_NOMEM, "rendezvous: out of memory");
	st = loom_sock_read(fd, payload, plen, deadline, who, err, errlen);
	if (!st)
		st = loom_rdv_decode_reply(payload, plen, kind, r->rank, r->world, who, r->peers,
					   &r->blob_out, &r->blob_out_len, err, errlen);
	free(payload);
	return st;
}

loom_status loom_rdv_run(loom_rdv *r, char *err, size_t errlen)
{
	int k;

	r->listen_fd = -1;
	r->blob_out = NULL;
	r->fds = malloc(sizeof(int) * (size_t)r->world);
	r->peers = calloc((size_t)r->world, sizeof(loom_comm_peer));
	if (!r->fds || !r->peers)
		return loom_comm_errf(err, errlen, LOOM_ERR_NOMEM, "rendezvous: out of memory");
	for (k = 0; k < r->world; k++)
		r->fds[k] = -1;
	if (r->blob_len > LOOM_RDV_MAX_BLOB)
		return loom_comm_errf(err, errlen, LOOM_ERR_INVALID,
				      "rendezvous: blob of %zu bytes is too large", r->blob_len);
	if (r->rank == 0)
		return serve(r, err, errlen);
	return join(r, err, errlen);
}

loom_status loom_rdv_send_go(loom_rdv *r, int to, char *err, size_t errlen)
{
	uint8_t m[LOOM_RDV_GO_BYTES];

	loom_rdv_encode_go(to, m);
	return loom_sock_write(r->fds[to], m, sizeof(m), loom_comm_now() + r->timeout_s,
			       "rendezvous: go", err, errlen);
}

loom_status loom_rdv_wait_go(loom_rdv *r, double timeout_s, char *err, size_t errlen)
{
	uint8_t m[LOOM_RDV_GO_BYTES];
	loom_status st;

	st = loom_sock_read(r->fds[0], m, sizeof(m), loom_comm_now() + timeout_s,
			    "rendezvous: waiting for rank 0's turn signal", err, errlen);
	if (st)
		return st;
	return loom_rdv_decode_go(m, r->rank, err, errlen);
}

void loom_rdv_close(loom_rdv *r)
{
	int k;

	if (r->fds)
		for (k = 0; k < r->world; k++)
			if (r->fds[k] >= 0)
				close(r->fds[k]);
	if (r->listen_fd >= 0)
		close(r->listen_fd);
	free(r->fds);
	free(r->peers);
	free(r->blob_out);
	r->fds = NULL;
	r->peers = NULL;
	r->blob_out = NULL;
	r->listen_fd = -1;
}

/* ------------------------------------------------------------ liveness */

int loom_pg_name_dead(loom_pg *pg, char *buf, size_t len)
{
	char gone[256] = "", unreach[256] = "";
	size_t ng = 0, nu = 0;
	int k, dead = 0;
	double deadline = loom_comm_now() + 1.0;

	for (k = 0; k < pg->info.world; k++) {
		const loom_comm_peer *p = &pg->peers[k];
		int fd, e;

		if (k == pg->info.rank || !p->probe_port)
			continue;
		fd = connect_once(p->addr, (int)p->probe_port, deadline);
		e = errno;
		if (fd >= 0) {
			close(fd);
			continue;
		}
		dead++;
		if (e == ECONNREFUSED)
			ng += snprintf(gone + ng, ng < sizeof(gone) ? sizeof(gone) - ng : 0, "%s%d",
				       ng ? ", " : "", k);
		else
			nu += snprintf(unreach + nu, nu < sizeof(unreach) ? sizeof(unreach) - nu : 0,
				       "%s%d", nu ? ", " : "", k);
	}
	if (!dead)
		snprintf(buf, len,
			 "every rank is alive: one is slower than the timeout or called "
			 "another collective");
	else
		snprintf(buf, len, "%s%s%s%s%s%s%s", ng ? (strchr(gone, ',') ? "ranks " : "rank ") : "",
			 gone,
			 ng ? (strchr(gone, ',') ? " died (their processes are gone)"
						 : " died (its process is gone)")
			    : "",
			 ng && nu ? "; " : "", nu ? (strchr(unreach, ',') ? "ranks " : "rank ") : "",
			 unreach, nu ? " unreachable (no answer to the probe in 1 s)" : "");
	return dead;
}
