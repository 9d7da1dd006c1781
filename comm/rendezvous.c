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
			return loom_errnf(err, errlen, LOOM_ERR_IO,
					      "%s: timed out after %zu of %zu bytes", who, got, n);
		k = recv(fd, (char *)buf + got, n - got, 0);
		if (k == 0)
			return loom_errnf(err, errlen, LOOM_ERR_FORMAT,
					      "%s: connection closed after %zu of %zu bytes "
					      "(truncated message)",
					      who, got, n);
		if (k < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return loom_errnf(err, errlen, LOOM_ERR_IO, "%s: %s after %zu of %zu bytes",
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
			return loom_errnf(err, errlen, LOOM_ERR_IO, "%s: write timed out", who);
		k = send(fd, (const char *)buf + put, n - put, MSG_NOSIGNAL);
		if (k < 0) {
			if (errno == EINTR || errno == EAGAIN)
				continue;
			return loom_errnf(err, errlen, LOOM_ERR_IO, "%s: %s", who,
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
		return loom_errnf(err, errlen, LOOM_ERR_IO, "socket: %s", strerror(errno));
	setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_port = htons((uint16_t)port);
	a.sin_addr.s_addr = htonl(INADDR_ANY);
	if (bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 128)) {
		int e = errno;

		close(s);
		return loom_errnf(err, errlen, LOOM_ERR_IO, "listen on port %d: %s", port,
				      strerror(e));
	}
	getsockname(s, (struct sockaddr *)&a, &alen);
	*fd = s;
	if (port_out)
		*port_out = ntohs(a.sin_port);
	return LOOM_OK;
}

/* One non-blocking connect to host:port, waiting until deadline. Returns the
 * socket, or -1 with errno (ECONNREFUSED for a port nobody listens on) and,
 * when why is given, the reason as text: the errno of the last address
 * tried, or the resolver's own failure for a name that does not resolve. */
static int connect_once(const char *host, int port, double deadline, char *why, size_t whylen)
{
	struct addrinfo hints, *res = NULL, *ai;
	char service[16];
	int fd = -1, gai;

	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	snprintf(service, sizeof(service), "%d", port);
	gai = getaddrinfo(host, service, &hints, &res);
	if (gai) {
		if (why)
			snprintf(why, whylen, "cannot resolve '%s': %s", host,
				 gai == EAI_SYSTEM ? strerror(errno) : gai_strerror(gai));
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
	} else if (why) {
		snprintf(why, whylen, "%s", strerror(errno));
	}
	return fd;
}

int loom_sock_connect(const char *host, int port, double deadline)
{
	return connect_once(host, port, deadline, NULL, 0);
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

/* ------------------------------------------------------------ rank 0 */

/* The first bytes a stranger sent, printable, for the line that drops it. */
static void show_bytes(const uint8_t *m, size_t n, char *out, size_t len)
{
	size_t i, o = 0;

	for (i = 0; i < n && i < 16 && o + 5 < len; i++) {
		int plain = m[i] >= 32 && m[i] < 127 && m[i] != '"' && m[i] != '\\';

		o += (size_t)snprintf(out + o, len - o, plain ? "%c" : "\\x%02x", m[i]);
	}
	out[o] = 0;
}

static void note_refusal(loom_rdv_srv *s, const char *why)
{
	size_t n = strlen(s->turned);

	s->refused++;
	if (n + 8 < sizeof(s->turned))
		snprintf(s->turned + n, sizeof(s->turned) - n, "%s%s", n ? "; " : "", why);
}

int loom_rdv_srv_judge(loom_rdv_srv *s, const uint8_t *m, size_t n, int ended,
		       const char *from, int *rank, char *why, size_t len)
{
	loom_comm_peer p;
	char shown[80], e[LOOM_COMM_ERRLEN];

	if (!loom_rdv_hello_could_be(m, n)) {
		show_bytes(m, n, shown, sizeof(shown));
		snprintf(why, len,
			 "rendezvous: rank 0 dropped a connection from %s: not a loom rank (it "
			 "sent \"%s\"%s)",
			 from, shown, n > 16 ? "..." : "");
		s->dropped++;
		return LOOM_RDV_DROP;
	}
	if (n < LOOM_RDV_HELLO_BYTES) {
		if (ended == LOOM_RDV_OPEN)
			return LOOM_RDV_MORE;
		if (n == 0)
			snprintf(why, len,
				 "rendezvous: rank 0 dropped a connection from %s: it %s without "
				 "a word",
				 from,
				 ended == LOOM_RDV_CLOSED ? "closed" : "stayed silent");
		else
			snprintf(why, len,
				 "rendezvous: rank 0 dropped a connection from %s: %zu of %d bytes "
				 "of a hello, then it %s",
				 from, n, LOOM_RDV_HELLO_BYTES,
				 ended == LOOM_RDV_CLOSED ? "closed (truncated message)"
							  : "stalled");
		s->dropped++;
		return LOOM_RDV_DROP;
	}
	if (loom_rdv_decode_hello(m, s->world, from, &p, e, sizeof(e))) {
		snprintf(why, len, "%s", e);
		note_refusal(s, why);
		return LOOM_RDV_REFUSE;
	}
	if (s->peers[p.rank].pid) {
		const loom_comm_peer *q = &s->peers[p.rank];

		snprintf(why, len,
			 "rendezvous: rank %u is already in the group (pid %u on %s, from %s); "
			 "pid %u on %s (%s) claims it too: check RANK",
			 p.rank, q->pid, q->host, q->addr, p.pid, p.host, from);
		note_refusal(s, why);
		return LOOM_RDV_REFUSE;
	}
	/* Where the others reach it: the address it came from. */
	snprintf(p.addr, sizeof(p.addr), "%s", from);
	if (strrchr(p.addr, ':'))
		*strrchr(p.addr, ':') = 0;
	if (!p.pid)
		p.pid = 1; /* pid 0 marks a free slot */
	s->peers[p.rank] = p;
	s->arrived++;
	*rank = (int)p.rank;
	return LOOM_RDV_TAKE;
}

/* One connection whose hello has not come in full. */
typedef struct rdv_conn {
	int fd;
	size_t got;
	double deadline;
	char from[96];
	uint8_t m[LOOM_RDV_HELLO_BYTES];
} rdv_conn;

#define RDV_MAX_CONNS 64
#define RDV_MAX_LOG_LINES 32

/* Rank 0 says what it turned away, one line each (a port scanner could
 * make thousands: the first RDV_MAX_LOG_LINES only). */
static void log_turned(const loom_rdv_srv *s, const char *why)
{
	int n = s->dropped + s->refused;

	if (n <= RDV_MAX_LOG_LINES)
		loom_log("%s%s\n", why, n == RDV_MAX_LOG_LINES ? " (no more such lines)" : "");
}

/* Reads what connection c has sent, judges it and acts on the verdict:
 * 1 when c is done with (taken, dropped or refused), 0 while its hello is
 * still coming. `ended` forces a verdict on what came so far. */
static int serve_conn(loom_rdv *r, rdv_conn *c, int ended, double now)
{
	char why[LOOM_COMM_ERRLEN];
	int rank = -1, v;

	if (!ended) {
		ssize_t k = recv(c->fd, c->m + c->got, sizeof(c->m) - c->got, MSG_DONTWAIT);

		if (k == 0 || (k < 0 && errno != EAGAIN && errno != EINTR))
			ended = LOOM_RDV_CLOSED;
		else if (k > 0)
			c->got += (size_t)k;
		if (!ended && now >= c->deadline)
			ended = LOOM_RDV_STALLED;
	}
	v = loom_rdv_srv_judge(&r->srv, c->m, c->got, ended, c->from, &rank, why, sizeof(why));
	switch (v) {
	case LOOM_RDV_MORE:
		return 0;
	case LOOM_RDV_TAKE:
		r->fds[rank] = c->fd;
		return 1;
	case LOOM_RDV_REFUSE:
		log_turned(&r->srv, why);
		send_reply(c->fd, LOOM_RDV_REPLY_ERR, why, strlen(why), now + 1.0, NULL, 0);
		break;
	default:
		log_turned(&r->srv, why);
		break;
	}
	close(c->fd);
	return 1;
}

/* A verdict on c now: what it sent so far is read first (a hello that
 * came is judged as such; a connection closed with unread bytes would
 * reset the peer), then whatever is still missing counts as stalled. */
static void settle_conn(loom_rdv *r, rdv_conn *c)
{
	if (!serve_conn(r, c, LOOM_RDV_OPEN, loom_comm_now()))
		serve_conn(r, c, LOOM_RDV_STALLED, loom_comm_now());
}

static void accept_conn(loom_rdv *r, rdv_conn *conns, int *n, double now, int max)
{
	int fd = accept4(r->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK), k, old = 0;

	if (fd < 0)
		return;
	if (*n == max) {
		/* Full of silent strangers: the oldest makes room. */
		for (k = 1; k < *n; k++)
			if (conns[k].deadline < conns[old].deadline)
				old = k;
		serve_conn(r, &conns[old], LOOM_RDV_STALLED, now);
		conns[old] = conns[--*n];
	}
	memset(&conns[*n], 0, sizeof(conns[*n]));
	conns[*n].fd = fd;
	conns[*n].deadline = now + LOOM_RDV_HELLO_TIMEOUT_S;
	peer_name(fd, conns[*n].from, sizeof(conns[*n].from));
	++*n;
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

static loom_status missing_ranks(loom_rdv *r, char *err, size_t errlen)
{
	char missing[512], dropped[64] = "";
	size_t m = 0;
	int k;

	for (k = 1; k < r->world && m < sizeof(missing) - 16; k++)
		if (r->fds[k] < 0)
			m += (size_t)snprintf(missing + m, sizeof(missing) - m, "%s%d", m ? ", " : "", k);
	if (r->srv.dropped)
		snprintf(dropped, sizeof(dropped), "; %d other connection%s dropped", r->srv.dropped,
			 r->srv.dropped > 1 ? "s" : "");
	return loom_errnf(err, errlen, LOOM_ERR_IO,
			      "rendezvous: rank%s %s did not arrive within %.1f s (%d of %d ranks "
			      "came%s%s%s)",
			      r->world - r->srv.arrived > 1 ? "s" : "", missing, r->timeout_s,
			      r->srv.arrived, r->world, dropped, r->srv.refused ? "; refused: " : "",
			      r->srv.turned);
}

/* Accepts and judges connections until every rank came or the deadline
 * passed; a connection whose hello is late holds nobody else. */
static loom_status wait_for_ranks(loom_rdv *r, double deadline, char *err, size_t errlen)
{
	rdv_conn *conns = calloc(RDV_MAX_CONNS, sizeof(*conns));
	struct pollfd *pf = calloc(RDV_MAX_CONNS + 1, sizeof(*pf));
	loom_status st = LOOM_OK;
	int n = 0, k;

	if (!conns || !pf) {
		st = loom_errnf(err, errlen, LOOM_ERR_NOMEM, "rendezvous: out of memory");
		goto out;
	}
	while (r->srv.arrived < r->world) {
		double now = loom_comm_now(), wake = deadline;

		if (now >= deadline) {
			st = missing_ranks(r, err, errlen);
			goto out;
		}
		pf[0].fd = r->listen_fd;
		pf[0].events = POLLIN;
		for (k = 0; k < n; k++) {
			pf[k + 1].fd = conns[k].fd;
			pf[k + 1].events = POLLIN;
			pf[k + 1].revents = 0;
			if (conns[k].deadline < wake)
				wake = conns[k].deadline;
		}
		if (poll(pf, (nfds_t)n + 1, (int)((wake - now) * 1000) + 1) < 0 && errno != EINTR) {
			st = loom_errnf(err, errlen, LOOM_ERR_IO, "rendezvous: poll: %s",
					    strerror(errno));
			goto out;
		}
		now = loom_comm_now();
		for (k = n - 1; k >= 0; k--)
			if ((pf[k + 1].revents || now >= conns[k].deadline) &&
			    serve_conn(r, &conns[k], LOOM_RDV_OPEN, now))
				conns[k] = conns[--n];
		if (pf[0].revents & POLLIN)
			accept_conn(r, conns, &n, now, RDV_MAX_CONNS);
	}
out:
	/* The group is complete, but what was accepted with its last rank may
	 * not have been read: a second RANK=1 among them must hear why it
	 * cannot join (closed unread, it would get a reset instead). What came
	 * is judged now (half a hello: a stranger, stalled); a connection that
	 * sent nothing yet keeps its own deadline in loom_rdv_keep's poll, or
	 * loom_rdv_close judges it. */
	for (k = n - 1; !st && k >= 0; k--)
		if (serve_conn(r, &conns[k], LOOM_RDV_OPEN, loom_comm_now()) ||
		    (conns[k].got && serve_conn(r, &conns[k], LOOM_RDV_STALLED, loom_comm_now())))
			conns[k] = conns[--n];
	if (!st && n) {
		r->pending = conns;
		r->n_pending = n;
		conns = NULL;
	}
	for (k = 0; conns && k < n; k++)
		settle_conn(r, &conns[k]);
	free(conns);
	free(pf);
	return st;
}

static loom_status serve(loom_rdv *r, char *err, size_t errlen)
{
	uint8_t *payload = NULL;
	size_t plen;
	loom_status st;
	int k;

	st = r->listen_given ? LOOM_OK
			     : loom_sock_listen(r->master_port, &r->listen_fd, NULL, err, errlen);
	if (st) {
		char why[256];

		snprintf(why, sizeof(why), "%s", err);
		return loom_errnf(err, errlen, st, "rendezvous: rank 0 (MASTER_PORT): %s", why);
	}
	/* A client gone between poll and accept must not block rank 0. */
	fcntl(r->listen_fd, F_SETFL, fcntl(r->listen_fd, F_GETFL) | O_NONBLOCK);
	r->peers[0] = r->self;
	snprintf(r->peers[0].addr, LOOM_COMM_HOSTLEN, "%s", r->master_addr);
	if (!r->peers[0].pid)
		r->peers[0].pid = 1;
	r->srv.world = r->world;
	r->srv.peers = r->peers;
	r->srv.arrived = 1;

	st = wait_for_ranks(r, loom_comm_now() + r->timeout_s, err, errlen);
	if (st)
		goto out_tell;

	plen = loom_rdv_welcome_bytes(r->world, r->blob_len);
	payload = malloc(plen);
	if (!payload) {
		st = loom_errnf(err, errlen, LOOM_ERR_NOMEM, "rendezvous: out of memory");
		goto out_tell;
	}
	loom_rdv_encode_welcome(r->world, r->blob, r->blob_len, r->peers, payload);
	for (k = 1; k < r->world; k++) {
		st = send_reply(r->fds[k], LOOM_RDV_REPLY_OK, payload, plen,
				loom_comm_now() + LOOM_RDV_HELLO_TIMEOUT_S, err, errlen);
		if (st)
			goto out_tell;
	}
	free(payload);
	r->blob_out = malloc(r->blob_len ? r->blob_len : 1);
	if (!r->blob_out)
		return loom_errnf(err, errlen, LOOM_ERR_NOMEM, "rendezvous: out of memory");
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
	/* Rank 0 reports a rank that does not come; this side only waits. It
	 * waits longer than rank 0 would (twice and more: rank 0 may start its
	 * name server and MPI before it listens, slowly on a loaded machine),
	 * so that the verdict comes from rank 0, whatever the machine's load. */
	double window = 2 * r->timeout_s + 1.5, deadline = loom_comm_now() + window;
	uint8_t hello[LOOM_RDV_HELLO_BYTES], head[LOOM_RDV_HEAD_BYTES], *payload = NULL;
	char who[320], why[256] = "";
	uint32_t kind, plen;
	loom_status st;
	int fd;

	snprintf(who, sizeof(who), "rendezvous: reply from rank 0 at %s:%d", r->master_addr,
		 r->master_port);
	/* Rank 0 may not listen yet: retry until the deadline. */
	for (;;) {
		/* Each attempt gets a second of its own past the deadline, so that
		 * the last one ends with its real reason (refused, unreachable),
		 * not a timeout the deadline made. */
		double now = loom_comm_now();

		fd = connect_once(r->master_addr, r->master_port,
				  deadline > now + 1.0 ? deadline : now + 1.0, why, sizeof(why));
		if (fd >= 0)
			break;
		if (loom_comm_now() >= deadline)
			return loom_errnf(err, errlen, LOOM_ERR_IO,
					      "rendezvous: rank %d could not reach rank 0 at "
					      "MASTER_ADDR=%s MASTER_PORT=%d within %.1f s (%s)",
					      r->rank, r->master_addr, r->master_port, window, why);
		loom_comm_backoff(1.0);
		usleep(20000);
	}
	r->fds[0] = fd;
	loom_rdv_encode_hello(&r->self, r->world, hello);
	st = loom_sock_write(fd, hello, sizeof(hello), deadline, "rendezvous: hello", err, errlen);
	if (st)
		return st;
	/* Rank 0 decides when its own deadline passes, which began when it
	 * started (perhaps well after us, on a loaded machine): wait twice as
	 * long and more, so that its verdict arrives rather than a timeout of
	 * ours. */
	deadline = loom_comm_now() + window;
	/* Not a byte in all that time: whatever accepted the connection is not
	 * a loom rank 0 deciding (it answers within its own deadline), most
	 * likely another program on MASTER_PORT. Say so, rather than blame
	 * rank 0. */
	if (wait_fd(fd, POLLIN, deadline) <= 0)
		return loom_errnf(err, errlen, LOOM_ERR_IO,
				      "rendezvous: rank %d: whatever listens at MASTER_ADDR=%s "
				      "MASTER_PORT=%d accepted the connection but sent nothing in "
				      "%.1f s: another program holds that port, or rank 0 is stuck",
				      r->rank, r->master_addr, r->master_port, window);
	st = loom_sock_read(fd, head, sizeof(head), deadline, who, err, errlen);
	if (st)
		return st;
	st = loom_rdv_decode_head(head, r->world, who, &kind, &plen, err, errlen);
	if (st)
		return st;
	payload = malloc(plen ? plen : 1);
	if (!payload)
		return loom_errnf(err, errlen, LOOM_ERR_NOMEM, "rendezvous: out of memory");
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

	if (!r->listen_given)
		r->listen_fd = -1;
	r->blob_out = NULL;
	r->pending = NULL;
	r->n_pending = 0;
	memset(&r->srv, 0, sizeof(r->srv));
	r->fds = malloc(sizeof(int) * (size_t)r->world);
	r->peers = calloc((size_t)r->world, sizeof(loom_comm_peer));
	if (!r->fds || !r->peers)
		return loom_errnf(err, errlen, LOOM_ERR_NOMEM, "rendezvous: out of memory");
	for (k = 0; k < r->world; k++)
		r->fds[k] = -1;
	if (r->blob_len > LOOM_RDV_MAX_BLOB)
		return loom_errnf(err, errlen, LOOM_ERR_INVALID,
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

/* Rank 0, closing: waits up to half a second for c's hello, then judges
 * it (a second RANK=1 is told why it cannot join rather than reset). */
static void judge_soon(loom_rdv *r, rdv_conn *c)
{
	double soon = loom_comm_now() + 0.5;

	if (c->deadline > soon)
		c->deadline = soon;
	while (!serve_conn(r, c, LOOM_RDV_OPEN, loom_comm_now()))
		wait_fd(c->fd, POLLIN, c->deadline);
}

/* Rank 0, the group formed: a process that connects now (a second RANK=1
 * started a moment late) is told why it cannot join rather than reset. */
static void refuse_latecomers(loom_rdv *r)
{
	rdv_conn c;
	int k;

	for (k = 0; k < 16; k++) {
		int fd = accept4(r->listen_fd, NULL, NULL, SOCK_CLOEXEC | SOCK_NONBLOCK);

		if (fd < 0)
			return;
		memset(&c, 0, sizeof(c));
		c.fd = fd;
		c.deadline = loom_comm_now() + 0.5;
		peer_name(fd, c.from, sizeof(c.from));
		judge_soon(r, &c);
	}
}

/* Rank 0 keeps MASTER_PORT for the group's life, as a TCP store does, so
 * that a process that comes after the group formed (a second RANK=1
 * started late) is told why it cannot join rather than finding no
 * listener ("Connection refused" until its timeout). Polled without
 * blocking, at most every 0.1 s, from loom_pg_set_step and on entry to
 * every collective: each connection's hello gets its own deadline across
 * polls, as at start-up. */
#define RDV_LATE_CONNS 8

struct loom_rdv_late {
	loom_rdv r; /* listen_fd and srv (every slot taken); fds unused */
	rdv_conn conns[RDV_LATE_CONNS];
	int n;
	double polled; /* when last polled: at most every 0.1 s */
};

loom_rdv_late *loom_rdv_keep(loom_rdv *r)
{
	loom_rdv_late *l;
	int k;

	if (r->rank != 0 || r->listen_fd < 0 || r->srv.arrived != r->world)
		return NULL;
	l = calloc(1, sizeof(*l));
	if (!l)
		return NULL;
	l->r.rank = 0;
	l->r.world = r->world;
	l->r.listen_fd = r->listen_fd;
	l->r.srv = r->srv;
	l->r.srv.peers = malloc(sizeof(loom_comm_peer) * (size_t)r->world);
	if (!l->r.srv.peers) {
		free(l);
		return NULL;
	}
	memcpy(l->r.srv.peers, r->srv.peers, sizeof(loom_comm_peer) * (size_t)r->world);
	/* What came with the last rank and sent nothing yet is judged by the
	 * polls, each by its own deadline (beyond their room, at once). */
	for (k = 0; k < r->n_pending; k++)
		if (l->n < RDV_LATE_CONNS)
			l->conns[l->n++] = r->pending[k];
		else
			settle_conn(&l->r, &r->pending[k]);
	free(r->pending);
	r->pending = NULL;
	r->n_pending = 0;
	r->listen_fd = -1; /* the group's now: loom_rdv_close leaves it open */
	return l;
}

void loom_rdv_late_poll(loom_rdv_late *l)
{
	double now;
	int k;

	if (!l || (now = loom_comm_now()) < l->polled + 0.1)
		return;
	l->polled = now;
	for (k = l->n - 1; k >= 0; k--)
		if (serve_conn(&l->r, &l->conns[k], LOOM_RDV_OPEN, now))
			l->conns[k] = l->conns[--l->n];
	for (k = 0; k < RDV_LATE_CONNS; k++) {
		int before = l->n;

		accept_conn(&l->r, l->conns, &l->n, now, RDV_LATE_CONNS);
		if (l->n == before)
			break;
		/* Its hello is usually in already: judge it now. */
		if (serve_conn(&l->r, &l->conns[l->n - 1], LOOM_RDV_OPEN, now))
			l->n--;
	}
}

void loom_rdv_late_free(loom_rdv_late *l)
{
	int k;

	if (!l)
		return;
	l->polled = 0;
	loom_rdv_late_poll(l);
	/* Each still open gets its verdict and its line, as at start-up. */
	for (k = 0; k < l->n; k++)
		settle_conn(&l->r, &l->conns[k]);
	close(l->r.listen_fd);
	free(l->r.srv.peers);
	free(l);
}

void loom_rdv_close(loom_rdv *r)
{
	int k;

	for (k = 0; k < r->n_pending; k++)
		judge_soon(r, &r->pending[k]);
	free(r->pending);
	r->pending = NULL;
	r->n_pending = 0;
	if (r->rank == 0 && r->listen_fd >= 0 && r->srv.peers && r->srv.arrived == r->world)
		refuse_latecomers(r);

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
	char gone[256] = "", unreach[256] = "", who[LOOM_PG_NOTE_BYTES + 16];
	size_t ng = 0, nu = 0;
	int k, n_gone = 0, n_unreach = 0;
	double deadline = loom_comm_now() + 1.0;

	for (k = 0; k < pg->info.world; k++) {
		const loom_comm_peer *p = &pg->peers[k];
		int fd, e;

		if (k == pg->info.rank || !p->probe_port)
			continue;
		fd = connect_once(p->addr, (int)p->probe_port, deadline, NULL, 0);
		e = errno;
		if (fd >= 0) {
			close(fd);
			continue;
		}
		loom_pg_rank_name(pg, k, who, sizeof(who));
		if (e == ECONNREFUSED)
			ng += snprintf(gone + ng, ng < sizeof(gone) ? sizeof(gone) - ng : 0, "%s%s",
				       n_gone++ ? ", " : "", who);
		else
			nu += snprintf(unreach + nu, nu < sizeof(unreach) ? sizeof(unreach) - nu : 0,
				       "%s%s", n_unreach++ ? ", " : "", who);
	}
	if (!n_gone && !n_unreach)
		snprintf(buf, len,
			 "every rank is alive: one is slower than the timeout or called "
			 "another collective");
	else
		snprintf(buf, len, "%s%s%s%s%s%s%s",
			 n_gone ? (n_gone > 1 ? "ranks " : "rank ") : "", gone,
			 n_gone ? (n_gone > 1 ? " died (their processes are gone)"
					      : " died (its process is gone)")
				: "",
			 n_gone && n_unreach ? "; " : "",
			 n_unreach ? (n_unreach > 1 ? "ranks " : "rank ") : "", unreach,
			 n_unreach ? " unreachable (no answer to the probe in 1 s)" : "");
	return n_gone + n_unreach;
}

int loom_pg_name_culprit(loom_pg *pg, uint64_t seq, char *buf, size_t len)
{
	int dead = loom_pg_name_dead(pg, buf, len);
	char behind[512];

	/* Into a buffer of its own: when no peer is found behind, buf keeps
	 * "every rank is alive: ..." rather than an empty reason. */
	if (!dead && loom_progress_laggards(pg, seq, behind, sizeof(behind)))
		snprintf(buf, len, "%s", behind);
	return dead;
}
