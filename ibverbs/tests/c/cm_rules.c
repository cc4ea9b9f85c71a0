/* librdmacm's rules as rdma-core and the kernel's rdma_cm keep them, asserted one case per run:
 * `cm_rules CASE ADDR...`. Built against Debian's <rdma/rdma_cma.h> and run on ferroce's
 * librdmacm.so.1 / libibverbs.so.1 (ibverbs/tests/cm_rules.rs). Prints "ok CASE" and exits 0,
 * or prints what broke and exits 1; an alarm turns a hang into a failure. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <rdma/rdma_cma.h>
#include <signal.h>
#include <sys/signalfd.h>
#include <sys/syscall.h>
#include <sys/wait.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

/* libibverbs exports it; its declaration is in rdma-core's provider header, not verbs.h. */
const char *ibv_get_sysfs_path(void);
int ibv_read_sysfs_file(const char *dir, const char *file, char *buf, size_t size);

static const char *case_name;

#define CHECK(cond)                                                                        \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s: %s:%d: %s (errno %d: %s)\n", case_name,      \
				__FILE__, __LINE__, #cond, errno, strerror(errno));        \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

static void on_alarm(int sig)
{
	(void)sig;
	static const char msg[] = "hung: the alarm went off\n";
	write(2, msg, sizeof msg - 1);
	_exit(2);
}

/* ADDR (v4 or v6) and PORT into `ss`. */
static struct sockaddr *addr_of(const char *text, int port, struct sockaddr_storage *ss)
{
	memset(ss, 0, sizeof *ss);
	struct sockaddr_in *a4 = (struct sockaddr_in *)ss;
	struct sockaddr_in6 *a6 = (struct sockaddr_in6 *)ss;
	if (inet_pton(AF_INET, text, &a4->sin_addr) == 1) {
		a4->sin_family = AF_INET;
		a4->sin_port = htons(port);
	} else {
		CHECK(inet_pton(AF_INET6, text, &a6->sin6_addr) == 1);
		a6->sin6_family = AF_INET6;
		a6->sin6_port = htons(port);
	}
	return (struct sockaddr *)ss;
}

static struct rdma_cm_event *next_event(struct rdma_event_channel *ch, enum rdma_cm_event_type want)
{
	struct rdma_cm_event *e;
	CHECK(rdma_get_cm_event(ch, &e) == 0);
	if (e->event != want) {
		fprintf(stderr, "%s: got %s (status %d), wanted %s\n", case_name,
			rdma_event_str(e->event), e->status, rdma_event_str(want));
		exit(1);
	}
	return e;
}

/* Whether `ch` has an event pending (its fd readable). */
static int pending(struct rdma_event_channel *ch)
{
	struct pollfd p = { .fd = ch->fd, .events = POLLIN };
	return poll(&p, 1, 0) == 1;
}

static struct ibv_qp_init_attr qp_attr(void)
{
	struct ibv_qp_init_attr a;
	memset(&a, 0, sizeof a);
	a.cap.max_send_wr = 4;
	a.cap.max_recv_wr = 4;
	a.cap.max_send_sge = 1;
	a.cap.max_recv_sge = 1;
	a.qp_type = IBV_QPT_RC;
	return a;
}

/* librpma's way: a synchronous ID resolved, then migrated to a channel, which makes it
 * asynchronous (rdma_connect returns at once; ESTABLISHED comes on the channel); queued events
 * move with a migrated ID; an asynchronous ID migrated to NULL becomes synchronous. */
