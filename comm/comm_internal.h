/*
 * comm/comm_internal.h — what the files of comm/ share and the tests reach
 * into: the process group's insides, the strict environment parser, the
 * start-up rendezvous and the liveness probe that names a dead rank. No MPI
 * or CUDA type appears here, so the NCCL file (C++ under nvcc) includes it.
 */
#ifndef LOOM_COMM_INTERNAL_H
#define LOOM_COMM_INTERNAL_H

#include <stdarg.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>

#include "base/errf.h"
#include "comm/comm.h"
#include "comm/wire.h" /* the rendezvous messages, the fingerprint record */

#ifdef __cplusplus
extern "C" {
#endif

#define LOOM_COMM_ERRLEN 1024
#define LOOM_COMM_NCCL_ID_BYTES 128 /* sizeof(ncclUniqueId) */

/* ----------------------------------------------------------------- errors */

/* Records a failure in the group's error object (loom_pg_error); returns st. */
loom_status loom_pg_fail(loom_pg *pg, loom_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));
/* Marks c broken and records the message; returns st. */
loom_status loom_comm_fail(loom_comm *c, loom_status st, const char *fmt, ...)
	__attribute__((format(printf, 3, 4)));

/* A communicator for pg's rank on a backend's table and context: LOOM_OK,
 * or LOOM_ERR_NOMEM with pg's message (*out untouched). */
loom_status loom_comm_new_on(loom_pg *pg, const loom_comm_i *iface, void *ctx, loom_comm **out);

/* Monotonic seconds. */
double loom_comm_now(void);
/* Sleeps a little while polling: short at first, longer as waiting drags on
 * (a spinning rank would steal the core its peer needs on a small host). */
void loom_comm_backoff(double waited_s);

/* ------------------------------------------------------------ environment */

/* torchrun's env:// variables, parsed and checked. */
typedef struct loom_comm_env {
	int rank, world;
	int local_rank, local_world; /* -1 when unset: the rendezvous derives them */
	int group_rank, group_world; /* torchrun's node index and count; -1 when unset */
	char master_addr[256];
	int master_port;
	int agent_store; /* TORCHELASTIC_USE_AGENT_STORE=True: MASTER_PORT is torchrun's store */
	int restart;     /* TORCHELASTIC_RESTART_COUNT, 0 when unset */
	int slurm;       /* read from srun's SLURM_* variables */
} loom_comm_env;

/* Parses RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE, MASTER_ADDR,
 * MASTER_PORT through getenv, and torchrun's GROUP_RANK, GROUP_WORLD_SIZE,
 * TORCHELASTIC_USE_AGENT_STORE and TORCHELASTIC_RESTART_COUNT when set. A
 * missing required or malformed value is LOOM_ERR_INVALID naming the
 * variable and its text. */
loom_status loom_comm_env_parse(loom_comm_env *e, char *err, size_t errlen);
/* Whether srun started this process: SLURM_PROCID and SLURM_STEP_NODELIST
 * set (a batch script has no step node list; it is not a rank). */
int loom_comm_env_is_slurm(void);
/* srun's variables: RANK from SLURM_PROCID, WORLD from SLURM_NTASKS, the
 * local rank from SLURM_LOCALID (the local world is counted by host name
 * at the rendezvous), the node from SLURM_NODEID and SLURM_NNODES; the
 * rendezvous on MASTER_ADDR when set, else the first host of
 * SLURM_STEP_NODELIST; on MASTER_PORT when set, else a port made from
 * SLURM_JOB_ID and SLURM_STEP_ID (loom_comm_slurm_port), so that two
 * jobs, or two steps, sharing a node do not meet. */
loom_status loom_comm_env_parse_slurm(loom_comm_env *e, char *err, size_t errlen);
int loom_comm_slurm_port(unsigned long job, unsigned long step);
/*
 * Slurm's compressed host lists ("node[01-04,07],gpu3,rack[1-2]-n[1-2]"):
 * names separated by commas outside brackets, each bracket a list of
 * numbers and ranges whose lower bound's digits give the width (01-04 is
 * 01 02 03 04); several brackets in one name multiply. The count of hosts
 * (-1 when malformed, with why in err), and host number `index` into out.
 */
