/* A librpma client and server with every byte checked: `rpma_peer server ADDR PORT` serves a
 * 4 KiB region (a known pattern; its descriptor in the connection's private data) and, when
 * the client has gone, checks what the client wrote into it; `rpma_peer client ADDR PORT`
 * reads the region, writes into it, makes the writes visible with rpma_flush, writes 8 bytes
 * with rpma_atomic_write, flushes again and reads everything back. Built against Debian's
 * librpma-dev (librpma 1.2) and run on ferroce's libraries (ibverbs/tests/middleware.rs).
 * Prints "ok server" / "ok client" and exits 0, or says what broke and exits 1. */
#include <librpma.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define SIZE 4096
#define WRITE_AT 1024
#define ATOMIC_AT 2048

static const char *role;

#define CHECK(call)                                                                        \
	do {                                                                               \
		int rc_ = (call);                                                          \
		if (rc_) {                                                                 \
			fprintf(stderr, "%s: %s:%d: %s = %d (%s)\n", role, __FILE__,       \
				__LINE__, #call, rc_, rpma_err_2str(rc_));                 \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

#define EXPECT(cond)                                                                       \
	do {                                                                               \
		if (!(cond)) {                                                             \
			fprintf(stderr, "%s: %s:%d: %s\n", role, __FILE__, __LINE__, #cond);  \
			exit(1);                                                           \
		}                                                                          \
	} while (0)

static const char WRITTEN[] = "written by the rpma client";
static const char ATOMIC[8] = { 'a', 't', 'o', 'm', 'i', 'c', '!', '8' };

static void fill(char *buf)
{
	for (int i = 0; i < SIZE; i++)
		buf[i] = (char)(i * 7 + 3);
}

static void on_alarm(int sig)
{
	(void)sig;
	static const char msg[] = "hung: the alarm went off\n";
	(void)!write(2, msg, sizeof msg - 1);
	_exit(2);
}

/* Waits for the one completion `op` asked for and checks it succeeded. */
static void complete(struct rpma_conn *conn, enum ibv_wc_opcode op)
{
	struct rpma_cq *cq;
	struct ibv_wc wc;
	int n = 0;
	CHECK(rpma_conn_get_cq(conn, &cq));
	CHECK(rpma_cq_wait(cq));
	CHECK(rpma_cq_get_wc(cq, 1, &wc, &n));
	EXPECT(n == 1);
	if (wc.status != IBV_WC_SUCCESS || wc.opcode != op) {
		fprintf(stderr, "%s: completion status %s opcode %d, wanted opcode %d\n", role,
			ibv_wc_status_str(wc.status), wc.opcode, op);
		exit(1);
	}
}

static void server(const char *addr, const char *port)
{
	struct ibv_context *ctx;
	struct rpma_peer *peer;
	struct rpma_mr_local *mr;
	struct rpma_ep *ep;
	struct rpma_conn_req *req;
	struct rpma_conn *conn;
	enum rpma_conn_event ev;
	char *buf = aligned_alloc(4096, SIZE);
	EXPECT(buf);
	fill(buf);

	CHECK(rpma_utils_get_ibv_context(addr, RPMA_UTIL_IBV_CONTEXT_LOCAL, &ctx));
	CHECK(rpma_peer_new(ctx, &peer));
	CHECK(rpma_mr_reg(peer, buf, SIZE,
			  RPMA_MR_USAGE_READ_SRC | RPMA_MR_USAGE_WRITE_DST |
				  RPMA_MR_USAGE_FLUSH_TYPE_VISIBILITY,
			  &mr));
	size_t desc_size;
	CHECK(rpma_mr_get_descriptor_size(mr, &desc_size));
	char desc[64];
	EXPECT(desc_size <= sizeof desc);
	CHECK(rpma_mr_get_descriptor(mr, desc));
	struct rpma_conn_private_data pdata = { desc, (uint8_t)desc_size };

	CHECK(rpma_ep_listen(peer, addr, port, &ep));
	printf("listening\n");
	fflush(stdout);
	CHECK(rpma_ep_next_conn_req(ep, NULL, &req));
	CHECK(rpma_conn_req_connect(&req, &pdata, &conn));
	CHECK(rpma_conn_next_event(conn, &ev));
	EXPECT(ev == RPMA_CONN_ESTABLISHED);
	CHECK(rpma_conn_next_event(conn, &ev));
	EXPECT(ev == RPMA_CONN_CLOSED);

	/* What the client wrote is here, the rest untouched. */
	char want[SIZE];
	fill(want);
	memcpy(want + WRITE_AT, WRITTEN, sizeof WRITTEN);
	memcpy(want + ATOMIC_AT, ATOMIC, 8);
	EXPECT(memcmp(buf, want, SIZE) == 0);

	CHECK(rpma_conn_disconnect(conn));
	CHECK(rpma_conn_delete(&conn));
	CHECK(rpma_ep_shutdown(&ep));
	CHECK(rpma_mr_dereg(&mr));
	CHECK(rpma_peer_delete(&peer));
	free(buf);
}

static void client(const char *addr, const char *port)
{
	struct ibv_context *ctx;
	struct rpma_peer *peer;
	struct rpma_mr_local *mr;
	struct rpma_mr_remote *rmr;
	struct rpma_conn_req *req;
	struct rpma_conn *conn;
	enum rpma_conn_event ev;
	char *buf = aligned_alloc(4096, SIZE);
	EXPECT(buf);
	memset(buf, 0, SIZE);

	CHECK(rpma_utils_get_ibv_context(addr, RPMA_UTIL_IBV_CONTEXT_REMOTE, &ctx));
	CHECK(rpma_peer_new(ctx, &peer));
	CHECK(rpma_mr_reg(peer, buf, SIZE, RPMA_MR_USAGE_READ_DST | RPMA_MR_USAGE_WRITE_SRC,
			  &mr));
	CHECK(rpma_conn_req_new(peer, addr, port, NULL, &req));
	CHECK(rpma_conn_req_connect(&req, NULL, &conn));
	CHECK(rpma_conn_next_event(conn, &ev));
	EXPECT(ev == RPMA_CONN_ESTABLISHED);
	struct rpma_conn_private_data pdata;
	CHECK(rpma_conn_get_private_data(conn, &pdata));
	EXPECT(pdata.ptr != NULL);
	CHECK(rpma_mr_remote_from_descriptor(pdata.ptr, pdata.len, &rmr));
	size_t rsize;
	CHECK(rpma_mr_remote_get_size(rmr, &rsize));
	EXPECT(rsize == SIZE);

	/* Read: the server's pattern. */
	char want[SIZE];
	fill(want);
	CHECK(rpma_read(conn, mr, 0, rmr, 0, SIZE, RPMA_F_COMPLETION_ALWAYS, NULL));
	complete(conn, IBV_WC_RDMA_READ);
	EXPECT(memcmp(buf, want, SIZE) == 0);

	/* Write, made visible by a flush. */
	memcpy(buf + WRITE_AT, WRITTEN, sizeof WRITTEN);
	CHECK(rpma_write(conn, rmr, WRITE_AT, mr, WRITE_AT, sizeof WRITTEN,
			 RPMA_F_COMPLETION_ON_ERROR, NULL));
	CHECK(rpma_flush(conn, rmr, WRITE_AT, sizeof WRITTEN, RPMA_FLUSH_TYPE_VISIBILITY,
			 RPMA_F_COMPLETION_ALWAYS, NULL));
	complete(conn, IBV_WC_RDMA_READ);

	/* An atomic 8-byte write, flushed too. */
	CHECK(rpma_atomic_write(conn, rmr, ATOMIC_AT, ATOMIC, RPMA_F_COMPLETION_ON_ERROR, NULL));
	CHECK(rpma_flush(conn, rmr, ATOMIC_AT, 8, RPMA_FLUSH_TYPE_VISIBILITY,
			 RPMA_F_COMPLETION_ALWAYS, NULL));
	complete(conn, IBV_WC_RDMA_READ);

	/* Everything read back. */
	memset(buf, 0, SIZE);
	CHECK(rpma_read(conn, mr, 0, rmr, 0, SIZE, RPMA_F_COMPLETION_ALWAYS, NULL));
	complete(conn, IBV_WC_RDMA_READ);
	memcpy(want + WRITE_AT, WRITTEN, sizeof WRITTEN);
	memcpy(want + ATOMIC_AT, ATOMIC, 8);
	EXPECT(memcmp(buf, want, SIZE) == 0);

	CHECK(rpma_mr_remote_delete(&rmr));
	CHECK(rpma_conn_disconnect(conn));
	CHECK(rpma_conn_next_event(conn, &ev));
	EXPECT(ev == RPMA_CONN_CLOSED);
	CHECK(rpma_conn_delete(&conn));
	CHECK(rpma_mr_dereg(&mr));
	CHECK(rpma_peer_delete(&peer));
	free(buf);
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	role = argv[1];
	signal(SIGALRM, on_alarm);
	alarm(60);
	if (!strcmp(role, "server"))
		server(argv[2], argv[3]);
	else if (!strcmp(role, "client"))
		client(argv[2], argv[3]);
	else
		return 2;
	printf("ok %s\n", role);
	return 0;
}