static void migrate(const char *addr, int port)
{
	struct sockaddr_storage ss;
	struct rdma_event_channel *lch = rdma_create_event_channel(), *cch = rdma_create_event_channel();
	CHECK(lch && cch);
	struct rdma_cm_id *lid, *cid;
	CHECK(rdma_create_id(lch, &lid, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(lid, addr_of(addr, port, &ss)) == 0);
	CHECK(rdma_listen(lid, 4) == 0);

	CHECK(rdma_create_id(NULL, &cid, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(cid, NULL, addr_of(addr, port, &ss), 2000) == 0);
	CHECK(rdma_resolve_route(cid, 2000) == 0);
	/* A synchronous ID cannot be migrated to "synchronous". */
	CHECK(rdma_migrate_id(cid, NULL) == -1 && errno == EINVAL);
	CHECK(rdma_migrate_id(cid, cch) == 0);
	CHECK(cid->channel == cch);
	struct ibv_qp_init_attr a = qp_attr();
	CHECK(rdma_create_qp(cid, NULL, &a) == 0);
	/* Asynchronous now: this returns before anybody accepts (synchronous, it would wait
	 * for ESTABLISHED forever, as the accept comes from this thread). */
	CHECK(rdma_connect(cid, NULL) == 0);
	struct rdma_cm_event *e = next_event(lch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *sid = e->id;
	CHECK(rdma_ack_cm_event(e) == 0);
	a = qp_attr();
	CHECK(rdma_create_qp(sid, NULL, &a) == 0);
	CHECK(rdma_accept(sid, NULL) == 0);
	e = next_event(cch, RDMA_CM_EVENT_ESTABLISHED);
	CHECK(e->id == cid);
	CHECK(rdma_ack_cm_event(e) == 0);
	rdma_ack_cm_event(next_event(lch, RDMA_CM_EVENT_ESTABLISHED));
	/* The DREQ reaches the passive side; its rdma_disconnect answers with the DREP that
	 * brings the active side's DISCONNECTED. */
	CHECK(rdma_disconnect(cid) == 0);
	rdma_ack_cm_event(next_event(lch, RDMA_CM_EVENT_DISCONNECTED));
	CHECK(rdma_disconnect(sid) == 0);
	rdma_ack_cm_event(next_event(cch, RDMA_CM_EVENT_DISCONNECTED));
	rdma_destroy_qp(sid);
	rdma_destroy_qp(cid);
	CHECK(rdma_destroy_id(sid) == 0);
	CHECK(rdma_destroy_id(cid) == 0);

	/* An event queued for an ID moves with it (the kernel moves the ID's events). */
	struct rdma_event_channel *other = rdma_create_event_channel();
	CHECK(rdma_create_id(cch, &cid, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(cid, NULL, addr_of(addr, port, &ss), 2000) == 0);
	CHECK(rdma_migrate_id(cid, other) == 0);
	CHECK(!pending(cch));
	e = next_event(other, RDMA_CM_EVENT_ADDR_RESOLVED);
	CHECK(e->id == cid);
	rdma_ack_cm_event(e);

	/* Asynchronous to synchronous: rdma_resolve_route now completes before it returns, its
	 * event kept in id->event, nothing on the old channel. */
	CHECK(rdma_migrate_id(cid, NULL) == 0);
	CHECK(cid->channel != other && cid->channel != NULL);
	CHECK(rdma_resolve_route(cid, 2000) == 0);
	CHECK(cid->event && cid->event->event == RDMA_CM_EVENT_ROUTE_RESOLVED);
	CHECK(!pending(other));
	CHECK(rdma_destroy_id(cid) == 0);
	CHECK(rdma_destroy_id(lid) == 0);
	rdma_destroy_event_channel(other);
	rdma_destroy_event_channel(cch);
	rdma_destroy_event_channel(lch);
}

/* Port 0 is given a port at bind (the kernel's cma_get_port), the one listen then uses; a
 * port bound by one ID is refused to another (EADDRINUSE). */
static void bind_port0(const char *addr)
{
	struct sockaddr_storage ss;
	struct rdma_cm_id *a, *b;
	CHECK(rdma_create_id(NULL, &a, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(a, addr_of(addr, 0, &ss)) == 0);
	int port = ntohs(rdma_get_src_port(a));
	CHECK(port != 0);
	CHECK(ntohs(((struct sockaddr_in *)rdma_get_local_addr(a))->sin_port) == port);
	CHECK(a->verbs != NULL);
	CHECK(rdma_create_id(NULL, &b, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(b, addr_of(addr, port, &ss)) == -1 && errno == EADDRINUSE);
	CHECK(rdma_listen(a, 1) == 0);
	CHECK(ntohs(rdma_get_src_port(a)) == port);
	CHECK(rdma_destroy_id(a) == 0);
	/* Free again once its ID is gone. */
	CHECK(rdma_bind_addr(b, addr_of(addr, port, &ss)) == 0);
	CHECK(rdma_destroy_id(b) == 0);
}

/* qperf's client on another device than the server: the resolved ID is on a device of its
 * own (id->verbs set and usable), its source that device's address. */
static void resolve_other(const char *server, const char *own)
{
	struct sockaddr_storage ss;
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, addr_of(server, 7471, &ss), 2000) == 0);
	CHECK(id->verbs != NULL);
	struct ibv_device_attr da;
	CHECK(ibv_query_device(id->verbs, &da) == 0);
	char text[INET6_ADDRSTRLEN];
	struct sockaddr_in *src = (struct sockaddr_in *)rdma_get_local_addr(id);
	CHECK(inet_ntop(AF_INET, &src->sin_addr, text, sizeof text));
	if (strcmp(text, own) != 0) {
		fprintf(stderr, "%s: source %s, not the device's %s\n", case_name, text, own);
		exit(1);
	}
	CHECK(rdma_destroy_id(id) == 0);
}

/* A listener on ADDR:PORT that, when its client disconnects, destroys its listening ID and
 * exits, the connection's ID never destroyed nor disconnected (qperf's server). */
static void drep_server(const char *addr, int port)
{
	struct sockaddr_storage ss;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid;
	CHECK(rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(lid, addr_of(addr, port, &ss)) == 0);
	CHECK(rdma_listen(lid, 1) == 0);
	printf("listening\n");
	fflush(stdout);
	struct rdma_cm_event *e = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *id = e->id;
	rdma_ack_cm_event(e);
	struct ibv_qp_init_attr a = qp_attr();
	CHECK(rdma_create_qp(id, NULL, &a) == 0);
	CHECK(rdma_accept(id, NULL) == 0);
	rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_DISCONNECTED));
	CHECK(rdma_destroy_id(lid) == 0);
	/* Straight out, as qperf's server goes: `id` is left to the process's end. */
	exit(0);
}

/* The active side: its first DREQ must be answered by a DREP (DISCONNECTED with status 0),
 * not time out (status -ETIMEDOUT) nor wait for a resend: ferroce's DREQ timeout is ~6 s, so
 * DISCONNECTED within 3 s means the first DREQ was answered. */
static void drep_client(const char *addr, int port)
{
	struct sockaddr_storage ss;
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(id, NULL, addr_of(addr, port, &ss), 2000) == 0);
	CHECK(rdma_resolve_route(id, 2000) == 0);
	struct ibv_qp_init_attr a = qp_attr();
	CHECK(rdma_create_qp(id, NULL, &a) == 0);
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(rdma_migrate_id(id, ch) == 0);
	CHECK(rdma_connect(id, NULL) == 0);
	rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ESTABLISHED));
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	CHECK(rdma_disconnect(id) == 0);
	struct rdma_cm_event *e = next_event(ch, RDMA_CM_EVENT_DISCONNECTED);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	double took = (t1.tv_sec - t0.tv_sec) + (t1.tv_nsec - t0.tv_nsec) / 1e9;
	if (e->status != 0 || took > 3.0) {
		fprintf(stderr, "%s: DISCONNECTED with status %d after %.1f s: the first DREQ went "
			"unanswered\n", case_name, e->status, took);
		exit(1);
	}
	rdma_ack_cm_event(e);
	rdma_destroy_qp(id);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(ch);
}