long loom_slurm_hostlist_count(const char *list, char *err, size_t errlen);
loom_status loom_slurm_hostlist_nth(const char *list, long index, char *out, size_t len,
				    char *err, size_t errlen);
/* Open MPI's OMPI_COMM_WORLD_{RANK,SIZE,LOCAL_RANK,LOCAL_SIZE}; *present = 0
 * when the process was not started by mpirun. */
loom_status loom_comm_env_parse_ompi(loom_comm_env *e, int *present, char *err,
				     size_t errlen);
/* A strict non-negative decimal int within [lo, hi]: "", "1x", "-1", " 2",
 * "99999999999" all fail. */
loom_status loom_comm_parse_int(const char *name, const char *text, int lo, int hi, int *out,
				char *err, size_t errlen);
/* LOOM_COMM_TIMEOUT_S, if set: a positive number of seconds. */
loom_status loom_comm_env_timeout(double *out, int *present, char *err, size_t errlen);
/* The CUDA device a rank with this local rank uses when the host shows it
 * `visible` devices: local_rank itself when there are that many, else
 * local_rank % visible (device 0 where a launcher gives each rank its own
 * CUDA_VISIBLE_DEVICES), with a sentence saying so in note (else note is
 * ""). -1 when no device is visible. */
int loom_comm_pick_device(int local_rank, int visible, char *note, size_t notelen);

/* ------------------------------------------------------------- rendezvous */

/*
 * Rank 0's side of the rendezvous apart from its sockets (tests/fuzz drives
 * it): what it makes of the bytes each connection sent. Anything may
 * connect to MASTER_PORT (a port scanner, a health check, a second job), so
 * a bad connection is turned away with one line and the group keeps waiting
 * for the real ranks until its own deadline, as a TCP store does.
 */
#define LOOM_RDV_HELLO_TIMEOUT_S 5.0 /* each connection's own deadline for its hello */
#define LOOM_RDV_TURNED_LEN 512

typedef struct loom_rdv_srv {
	int world;
	loom_comm_peer *peers; /* world entries; [0] rank 0 itself */
	int arrived;           /* ranks taken, rank 0 included */
	int dropped, refused;  /* connections turned away */
	char turned[LOOM_RDV_TURNED_LEN]; /* the refusals, for the timeout's message */
} loom_rdv_srv;

/* How the bytes of one connection were judged. */
enum {
	LOOM_RDV_MORE,   /* a hello so far: wait for the rest */
	LOOM_RDV_TAKE,   /* a rank of the group: *rank and peers[*rank] filled */
	LOOM_RDV_DROP,   /* not a loom rank, or half a message: close it */
	LOOM_RDV_REFUSE, /* a loom rank in error (another world size or version, a
			    rank out of range or already taken): send why, close */
};
/* Connection states for loom_rdv_srv_judge's `ended`. */
enum { LOOM_RDV_OPEN, LOOM_RDV_CLOSED, LOOM_RDV_STALLED };

/* Judges the first n (<= LOOM_RDV_HELLO_BYTES) bytes a connection from
 * `from` ("address:port") sent; `ended` says whether it closed or its hello
 * deadline passed. On DROP and REFUSE, why holds one line naming `from`
 * (and for REFUSE the reply to send). */
int loom_rdv_srv_judge(loom_rdv_srv *s, const uint8_t *m, size_t n, int ended,
		       const char *from, int *rank, char *why, size_t len);

typedef struct loom_rdv {
	/* in */
	int rank, world;
	const char *master_addr;
	int master_port;
	double timeout_s;
	loom_comm_peer self;
	const void *blob; /* rank 0: handed to every rank */
	size_t blob_len;
	/* out */
	void *blob_out; /* every rank: rank 0's blob (malloc'd) */
	size_t blob_out_len;
	loom_comm_peer *peers; /* world entries, by rank */
	/* rank 0: a socket per rank (kept for the ordered MPI join); others: [0] */
	int *fds;
	int listen_fd;
	int listen_given; /* rank 0: listen_fd already listens (a port the store announced) */
	loom_rdv_srv srv; /* rank 0 */
	/* rank 0: connections accepted in the pass that completed the group,
	 * their hello not yet read (a second RANK=1 among them): judged later,
	 * by loom_rdv_keep's poll or by loom_rdv_close, never closed unread */
	struct rdv_conn *pending;
	int n_pending;
} loom_rdv;

/* Rank 0 listens on master_port and waits (timeout_s) for every other rank's
 * hello; every other rank connects (retrying until the deadline). Rank 0
 * turns away what is not a rank of this group (loom_rdv_srv_judge) and keeps
 * waiting; when a rank does not come, its timeout names the missing ranks and
 * what was refused, and passes that verdict to every rank that arrived. */
loom_status loom_rdv_run(loom_rdv *r, char *err, size_t errlen);
/* The ordered join: rank 0 tells rank k it may connect now; rank k waits. */
loom_status loom_rdv_send_go(loom_rdv *r, int to, char *err, size_t errlen);
loom_status loom_rdv_wait_go(loom_rdv *r, double timeout_s, char *err, size_t errlen);
/* Rank 0 first answers the connections still queued (a rank that claims an
 * existing rank after the group formed is told so), then closes. */
void loom_rdv_close(loom_rdv *r);
/* Rank 0, the group formed: keeps MASTER_PORT open for the group's life
 * (call before loom_rdv_close; NULL elsewhere or when out of memory), so
 * that a process connecting later is told why it cannot join ("rank 1 is
 * already in the group ...; pid 815 on node-b claims it too") and a
 * stranger is dropped with a line, as at start-up. _poll never blocks
 * (loom_pg_set_step and every collective call it; it acts at most every
 * 0.1 s); _free answers what is queued and closes. */
typedef struct loom_rdv_late loom_rdv_late;
loom_rdv_late *loom_rdv_keep(loom_rdv *r);
void loom_rdv_late_poll(loom_rdv_late *l);
void loom_rdv_late_free(loom_rdv_late *l);

/* Socket helpers with deadlines (absolute, loom_comm_now()). Reads fail
 * with a message saying how many of how many bytes came. */
loom_status loom_sock_read(int fd, void *buf, size_t n, double deadline, const char *who,
			   char *err, size_t errlen);
loom_status loom_sock_write(int fd, const void *buf, size_t n, double deadline,
			    const char *who, char *err, size_t errlen);
/* A listening TCP socket on port (0: any), all interfaces; *port_out gets it. */
loom_status loom_sock_listen(int port, int *fd, int *port_out, char *err, size_t errlen);
/* One non-blocking TCP connect to host:port by deadline: the socket
 * (non-blocking, TCP_NODELAY) or -1 with errno. */
int loom_sock_connect(const char *host, int port, double deadline);

/* ------------------------------------------------------------ torchrun's store */

/* comm/store.c: a client of PyTorch's TCPStore protocol (see there), for
 * the store torchrun's agent keeps on MASTER_PORT. */
enum {
	LOOM_STORE_VALIDATE = 0,
	LOOM_STORE_SET = 1,
	LOOM_STORE_GET = 3,
	LOOM_STORE_WAIT = 6,
	LOOM_STORE_CANCEL_WAIT = 12,
	LOOM_STORE_PING = 13,
};
#define LOOM_STORE_VALIDATION_MAGIC 0x3C85F7CEu
#define LOOM_STORE_STOP_WAITING 0
#define LOOM_STORE_MAX_VALUE 256 /* rank 0's address: "loom1 HOST PORT" */
#define LOOM_STORE_ADDR_TAG "loom1 "

typedef struct loom_store {
	int fd;
	char host[256];
	int port;
	double deadline; /* every read and write by then */
} loom_store;

/* Encoders into out (room for 1 + 16 + the strings): the bytes written,
 * 0 when they do not fit in cap. */
size_t loom_store_encode_u32(int cmd, uint32_t v, uint8_t *out); /* VALIDATE, PING */
size_t loom_store_encode_set(const char *key, const void *val, size_t len, uint8_t *out,
			     size_t cap);