static int listen_any(int family, int afonly, int port, struct rdma_cm_id **out)
{
	struct sockaddr_storage ss;
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	if (afonly >= 0)
		CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &afonly,
				      sizeof afonly) == 0);
	*out = id;
	if (rdma_bind_addr(id, addr_of(family == AF_INET ? "0.0.0.0" : "::", port, &ss)))
		return -1;
	return rdma_listen(id, 1);
}

/* tgt's iSER target: 0.0.0.0:PORT and [::]:PORT with AFONLY both listen; without it the
 * IPv6 wildcard covers IPv4 too and its bind is refused (EADDRNOTAVAIL, the kernel's answer
 * when either binding is a wildcard), while an IPv4 wildcard is of its family by default. */
static void afonly(int port)
{
	struct rdma_cm_id *v4, *v6;
	CHECK(listen_any(AF_INET, 1, port, &v4) == 0);
	CHECK(listen_any(AF_INET6, 1, port, &v6) == 0);
	CHECK(rdma_destroy_id(v6) == 0);
	CHECK(rdma_destroy_id(v4) == 0);
	CHECK(listen_any(AF_INET, -1, port, &v4) == 0);
	CHECK(listen_any(AF_INET6, -1, port, &v6) == -1 && errno == EADDRNOTAVAIL);
	CHECK(rdma_destroy_id(v6) == 0);
	CHECK(rdma_destroy_id(v4) == 0);
	/* AFONLY may be set on a bound ID, not on a listening one. */
	struct rdma_cm_id *id;
	struct sockaddr_storage ss;
	int one = 1;
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(id, addr_of("0.0.0.0", port, &ss)) == 0);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one, sizeof one) == 0);
	CHECK(rdma_listen(id, 1) == 0);
	CHECK(rdma_set_option(id, RDMA_OPTION_ID, RDMA_OPTION_ID_AFONLY, &one, sizeof one) == -1 &&
	      errno == EINVAL);
	CHECK(rdma_destroy_id(id) == 0);
}

/* Binding as the kernel's rdma_bind_addr: an address of no interface is EADDRNOTAVAIL; a local
 * address no device is on ENODEV ("-" when the host has none besides loopback); a loopback
 * address no device is on binds no device and listens as the wildcard of its family (the
 * kernel's cma_any_addr; libfabric's verbs provider binds "localhost"): a client on the device
 * reaches it; a device's address binds that device. */