size_t loom_store_encode_key(int cmd, const char *key, uint8_t *out, size_t cap); /* GET, WAIT */
uint64_t loom_store_get_u64(const uint8_t *p);
uint32_t loom_store_get_u32(const uint8_t *p);
/* A GET's length prefix: more than cap is LOOM_ERR_FORMAT naming key. */
loom_status loom_store_decode_len(const uint8_t m[8], size_t cap, const char *key,
				  size_t *len, char *err, size_t errlen);
/* Rank 0's address as published ("loom1 HOST PORT"); the length, 0 when
 * it does not fit. The parser is strict: the tag, a host of letters,
 * digits and . - _ : %, one space, a port in 1..65535, nothing more. */
size_t loom_store_format_addr(const char *host, int port, char *out, size_t cap);
loom_status loom_store_parse_addr(const uint8_t *v, size_t n, char *host, size_t hostcap,
				  int *port, char *err, size_t errlen);
/* Connects (retrying until deadline), validates and pings. */
loom_status loom_store_open(loom_store *s, const char *host, int port, double deadline,
			    char *err, size_t errlen);
/* SET, confirmed by a ping's round trip. */
loom_status loom_store_set(loom_store *s, const char *key, const void *val, size_t len,
			   char *err, size_t errlen);
/* WAIT for key until the deadline, then GET it (at most cap bytes). */
loom_status loom_store_wait_get(loom_store *s, const char *key, void *val, size_t cap,
				size_t *len, char *err, size_t errlen);
void loom_store_close(loom_store *s);
/* The key rank 0's address goes under: "/worker/attempt_<restart>/loom_rank0_addr". */
void loom_store_key(const loom_comm_env *e, char *key, size_t len);
/* The rendezvous's meeting point through the store at MASTER_ADDR:PORT:
 * rank 0 opens its listener on a free port (r->listen_fd, listen_given)
 * and publishes "loom1 ADDR PORT" (ADDR: its side of the connection to
 * the store); the others wait up to timeout_s for it. On success
 * r->master_addr points at addr (addrlen bytes, the caller's) and
 * r->master_port is rank 0's port. */
loom_status loom_store_rendezvous(const loom_comm_env *e, loom_rdv *r, char *addr,
				  size_t addrlen, double timeout_s, char *err, size_t errlen);

/* ------------------------------------------------------------ torchrun's error file */

/* comm/errfile.c: the JSON torchrun's agent reads from
 * TORCHELASTIC_ERROR_FILE ({"message": {"message": ..., "extraInfo":
 * {"py_callstack": ..., "timestamp": "..."}}}) into out; its length, 0
 * when it does not fit. Strings are escaped so that any bytes make valid
 * JSON (bytes above 0x7f as \u00XX). */
size_t loom_errfile_json(const char *message, const char *callstack, long timestamp,
			 char *out, size_t cap);
size_t loom_errfile_json_escape(const char *s, char *out, size_t cap);

/* ------------------------------------------------------------ liveness */

/* Probes every other rank's liveness listener (a TCP connect; the kernel
 * answers for a live process even while it computes, refuses for a dead
 * one) and writes a sentence naming the dead or unreachable ranks into buf.
 * Returns the number of ranks found dead or unreachable. */
int loom_pg_name_dead(loom_pg *pg, char *buf, size_t len);
/* The same for collective number seq, which timed out: when every peer is
 * alive, names the peers on this host that have not reached it. */
int loom_pg_name_culprit(loom_pg *pg, uint64_t seq, char *buf, size_t len);
/* "1" or, with a note, "1 (pipeline stage 1)": how the messages above name
 * a rank. Returns buf. */
const char *loom_pg_rank_name(const loom_pg *pg, int rank, char *buf, size_t len);

/* ------------------------------------------------------------ the watchdog */

/* How often a waiting collective checks that its peers still live. */
#define LOOM_COMM_WATCH_S 1.0
/* For the wait path of every collective (comm/mpi.c's poll, comm/nccl.cu's):
 * from t0 + 1 s on, once a second (*next holds when; 0 at first), checks
 * each peer without a word on the wire: on this host, that its process
 * still runs (its pid, with the start time seen when the group formed); on
 * another host, that its progress link is still open. When one looks gone,
 * the liveness probe (loom_pg_name_dead) confirms it and writes the
 * sentence into buf ("rank 1 died (its process is gone)"); returns the
 * number of dead ranks, 0 while everyone lives. A silent peer (stopped,
 * or stuck) is alive here: only the timeout ends that wait. A dead peer's
 * progress file is removed. */