static void bind_nodev(const char *device, const char *loopback, const char *nonlocal,
		       const char *local)
{
	struct sockaddr_storage ss;
	struct rdma_cm_id *id;
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(id, addr_of(nonlocal, 7480, &ss)) == -1 && errno == EADDRNOTAVAIL);
	CHECK(id->verbs == NULL);
	if (strcmp(local, "-") != 0) {
		CHECK(rdma_bind_addr(id, addr_of(local, 7480, &ss)) == -1 && errno == ENODEV);
		CHECK(id->verbs == NULL);
	}
	CHECK(rdma_bind_addr(id, addr_of(device, 7480, &ss)) == 0);
	CHECK(id->verbs != NULL);
	CHECK(rdma_destroy_id(id) == 0);

	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid;
	CHECK(rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(lid, addr_of(loopback, 0, &ss)) == 0);
	CHECK(lid->verbs == NULL);
	int port = ntohs(rdma_get_src_port(lid));
	CHECK(port != 0);
	struct sockaddr_in *la = (struct sockaddr_in *)rdma_get_local_addr(lid);
	struct sockaddr_in *want = (struct sockaddr_in *)addr_of(loopback, 0, &ss);
	CHECK(la->sin_family == AF_INET && la->sin_addr.s_addr == want->sin_addr.s_addr);
	CHECK(rdma_listen(lid, 1) == 0);
	/* A second ID on the device's address and that port: the loopback bind holds it. */
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(id, addr_of(device, port, &ss)) == -1 &&
	      (errno == EADDRINUSE || errno == EADDRNOTAVAIL));
	CHECK(rdma_destroy_id(id) == 0);
	/* A client to the device's address and that port reaches the listener. (A destination on
	 * a loopback address is another ferroce device's here, not this host's any-address as in
	 * the kernel: one host's ferroce devices live on loopback addresses.) */
	struct rdma_event_channel *cch = rdma_create_event_channel();
	for (int round = 0; round < 1; round++) {
		const char *to = device;
		struct rdma_cm_id *cid;
		CHECK(rdma_create_id(cch, &cid, NULL, RDMA_PS_TCP) == 0);
		CHECK(rdma_resolve_addr(cid, NULL, addr_of(to, port, &ss), 2000) == 0);
		rdma_ack_cm_event(next_event(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
		CHECK(rdma_resolve_route(cid, 2000) == 0);
		rdma_ack_cm_event(next_event(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
		/* ECE as librdmacm checks it (pyverbs' external-QP test): an ID without a QP reports
		 * none received and takes a vendor's offer; vendor 0 is EINVAL, so is an ID with a QP. */
		struct ibv_ece ece = { .vendor_id = 7, .options = 7, .comp_mask = 7 };
		CHECK(rdma_get_remote_ece(cid, &ece) == 0 && ece.vendor_id == 0 && ece.options == 0);
		CHECK(rdma_set_local_ece(cid, &ece) == -1 && errno == EINVAL);
		ece.vendor_id = 0x2c9;
		CHECK(rdma_set_local_ece(cid, &ece) == 0);
		struct ibv_qp_init_attr a = qp_attr();
		CHECK(rdma_create_qp(cid, NULL, &a) == 0);
		CHECK(rdma_get_remote_ece(cid, &ece) == -1 && errno == EINVAL);
		struct rdma_conn_param cp;
		memset(&cp, 0, sizeof cp);
		CHECK(rdma_connect(cid, &cp) == 0);
		struct rdma_cm_event *e = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
		struct rdma_cm_id *sid = e->id;
		rdma_ack_cm_event(e);
		CHECK(sid->verbs != NULL);
		CHECK(rdma_create_qp(sid, NULL, &a) == 0);
		CHECK(rdma_accept(sid, NULL) == 0);
		rdma_ack_cm_event(next_event(cch, RDMA_CM_EVENT_ESTABLISHED));
		rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ESTABLISHED));
		CHECK(rdma_disconnect(cid) == 0);
		rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_DISCONNECTED));
		CHECK(rdma_disconnect(sid) == 0);
		rdma_ack_cm_event(next_event(cch, RDMA_CM_EVENT_DISCONNECTED));
		rdma_destroy_qp(sid);
		rdma_destroy_qp(cid);
		CHECK(rdma_destroy_id(sid) == 0);
		CHECK(rdma_destroy_id(cid) == 0);
	}
	CHECK(rdma_destroy_id(lid) == 0);
	rdma_destroy_event_channel(cch);
	rdma_destroy_event_channel(ch);
}

/* fork(2) with a device open: the parent listens (its device and CM running), forks, and the
 * child, with IDs of its own, connects to it (Python's multiprocessing in rdma-core's pyverbs
 * tests). The child's device must be its own, not a copy of the parent's without threads. */
static void fork_child(const char *addr, int port)
{
	struct sockaddr_storage ss;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *lid;
	CHECK(rdma_create_id(ch, &lid, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(lid, addr_of(addr, port, &ss)) == 0);
	CHECK(rdma_listen(lid, 1) == 0);
	struct ibv_qp_init_attr a = qp_attr();
	pid_t pid = fork();
	CHECK(pid >= 0);
	if (pid == 0) {
		alarm(20);
		struct rdma_event_channel *cch = rdma_create_event_channel();
		struct rdma_cm_id *cid;
		CHECK(rdma_create_id(cch, &cid, NULL, RDMA_PS_TCP) == 0);
		CHECK(rdma_resolve_addr(cid, NULL, addr_of(addr, port, &ss), 2000) == 0);
		rdma_ack_cm_event(next_event(cch, RDMA_CM_EVENT_ADDR_RESOLVED));
		CHECK(rdma_resolve_route(cid, 2000) == 0);
		rdma_ack_cm_event(next_event(cch, RDMA_CM_EVENT_ROUTE_RESOLVED));
		CHECK(rdma_create_qp(cid, NULL, &a) == 0);
		struct rdma_conn_param cp;
		memset(&cp, 0, sizeof cp);
		CHECK(rdma_connect(cid, &cp) == 0);
		rdma_ack_cm_event(next_event(cch, RDMA_CM_EVENT_ESTABLISHED));
		CHECK(rdma_disconnect(cid) == 0);
		rdma_ack_cm_event(next_event(cch, RDMA_CM_EVENT_DISCONNECTED));
		rdma_destroy_qp(cid);
		CHECK(rdma_destroy_id(cid) == 0);
		exit(0);
	}
	struct rdma_cm_event *e = next_event(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
	struct rdma_cm_id *sid = e->id;
	rdma_ack_cm_event(e);
	CHECK(rdma_create_qp(sid, NULL, &a) == 0);
	CHECK(rdma_accept(sid, NULL) == 0);
	rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_ESTABLISHED));
	rdma_ack_cm_event(next_event(ch, RDMA_CM_EVENT_DISCONNECTED));
	CHECK(rdma_disconnect(sid) == 0);
	int status;
	CHECK(waitpid(pid, &status, 0) == pid);
	if (!WIFEXITED(status) || WEXITSTATUS(status) != 0) {
		fprintf(stderr, "%s: the child ended with status %#x\n", case_name, status);
		exit(1);
	}
	rdma_destroy_qp(sid);
	CHECK(rdma_destroy_id(sid) == 0);
	CHECK(rdma_destroy_id(lid) == 0);
	rdma_destroy_event_channel(ch);
}

/* libfabric's call: no node, no service, the addresses in the hints. */
static void getaddrinfo_hints(const char *addr)
{
	struct sockaddr_storage src, dst;
	struct rdma_addrinfo hints, *res;
	memset(&hints, 0, sizeof hints);
	hints.ai_port_space = RDMA_PS_TCP;
	hints.ai_qp_type = IBV_QPT_RC;
	hints.ai_family = AF_INET;
	hints.ai_src_addr = addr_of(addr, 0, &src);
	hints.ai_src_len = sizeof(struct sockaddr_in);
	hints.ai_dst_addr = addr_of(addr, 7490, &dst);
	hints.ai_dst_len = sizeof(struct sockaddr_in);
	CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0);
	CHECK(res->ai_dst_len == sizeof(struct sockaddr_in));
	CHECK(memcmp(res->ai_dst_addr, &dst, sizeof(struct sockaddr_in)) == 0);
	CHECK(res->ai_src_len == sizeof(struct sockaddr_in));
	CHECK(memcmp(res->ai_src_addr, &src, sizeof(struct sockaddr_in)) == 0);
	CHECK(res->ai_port_space == RDMA_PS_TCP && res->ai_qp_type == IBV_QPT_RC);
	CHECK(res->ai_family == AF_INET);
	rdma_freeaddrinfo(res);
	/* Passive, the source only. */
	memset(&hints, 0, sizeof hints);
	hints.ai_flags = RAI_PASSIVE;
	hints.ai_src_addr = addr_of(addr, 7491, &src);
	hints.ai_src_len = sizeof(struct sockaddr_in);
	CHECK(rdma_getaddrinfo(NULL, NULL, &hints, &res) == 0);
	CHECK(res->ai_flags == RAI_PASSIVE && res->ai_dst_addr == NULL);
	CHECK(memcmp(res->ai_src_addr, &src, sizeof(struct sockaddr_in)) == 0);
	rdma_freeaddrinfo(res);
	/* With a service and a source hint: the source kept beside the resolved destination. */
	memset(&hints, 0, sizeof hints);
	hints.ai_src_addr = addr_of(addr, 0, &src);
	hints.ai_src_len = sizeof(struct sockaddr_in);
	CHECK(rdma_getaddrinfo(addr, "7492", &hints, &res) == 0);
	CHECK(res->ai_dst_addr && ntohs(((struct sockaddr_in *)res->ai_dst_addr)->sin_port) == 7492);
	CHECK(res->ai_src_addr && memcmp(res->ai_src_addr, &src, sizeof(struct sockaddr_in)) == 0);
	CHECK(res->ai_port_space == RDMA_PS_TCP && res->ai_qp_type == IBV_QPT_RC);
	rdma_freeaddrinfo(res);
	/* Nothing at all: EINVAL. */
	errno = 0;
	CHECK(rdma_getaddrinfo(NULL, NULL, NULL, &res) == -1 && errno == EINVAL);
}

/* A CQ as large as RxM's (262,144) and up to the device's max_cqe; one past it EINVAL. */
static void big_cq(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	struct ibv_device_attr da;
	CHECK(ibv_query_device(ctx, &da) == 0);
	CHECK(da.max_cqe >= 4194303);
	struct ibv_cq *cq = ibv_create_cq(ctx, 262144, NULL, NULL, 0);
	CHECK(cq && cq->cqe >= 262144);
	CHECK(ibv_destroy_cq(cq) == 0);
	cq = ibv_create_cq(ctx, da.max_cqe, NULL, NULL, 0);
	CHECK(cq);
	CHECK(ibv_destroy_cq(cq) == 0);
	errno = 0;
	CHECK(ibv_create_cq(ctx, da.max_cqe + 1, NULL, NULL, 0) == NULL && errno == EINVAL);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
}

static void on_usr1(int sig)
{
	(void)sig;
}

static void *poke(void *arg)
{
	usleep(200 * 1000);
	pthread_kill(*(pthread_t *)arg, SIGUSR1);
	return NULL;
}

/* A signal whose handler has no SA_RESTART ends a blocking ibv_get_cq_event,
 * ibv_get_async_event and rdma_get_cm_event with EINTR, as it ends rdma-core's read(2) of the channel's fd (qperf
 * stops its ping-pong loops with an alarm that way). */