int loom_pg_watch(loom_pg *pg, double t0, double *next, char *buf, size_t len);
/* What loom_pg_watch asks of a peer on this host: its process's start time
 * (clock ticks since boot, from /proc/PID/stat; 0 when it cannot be seen),
 * and whether the process seen then has ended: gone, a zombie (exited but
 * not reaped: its parent may never wait for it), or its pid now names
 * another process. A stopped process has not ended. */
uint64_t loom_proc_start(unsigned pid);
int loom_proc_ended(unsigned pid, uint64_t start);

/* comm/watchdog.c: stops c's watchdog thread (what it holds is waited
 * for first, within the timeout); before c is freed. */
void loom_comm_watch_stop(loom_comm *c);

/* ------------------------------------------------------------ progress */

/* comm/progress.c: the last collective each rank entered, in a file that
 * the ranks on its host read when a collective times out, and sent to the
 * ranks on other hosts over a link to each one's liveness listener (read
 * there without blocking, at most every 0.1 s and when a collective times
 * out), so that a frozen rank is named across hosts too. */
#define LOOM_PROGRESS_LABEL LOOM_PROG_LABEL_BYTES
#define LOOM_PROGRESS_RING 64
struct loom_progress;
struct loom_progress_links;
/* The file, and the links to the ranks on other hosts (after the group
 * formed: the peer table is complete). */
void loom_progress_open(loom_pg *pg);
void loom_progress_close(loom_pg *pg);
/* Every collective, on entry (comm.c's wrappers): counts it and records
 * "step S's <what>". */
void loom_progress_enter(loom_pg *pg, const char *what);
/* This rank's description of its collective number seq (recent ones). */
const char *loom_progress_label(const loom_pg *pg, uint64_t seq);
/* The host name the progress files carry (gethostname, as the peer table). */
void loom_progress_host(char *host, size_t len);
/* Removes the file of process pid on this host (the launcher, for a worker
 * it reaped: one killed by a signal leaves its file behind). */
void loom_progress_remove(unsigned pid);
/* This process is stopping for why (its launcher is gone): the reason goes
 * into its progress file as its last record, and the file is removed. Only
 * what a thread may do while another one runs. */
void loom_progress_abandon(const char *why);
/* A peer's last collective (same host only); -1 when it cannot be read. */
int loom_progress_read(const loom_comm_peer *peer, uint64_t *seq, char *label, size_t len);
/* The peers that have not entered collective seq, named with what they
 * last entered ("rank 1 is alive but has not reached step 39's all-reduce
 * of 1000 f32 (its last: step 38's ...)"): on this host from their files,
 * on others from what their links last brought; the length written. */
size_t loom_progress_laggards(loom_pg *pg, uint64_t seq, char *buf, size_t len);

/* ------------------------------------------------------------ the group */

struct loom_pg_mpi; /* comm/mpi.c */

struct loom_pg {
	loom_pg_info info;
	double timeout_s;
	double join_timeout_s;
	loom_error err; /* the last failure (base/errf.h) */
	loom_comm_peer *peers; /* world entries */
	int probe_fd;
	struct loom_rdv_late *late; /* rank 0 under env://: MASTER_PORT, kept */
	pid_t ompi_server; /* rank 0 under env://: the Open MPI name server, else 0 */
	uint8_t nccl_id[LOOM_COMM_NCCL_ID_BYTES];
	struct loom_pg_mpi *mpi;
	struct loom_progress *progress; /* mapped; NULL without /dev/shm */
	struct loom_progress_links *links; /* to and from other hosts; or NULL */
	uint64_t *peer_start;           /* same-host peers' start times (watchdog); or NULL */
	uint64_t seq;                   /* collectives entered */
	int64_t step;                   /* loom_pg_set_step, -1 before */
	char labels[LOOM_PROGRESS_RING][LOOM_PROGRESS_LABEL];
	char (*notes)[LOOM_PG_NOTE_BYTES]; /* loom_pg_set_rank_note, world entries; or NULL */
	loom_comm *host;
	loom_comm *device;
	/* What loom_nccl_use_device (inside the plugin) has to say about the
	 * device it picked; the host side prints it through the log sink. */
	char device_note[192];
};