static void eintr(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_usr1; /* no SA_RESTART */
	CHECK(sigaction(SIGUSR1, &sa, NULL) == 0);
	pthread_t me = pthread_self(), t;

	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	struct ibv_comp_channel *cc = ibv_create_comp_channel(ctx);
	CHECK(cc);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, cc, 0);
	CHECK(cq && ibv_req_notify_cq(cq, 0) == 0);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	CHECK(pthread_create(&t, NULL, poke, &me) == 0);
	errno = 0;
	CHECK(ibv_get_cq_event(cc, &ev_cq, &ev_ctx) == -1 && errno == EINTR);
	pthread_join(t, NULL);

	struct ibv_async_event ae;
	CHECK(pthread_create(&t, NULL, poke, &me) == 0);
	errno = 0;
	CHECK(ibv_get_async_event(ctx, &ae) == -1 && errno == EINTR);
	pthread_join(t, NULL);

	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch);
	struct rdma_cm_event *e;
	CHECK(pthread_create(&t, NULL, poke, &me) == 0);
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &e) == -1 && errno == EINTR);
	pthread_join(t, NULL);
	rdma_destroy_event_channel(ch);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(cc) == 0);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
}

static volatile sig_atomic_t usr2_seen;

static void on_usr2(int sig)
{
	(void)sig;
	usr2_seen = 1;
}

static void *poke_usr2(void *arg)
{
	usleep(200 * 1000);
	pthread_kill(*(pthread_t *)arg, SIGUSR2);
	return NULL;
}

static void *flush_later(void *arg)
{
	usleep(400 * 1000);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_ERR};
	CHECK(ibv_modify_qp((struct ibv_qp *)arg, &a, IBV_QP_STATE) == 0);
	return NULL;
}

/* A signal whose handler has SA_RESTART (every handler of the process has it) lets a
 * blocking ibv_get_cq_event go on, as it lets rdma-core's read(2) of the channel's fd restart:
 * the handler runs, and the call returns the event that comes later (a receive flushed when
 * the QP enters ERR). */
static void restart(void)
{
	struct sigaction sa;
	memset(&sa, 0, sizeof sa);
	sa.sa_handler = on_usr2;
	sa.sa_flags = SA_RESTART;
	CHECK(sigaction(SIGUSR2, &sa, NULL) == 0);
	pthread_t me = pthread_self(), t, f;

	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	CHECK(pd);
	struct ibv_comp_channel *cc = ibv_create_comp_channel(ctx);
	CHECK(cc);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, cc, 0);
	CHECK(cq && ibv_req_notify_cq(cq, 0) == 0);
	struct ibv_qp_init_attr ia = {
		.send_cq = cq,
		.recv_cq = cq,
		.qp_type = IBV_QPT_RC,
		.cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1},
	};
	struct ibv_qp *qp = ibv_create_qp(pd, &ia);
	CHECK(qp);
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1};
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	static char buf[64];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = sizeof buf, .lkey = mr->lkey};
	struct ibv_recv_wr wr = {.wr_id = 42, .sg_list = &sge, .num_sge = 1}, *bad;
	CHECK(ibv_post_recv(qp, &wr, &bad) == 0);

	CHECK(pthread_create(&t, NULL, poke_usr2, &me) == 0);
	CHECK(pthread_create(&f, NULL, flush_later, qp) == 0);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	errno = 0;
	CHECK(ibv_get_cq_event(cc, &ev_cq, &ev_ctx) == 0 && ev_cq == cq);
	CHECK(usr2_seen == 1);
	ibv_ack_cq_events(cq, 1);
	pthread_join(t, NULL);
	pthread_join(f, NULL);
	struct ibv_wc wc;
	CHECK(ibv_poll_cq(cq, 1, &wc) == 1 && wc.wr_id == 42 && wc.status == IBV_WC_WR_FLUSH_ERR);
	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_destroy_comp_channel(cc) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
}

/* An SGE array at an address not aligned for struct ibv_sge (libiscsi's iSER initiator keeps
 * one inside a packed structure): C on x86 reads it, so must the library. */
static void unaligned_sge(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	struct ibv_pd *pd = ibv_alloc_pd(ctx);
	struct ibv_cq *cq = ibv_create_cq(ctx, 16, NULL, NULL, 0);
	CHECK(pd && cq);
	static char buf[4096];
	struct ibv_mr *mr = ibv_reg_mr(pd, buf, sizeof buf, IBV_ACCESS_LOCAL_WRITE);
	CHECK(mr);
	struct ibv_qp_init_attr a = qp_attr();
	a.send_cq = cq;
	a.recv_cq = cq;
	a.cap.max_recv_sge = 2;
	struct ibv_qp *qp = ibv_create_qp(pd, &a);
	CHECK(qp);
	struct ibv_qp_attr init = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1 };
	CHECK(ibv_modify_qp(qp, &init,
			    IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS) == 0);
	/* Two SGEs at an odd address. */
	static char raw[2 * sizeof(struct ibv_sge) + 1];
	struct ibv_sge sge[2] = { { (uintptr_t)buf, 100, mr->lkey },
				  { (uintptr_t)buf + 100, 200, mr->lkey } };
	memcpy(raw + 1, sge, sizeof sge);
	struct ibv_recv_wr wr = { .wr_id = 7, .sg_list = (struct ibv_sge *)(raw + 1), .num_sge = 2 };
	struct ibv_recv_wr *bad;
	CHECK(ibv_post_recv(qp, &wr, &bad) == 0);
	CHECK(ibv_destroy_qp(qp) == 0);
	CHECK(ibv_dereg_mr(mr) == 0);
	CHECK(ibv_destroy_cq(cq) == 0);
	CHECK(ibv_dealloc_pd(pd) == 0);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
}

/* A signal sent to the process reaches the program's threads, never the library's: tgtd
 * blocks its completion signal and reads it from a signalfd (libibverbs has no threads; a
 * thread of the library with the signal unblocked would take it, here: die of it). */
static void process_signal(void)
{
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n > 0);
	/* The device's threads start before the program blocks the signal, as in tgtd. */
	struct ibv_context *ctx = ibv_open_device(list[0]);
	CHECK(ctx);
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	CHECK(ch && rdma_create_id(ch, &id, NULL, RDMA_PS_TCP) == 0);
	struct sockaddr_storage ss;
	CHECK(rdma_bind_addr(id, addr_of("0.0.0.0", 0, &ss)) == 0);
	CHECK(rdma_listen(id, 1) == 0); /* the CM agent's thread too */
	sigset_t set;
	sigemptyset(&set);
	sigaddset(&set, SIGUSR2);
	CHECK(pthread_sigmask(SIG_BLOCK, &set, NULL) == 0);
	int sfd = signalfd(-1, &set, 0);
	CHECK(sfd >= 0);
	for (int i = 0; i < 20; i++) {
		CHECK(kill(getpid(), SIGUSR2) == 0);
		struct pollfd p = { .fd = sfd, .events = POLLIN };
		CHECK(poll(&p, 1, 2000) == 1);
		struct signalfd_siginfo si;
		CHECK(read(sfd, &si, sizeof si) == sizeof si && si.ssi_signo == SIGUSR2);
	}
	close(sfd);
	CHECK(rdma_destroy_id(id) == 0);
	rdma_destroy_event_channel(ch);
	ibv_close_device(ctx);
	ibv_free_device_list(list);
}

struct waiter {
	struct rdma_event_channel *ch;
	volatile pid_t tid;
	int rc;
	struct rdma_cm_event *e;
};

static void *wait_event_thread(void *arg)
{
	struct waiter *w = arg;
	w->tid = (pid_t)syscall(SYS_gettid);
	w->rc = rdma_get_cm_event(w->ch, &w->e);
	return NULL;
}

/* Whether thread `tid` of this process is asleep (state S in its stat). */
static int task_sleeping(pid_t tid)
{
	char path[64], buf[512];
	snprintf(path, sizeof path, "/proc/self/task/%d/stat", (int)tid);
	FILE *f = fopen(path, "r");
	if (!f)
		return 0;
	size_t n = fread(buf, 1, sizeof buf - 1, f);
	fclose(f);
	buf[n] = 0;
	char *r = strrchr(buf, ')');
	return r && r[1] == ' ' && r[2] == 'S';
}

/* rping's exit: the main thread destroys the event channel while its event thread waits in
 * rdma_get_cm_event. librdmacm's blocked read(2) keeps the file, so the wait goes on; here it
 * must touch nothing of the freed channel (its memory is reused and overwritten at once),
 * and an event of an ID still on the channel (a connect request for its listener) reaches
 * the waiter. A call made after the destroy fails with EBADF. */