/* comm/mpi.c: bootstrap and the host backend. */
loom_status loom_mpi_init_world(loom_pg *pg);              /* under mpirun */
/* Under env://: MPI_Init (the name server's address already in the
 * environment); rank 0 also opens the port the others connect to. */
loom_status loom_mpi_open(loom_pg *pg, char *port, size_t len);
loom_status loom_mpi_join(loom_pg *pg, loom_rdv *r, const char *port);
loom_status loom_mpi_backend_new(loom_pg *pg, loom_comm **out);
/* Ends MPI unless the communicator broke (MPI_Finalize could then hang). */
void loom_mpi_finish(loom_pg *pg);

/* comm/self.c: the world-1 stand-in for both memories. */
loom_status loom_self_backend_new(loom_pg *pg, loom_comm **out);

/* comm/nccl.cu, inside the CUDA plugin (libloom_cuda.so). */
loom_status loom_nccl_unique_id(uint8_t id[LOOM_COMM_NCCL_ID_BYTES], char *err,
				size_t errlen);
loom_status loom_nccl_backend_new(loom_pg *pg, loom_comm **out);
/* Makes the device of local rank local_rank (loom_comm_pick_device over the
 * visible devices) current on this thread and records it in pg->info.device;
 * called before MPI_Init too, so that MPI's CUDA support (if any) opens its
 * context there and not on device 0. */
loom_status loom_nccl_use_device(loom_pg *pg, int local_rank);

/* comm/nccl_load.c: the three above through the plugin, which is mapped
 * only when the driver reports a device; without one, LOOM_ERR_UNSUPPORTED
 * naming why. */
loom_status loom_comm_nccl_unique_id(uint8_t id[LOOM_COMM_NCCL_ID_BYTES], char *err,
				     size_t errlen);
loom_status loom_comm_nccl_backend_new(loom_pg *pg, loom_comm **out);
loom_status loom_comm_nccl_use_device(loom_pg *pg, int local_rank);
/* Collective over the group's host communicator: *shared = 1 on every rank
 * when two ranks of one host would use one GPU (the same host name, the
 * same CUDA_VISIBLE_DEVICES and the same device picked), where NCCL refuses
 * them; then info.device is this rank's pick and rank 0 logs that the
 * collectives are staged through host memory. 0 where no device shows. */
loom_status loom_comm_shared_device(loom_pg *pg, int *shared);
/* What a rank says of its GPU there: its host name's hash, its
 * CUDA_VISIBLE_DEVICES' (0: unset), the device it picked (-1: none). */
typedef struct loom_comm_seat {
	uint64_t host, visible_devices;
	int64_t device;
} loom_comm_seat;
/* The first rank b > *a whose seat is rank *a's (a device, and the same
 * host, devices shown and device), with *a the lowest such; -1: none. */
int loom_comm_seats_shared(const loom_comm_seat *all, int world, int *a);

/* Where a group's NCCL unique id comes from: made here by ncclGetUniqueId
 * (rank 0 under mpirun, and a single process: world 1 makes its own id, so
 * one GPU runs NCCL exactly as many do), broadcast over MPI from rank 0
 * (other ranks under mpirun), or handed out by the env:// rendezvous. */
typedef enum loom_nccl_id_source {
	LOOM_NCCL_ID_LOCAL = 0,
	LOOM_NCCL_ID_MPI_BROADCAST,
	LOOM_NCCL_ID_RENDEZVOUS,
} loom_nccl_id_source;
loom_nccl_id_source loom_pg_nccl_id_source(const loom_pg *pg);

/* comm/fingerprint.c: the check on a serialized fingerprint (the tests feed
 * it garbage); loom_comm_check_fingerprint serializes (comm/wire.c) and
 * calls it. */
loom_status loom_comm_check_fingerprint_bytes(loom_comm *c, const uint8_t *rec, size_t len,
					      const loom_fingerprint *fp);

#ifdef __cplusplus
}
#endif

#endif /* LOOM_COMM_INTERNAL_H */