static void destroy_while_waiting(const char *addr, int port)
{
	struct sockaddr_storage ss;
	struct rdma_event_channel *ch = rdma_create_event_channel();
	CHECK(ch);
	struct rdma_cm_id *listener, *client;
	CHECK(rdma_create_id(ch, &listener, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(listener, addr_of(addr, port, &ss)) == 0);
	CHECK(rdma_listen(listener, 1) == 0);
	struct waiter w = { .ch = ch };
	pthread_t t;
	CHECK(pthread_create(&t, NULL, wait_event_thread, &w) == 0);
	for (int i = 0; i < 1000 && !(w.tid && task_sleeping(w.tid)); i++)
		usleep(5000);
	CHECK(w.tid && task_sleeping(w.tid));
	rdma_destroy_event_channel(ch);
	void *junk[64];
	for (int i = 0; i < 64; i++) {
		junk[i] = malloc(16);
		CHECK(junk[i]);
		memset(junk[i], 0xff, 16);
	}
	/* A call after the destroy (rdma-core 44's rping makes one, racing its main thread):
	 * EBADF, as librdmacm's read of the closed descriptor. */
	struct rdma_cm_event *late;
	errno = 0;
	CHECK(rdma_get_cm_event(ch, &late) == -1 && errno == EBADF);
	CHECK(rdma_create_id(NULL, &client, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_resolve_addr(client, NULL, addr_of(addr, port, &ss), 2000) == 0);
	CHECK(rdma_resolve_route(client, 2000) == 0);
	struct ibv_qp_init_attr a = qp_attr();
	CHECK(rdma_create_qp(client, NULL, &a) == 0);
	struct rdma_event_channel *cch = rdma_create_event_channel();
	CHECK(cch && rdma_migrate_id(client, cch) == 0);
	CHECK(rdma_connect(client, NULL) == 0);
	pthread_join(t, NULL);
	CHECK(w.rc == 0 && w.e->event == RDMA_CM_EVENT_CONNECT_REQUEST && w.e->listen_id == listener);
	CHECK(rdma_reject(w.e->id, NULL, 0) == 0);
	rdma_ack_cm_event(w.e);
	rdma_ack_cm_event(next_event(cch, RDMA_CM_EVENT_REJECTED));
	rdma_destroy_qp(client);
	CHECK(rdma_destroy_id(client) == 0);
	rdma_destroy_event_channel(cch);
	for (int i = 0; i < 64; i++)
		free(junk[i]);
}

/* Calls with an ID the program destroyed (perftest 4.5-0.17 retries a refused connection with
 * its destroyed IDs): EINVAL, its memory not read; a second destroy likewise. An ID made
 * afterwards works. */
static void freed_id(const char *addr, int port)
{
	struct sockaddr_storage ss;
	struct rdma_cm_id *id, *dead;
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	dead = id;
	CHECK(rdma_destroy_id(id) == 0);
	errno = 0;
	CHECK(rdma_destroy_id(dead) == -1 && errno == EINVAL);
	errno = 0;
	CHECK(rdma_bind_addr(dead, addr_of(addr, port, &ss)) == -1 && errno == EINVAL);
	errno = 0;
	CHECK(rdma_resolve_addr(dead, NULL, addr_of(addr, port, &ss), 100) == -1 && errno == EINVAL);
	errno = 0;
	CHECK(rdma_listen(dead, 1) == -1 && errno == EINVAL);
	CHECK(rdma_create_id(NULL, &id, NULL, RDMA_PS_TCP) == 0);
	CHECK(rdma_bind_addr(id, addr_of(addr, port, &ss)) == 0);
	CHECK(rdma_listen(id, 1) == 0);
	CHECK(rdma_destroy_id(id) == 0);
}

/* SYSFS_PATH, as rdma-core reads it (trailing slashes dropped). */
static void sysfs_path(const char *want)
{
	const char *p = ibv_get_sysfs_path();
	CHECK(p);
	if (strcmp(p, want) != 0) {
		fprintf(stderr, "%s: %s, wanted %s\n", case_name, p, want);
		exit(1);
	}
	/* With a tree there (`ferroce sysfs DIR`), its files read as rdma-core reads them: the
	 * final newline dropped. */
	char dir[512], buf[64];
	snprintf(dir, sizeof dir, "%s/class/infiniband/ferroce0", p);
	if (access(dir, F_OK) == 0) {
		CHECK(ibv_read_sysfs_file(dir, "node_type", buf, sizeof buf) == 5);
		CHECK(strcmp(buf, "1: CA") == 0);
		CHECK(ibv_read_sysfs_file(dir, "no_such_file", buf, sizeof buf) == -1);
	}
}

int main(int argc, char **argv)
{
	if (argc < 2)
		return 2;
	case_name = argv[1];
	signal(SIGALRM, on_alarm);
	alarm(30);
	const char *c = argv[1];
	if (!strcmp(c, "migrate") && argc == 4)
		migrate(argv[2], atoi(argv[3]));
	else if (!strcmp(c, "bind_port0") && argc == 3)
		bind_port0(argv[2]);
	else if (!strcmp(c, "resolve_other") && argc == 4)
		resolve_other(argv[2], argv[3]);
	else if (!strcmp(c, "drep_server") && argc == 4)
		drep_server(argv[2], atoi(argv[3]));
	else if (!strcmp(c, "drep_client") && argc == 4)
		drep_client(argv[2], atoi(argv[3]));
	else if (!strcmp(c, "afonly") && argc == 3)
		afonly(atoi(argv[2]));
	else if (!strcmp(c, "bind_nodev") && argc == 6)
		bind_nodev(argv[2], argv[3], argv[4], argv[5]);
	else if (!strcmp(c, "fork_child") && argc == 4)
		fork_child(argv[2], atoi(argv[3]));
	else if (!strcmp(c, "getaddrinfo") && argc == 3)
		getaddrinfo_hints(argv[2]);
	else if (!strcmp(c, "big_cq") && argc == 2)
		big_cq();
	else if (!strcmp(c, "process_signal") && argc == 2)
		process_signal();
	else if (!strcmp(c, "unaligned_sge") && argc == 2)
		unaligned_sge();
	else if (!strcmp(c, "eintr") && argc == 2)
		eintr();
	else if (!strcmp(c, "restart") && argc == 2)
		restart();
	else if (!strcmp(c, "sysfs_path") && argc == 3)
		sysfs_path(argv[2]);
	else if (!strcmp(c, "freed_id") && argc == 4)
		freed_id(argv[2], atoi(argv[3]));
	else if (!strcmp(c, "destroy_while_waiting") && argc == 4)
		destroy_while_waiting(argv[2], atoi(argv[3]));
	else {
		fprintf(stderr, "unknown case or arguments: %s\n", c);
		return 2;
	}
	printf("ok %s\n", c);
	return 0;
}
