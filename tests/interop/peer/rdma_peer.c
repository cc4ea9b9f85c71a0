/*
 * rdma_peer: the kernel-rxe side of ferroce's interop suite. A plain libibverbs program
 * (built against Debian's libibverbs-dev, run unmodified in the guest on rxe0) that holds one
 * RC QP and one memory region and obeys line commands on a TCP connection from the ferroce
 * side, so the ferroce side can drive every operation in both directions and check both ends.
 *
 *   rdma_peer PORT MEMBYTES
 *
 * Commands (one per line; one reply line each):
 *   CONNECT MTU IP QPN PSN RNR_RETRY [RETRY_CNT TIMEOUT]   RTR+RTS towards ferroce (retry_cnt
 *                                      7 and timeout 18 unless given) -> "QP qpn psn rkey addr"
 *   RECV OFF LEN                       post a receive                 -> "OK"
 *   POST OP OFF LEN RADDR RKEY IMM COMPARE_ADD SWAP   post a signaled send WR (OP: send,
 *                                      send_imm, send_inv (IMM: the rkey to invalidate), write,
 *                                      write_imm, read, cas, faa, awrite: ATOMIC WRITE of the 8
 *                                      bytes at OFF through ibv_wr_atomic_write) -> "OK"
 *                                      flush: FLUSH of LEN bytes at RADDR (level IMM: 0 range,
 *                                      1 region; placement type COMPARE_ADD: 1 global, 2
 *                                      persistent) through the extended QP's wr_flush
 *   CAPS                               -> "CAPS awrite A kernel RELEASE flush F": A 1 if the QP
 *                                      was made with ATOMIC WRITE among its send ops (rdma-core
 *                                      >= 43), F 1 if the region grants FLUSH_GLOBAL and the QP
 *                                      was made with FLUSH (kernel >= 6.2, rdma-core >= 45)
 *   BINDMW OFF LEN [ZB]                bind a type 2 window (allocated once) over the region's
 *                                      OFF..OFF+LEN for remote WRITE with a BIND_MW WR on the
 *                                      QP (its completion comes through WC); ZB 1: zero based
 *                                      (peers address it by offset) -> "OK rkey"
 *   WC                                 wait (<= 120 s) for a completion
 *                                      -> "WC wr_id status opcode byte_len imm flags inv" or
 *                                      "NONE" (inv: the imm/invalidated_rkey union, host order)
 *   FILL OFF LEN SEED                  byte i = (i*31 + SEED) & 255   -> "OK"
 *   HASH OFF LEN                       FNV-1a 64 of the bytes         -> "HASH hex"
 *   LOAD OFF                           the host-order u64 there       -> "VAL n"
 *   STATE                              the QP's state (ibv_query_qp)  -> "STATE n" (6: ERR)
 *   RESET                              destroy the QP and make a fresh one in INIT -> "OK qpn"
 *   COUNTERS                           the port's hw_counters duplicate_request and
 *                                      out_of_seq_request (sysfs; -1 if unreadable)
 *                                      -> "CNT dup ooo"
 *   QUIT
 */
#include <arpa/inet.h>
#include <infiniband/verbs.h>
#include <netinet/in.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/utsname.h>
#include <time.h>
#include <unistd.h>

static struct ibv_context *ctx;
static struct ibv_pd *pd;
static struct ibv_mr *mr;
static struct ibv_cq *cq;
static struct ibv_qp *qp;
static uint8_t *buf;
static size_t len;
static uint64_t next_id = 1;
static struct ibv_mw *mw;
/* The QP as an extended QP when it was made with ATOMIC WRITE among its send ops, else NULL. */
static struct ibv_qp_ex *qpx;
/* IBV_ACCESS_FLUSH_GLOBAL and IBV_QP_EX_WITH_FLUSH (rdma-core 45; the peer is built against
 * 44's header, which has neither). */
#define PEER_ACCESS_FLUSH_GLOBAL (1 << 8)
#define PEER_ACCESS_FLUSH_PERSISTENT (1 << 9)
#define PEER_QP_EX_WITH_FLUSH (1 << 11)
/* Whether the region grants FLUSH_GLOBAL (the kernel took the bit), and whether the QP was made
 * with FLUSH among its send ops. */
static int flush_mr, flush_qp;
/* ibv_wr_flush: the slot rdma-core 45 appended to struct ibv_qp_ex, right after the last one
 * 44's header knows (wr_atomic_write), so at the end of 44's struct. */
typedef void (*wr_flush_fn)(struct ibv_qp_ex *, uint32_t, uint64_t, size_t, uint8_t, uint8_t);
static wr_flush_fn wr_flush_of(struct ibv_qp_ex *q) {
	wr_flush_fn f;
	memcpy(&f, (char *)q + sizeof(struct ibv_qp_ex), sizeof f);
	return f;
}

static void die(const char *what) {
	perror(what);
	exit(1);
}

static int make_qp(void) {
	struct ibv_qp_init_attr ia = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC,
				      .cap = {.max_send_wr = 64, .max_recv_wr = 64, .max_send_sge = 1, .max_recv_sge = 1}};
	/* ATOMIC WRITE is posted through the extended QP (ibv_wr_atomic_write); a userland or
	 * provider without it refuses such a QP, and the plain one is made instead. */
	struct ibv_qp_init_attr_ex ix = {.send_cq = cq, .recv_cq = cq, .qp_type = IBV_QPT_RC, .cap = ia.cap, .pd = pd,
					 .comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS,
					 .send_ops_flags = IBV_QP_EX_WITH_SEND | IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_ATOMIC_WRITE};
	qpx = NULL;
	qp = NULL;
	flush_qp = 0;
	if (flush_mr) {
		ix.send_ops_flags |= PEER_QP_EX_WITH_FLUSH;
		qp = ibv_create_qp_ex(ctx, &ix);
		flush_qp = qp != NULL;
		ix.send_ops_flags &= ~(uint64_t)PEER_QP_EX_WITH_FLUSH;
	}
	if (!qp)
		qp = ibv_create_qp_ex(ctx, &ix);
	if (qp)
		qpx = ibv_qp_to_qp_ex(qp);
	else
		qp = ibv_create_qp(pd, &ia);
	if (!qp)
		return -1;
	struct ibv_qp_attr a = {.qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				.qp_access_flags = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC |
						   (flush_mr ? PEER_ACCESS_FLUSH_GLOBAL | PEER_ACCESS_FLUSH_PERSISTENT : 0)};
	return ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT | IBV_QP_ACCESS_FLAGS);
}

static int find_rxe(void) {
	int n;
	struct ibv_device **list = ibv_get_device_list(&n);
	if (!list || n == 0)
		return -1;
	ctx = ibv_open_device(list[0]);
	ibv_free_device_list(list);
	return ctx ? 0 : -1;
}

static int connect_qp(int mtu, const char *ip, uint32_t qpn, uint32_t psn, int rnr_retry, int retry_cnt, int timeout, uint32_t my_psn) {
	struct ibv_qp_attr a;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = mtu == 4096 ? IBV_MTU_4096 : mtu == 2048 ? IBV_MTU_2048 : mtu == 512 ? IBV_MTU_512 : mtu == 256 ? IBV_MTU_256 : IBV_MTU_1024;
	a.dest_qp_num = qpn;
	a.rq_psn = psn;
	a.max_dest_rd_atomic = 16;
	a.min_rnr_timer = 12;
	a.ah_attr.is_global = 1;
	a.ah_attr.port_num = 1;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 64;
	struct in_addr v4;
	if (inet_pton(AF_INET, ip, &v4) != 1)
		return -1;
	memset(a.ah_attr.grh.dgid.raw, 0, 16);
	a.ah_attr.grh.dgid.raw[10] = 0xff;
	a.ah_attr.grh.dgid.raw[11] = 0xff;
	memcpy(&a.ah_attr.grh.dgid.raw[12], &v4, 4);
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN | IBV_QP_RQ_PSN |
				  IBV_QP_MAX_DEST_RD_ATOMIC | IBV_QP_MIN_RNR_TIMER))
		return -2;
	memset(&a, 0, sizeof a);
	a.qp_state = IBV_QPS_RTS;
	a.timeout = timeout;
	a.retry_cnt = retry_cnt;
	a.rnr_retry = rnr_retry;
	a.sq_psn = my_psn;
	a.max_rd_atomic = 16;
	if (ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT | IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN |
				  IBV_QP_MAX_QP_RD_ATOMIC))
		return -3;
	return 0;
}

static long long hw_counter(const char *name) {
	char path[256];
	snprintf(path, sizeof path, "/sys/class/infiniband/%s/ports/1/hw_counters/%s", ibv_get_device_name(ctx->device), name);
	FILE *f = fopen(path, "r");
	long long v = -1;
	if (f) {
		if (fscanf(f, "%lld", &v) != 1)
			v = -1;
		fclose(f);
	}
	return v;
}

static uint64_t fnv(const uint8_t *p, size_t n) {
	uint64_t h = 0xcbf29ce484222325ULL;
	for (size_t i = 0; i < n; i++) {
		h ^= p[i];
		h *= 0x100000001b3ULL;
	}
	return h;
}

static int post(const char *op, size_t off, uint32_t n, uint64_t raddr, uint32_t rkey, uint32_t imm, uint64_t ca, uint64_t swap) {
	struct ibv_sge sge = {.addr = (uintptr_t)(buf + off), .length = n, .lkey = mr->lkey};
	struct ibv_send_wr wr, *bad;
	memset(&wr, 0, sizeof wr);
	wr.wr_id = next_id++;
	wr.sg_list = &sge;
	wr.num_sge = 1;
	wr.send_flags = IBV_SEND_SIGNALED;
	wr.imm_data = htonl(imm);
	wr.wr.rdma.remote_addr = raddr;
	wr.wr.rdma.rkey = rkey;
	if (!strcmp(op, "awrite")) {
		if (!qpx)
			return -1;
		ibv_wr_start(qpx);
		qpx->wr_id = wr.wr_id;
		qpx->wr_flags = IBV_SEND_SIGNALED;
		ibv_wr_atomic_write(qpx, rkey, raddr, buf + off);
		return ibv_wr_complete(qpx);
	}
	if (!strcmp(op, "flush")) {
		if (!qpx || !flush_qp || !wr_flush_of(qpx))
			return -1;
		ibv_wr_start(qpx);
		qpx->wr_id = wr.wr_id;
		qpx->wr_flags = IBV_SEND_SIGNALED;
		wr_flush_of(qpx)(qpx, rkey, raddr, n, (uint8_t)ca, (uint8_t)imm);
		return ibv_wr_complete(qpx);
	}
	if (!strcmp(op, "send"))
		wr.opcode = IBV_WR_SEND;
	else if (!strcmp(op, "send_inv")) {
		wr.opcode = IBV_WR_SEND_WITH_INV;
		wr.invalidate_rkey = imm;
	} else if (!strcmp(op, "send_imm"))
		wr.opcode = IBV_WR_SEND_WITH_IMM;
	else if (!strcmp(op, "write"))
		wr.opcode = IBV_WR_RDMA_WRITE;
	else if (!strcmp(op, "write_imm"))
		wr.opcode = IBV_WR_RDMA_WRITE_WITH_IMM;
	else if (!strcmp(op, "read"))
		wr.opcode = IBV_WR_RDMA_READ;
	else if (!strcmp(op, "cas") || !strcmp(op, "faa")) {
		wr.opcode = op[0] == 'c' ? IBV_WR_ATOMIC_CMP_AND_SWP : IBV_WR_ATOMIC_FETCH_AND_ADD;
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
		wr.wr.atomic.compare_add = ca;
		wr.wr.atomic.swap = swap;
	} else
		return -1;
	return ibv_post_send(qp, &wr, &bad);
}

int main(int argc, char **argv) {
	if (argc != 3) {
		fprintf(stderr, "usage: rdma_peer PORT MEMBYTES\n");
		return 2;
	}
	len = strtoull(argv[2], NULL, 0);
	if (find_rxe())
		die("no RDMA device");
	pd = ibv_alloc_pd(ctx);
	buf = aligned_alloc(4096, (len + 4095) / 4096 * 4096);
	if (!pd || !buf)
		die("pd/buf");
	memset(buf, 0, len);
	int rights = IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC | IBV_ACCESS_MW_BIND;
	/* FLUSH_GLOBAL where the kernel has it (6.2 and later); older ones refuse the bit. */
	mr = ibv_reg_mr(pd, buf, len, rights | PEER_ACCESS_FLUSH_GLOBAL);
	flush_mr = mr != NULL;
	if (!mr)
		mr = ibv_reg_mr(pd, buf, len, rights);
	cq = ibv_create_cq(ctx, 256, NULL, NULL, 0);
	if (!mr || !cq)
		die("mr/cq");
	if (make_qp())
		die("qp");
	int ls = socket(AF_INET, SOCK_STREAM, 0), one = 1;
	setsockopt(ls, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
	struct sockaddr_in sa = {.sin_family = AF_INET, .sin_port = htons(atoi(argv[1])), .sin_addr.s_addr = INADDR_ANY};
	if (bind(ls, (struct sockaddr *)&sa, sizeof sa) || listen(ls, 1))
		die("listen");
	printf("LISTENING\n");
	fflush(stdout);
	int s = accept(ls, NULL, NULL);
	if (s < 0)
		die("accept");
	FILE *in = fdopen(s, "r"), *out = fdopen(dup(s), "w");
	char line[512], op[32], ip[64];
	uint32_t my_psn = (uint32_t)(time(NULL) * 2654435761u) & 0xffffff;
	while (fgets(line, sizeof line, in)) {
		size_t off, n;
		int zb;
		unsigned long long raddr, ca, swap, seed;
		unsigned int rkey, imm, qpn, psn, mtu, rnr, retry_cnt = 7, timeout = 18;
		if (sscanf(line, "CONNECT %u %63s %u %u %u %u %u", &mtu, ip, &qpn, &psn, &rnr, &retry_cnt, &timeout) >= 5) {
			int r = connect_qp(mtu, ip, qpn, psn, rnr, (int)retry_cnt, (int)timeout, my_psn);
			if (r)
				fprintf(out, "ERR connect %d\n", r);
			else
				fprintf(out, "QP %u %u %u %llu\n", qp->qp_num, my_psn, mr->rkey, (unsigned long long)(uintptr_t)buf);
		} else if (sscanf(line, "RECV %zu %zu", &off, &n) == 2) {
			struct ibv_sge sge = {.addr = (uintptr_t)(buf + off), .length = (uint32_t)n, .lkey = mr->lkey};
			struct ibv_recv_wr wr = {.wr_id = next_id++, .sg_list = &sge, .num_sge = 1}, *bad;
			fprintf(out, ibv_post_recv(qp, &wr, &bad) ? "ERR recv\n" : "OK\n");
		} else if (sscanf(line, "POST %31s %zu %zu %llu %u %u %llu %llu", op, &off, &n, &raddr, &rkey, &imm, &ca, &swap) == 8) {
			fprintf(out, post(op, off, (uint32_t)n, raddr, rkey, imm, ca, swap) ? "ERR post\n" : "OK\n");
		} else if ((zb = 0, sscanf(line, "BINDMW %zu %zu %d", &off, &n, &zb)) >= 2) {
			if (!mw)
				mw = ibv_alloc_mw(pd, IBV_MW_TYPE_2);
			uint32_t nk = mw ? ibv_inc_rkey(mw->rkey) : 0;
			struct ibv_send_wr wr = {.wr_id = next_id++, .opcode = IBV_WR_BIND_MW, .send_flags = IBV_SEND_SIGNALED}, *bad;
			if (mw) {
				wr.bind_mw.mw = mw;
				wr.bind_mw.rkey = nk;
				wr.bind_mw.bind_info.mr = mr;
				wr.bind_mw.bind_info.addr = (uintptr_t)(buf + off);
				wr.bind_mw.bind_info.length = n;
				wr.bind_mw.bind_info.mw_access_flags =
					IBV_ACCESS_REMOTE_WRITE | (zb ? IBV_ACCESS_ZERO_BASED : 0);
			}
			if (!mw || ibv_post_send(qp, &wr, &bad))
				fprintf(out, "ERR bindmw\n");
			else {
				mw->rkey = nk;
				fprintf(out, "OK %u\n", nk);
			}
		} else if (!strncmp(line, "CAPS", 4)) {
			struct utsname u;
			if (uname(&u))
				strcpy(u.release, "unknown");
			fprintf(out, "CAPS awrite %d kernel %s flush %d\n", qpx != NULL, u.release, flush_qp);
		} else if (!strncmp(line, "WC", 2)) {
			struct ibv_wc wc;
			int got = 0;
			/* 120 s by the clock: an emulated guest's usleep(100) takes far longer than
			 * 100 us, and a count of sleeps outlasted the matrix's own timeout. */
			struct timespec t0, t;
			clock_gettime(CLOCK_MONOTONIC, &t0);
			for (;;) {
				got = ibv_poll_cq(cq, 1, &wc);
				if (got)
					break;
				clock_gettime(CLOCK_MONOTONIC, &t);
				if (t.tv_sec - t0.tv_sec >= 120)
					break;
				usleep(100);
			}
			if (got == 1)
				fprintf(out, "WC %llu %d %d %u %u %u %u\n", (unsigned long long)wc.wr_id, wc.status, wc.opcode, wc.byte_len,
					(wc.wc_flags & IBV_WC_WITH_IMM) ? ntohl(wc.imm_data) : 0,
					wc.wc_flags, wc.invalidated_rkey);
			else
				fprintf(out, "NONE\n");
		} else if (sscanf(line, "FILL %zu %zu %llu", &off, &n, &seed) == 3) {
			for (size_t i = 0; i < n; i++)
				buf[off + i] = (uint8_t)((i * 31 + seed) & 255);
			fprintf(out, "OK\n");
		} else if (sscanf(line, "HASH %zu %zu", &off, &n) == 2) {
			fprintf(out, "HASH %016llx\n", (unsigned long long)fnv(buf + off, n));
		} else if (sscanf(line, "LOAD %zu", &off) == 1) {
			uint64_t v;
			memcpy(&v, buf + off, 8);
			fprintf(out, "VAL %llu\n", (unsigned long long)v);
		} else if (!strncmp(line, "STATE", 5)) {
			struct ibv_qp_attr a;
			struct ibv_qp_init_attr ia;
			if (ibv_query_qp(qp, &a, IBV_QP_STATE, &ia))
				fprintf(out, "ERR query\n");
			else
				fprintf(out, "STATE %d\n", (int)a.qp_state);
		} else if (!strncmp(line, "RESET", 5)) {
			struct ibv_wc wc;
			ibv_destroy_qp(qp);
			while (ibv_poll_cq(cq, 1, &wc) > 0)
				;
			if (make_qp())
				fprintf(out, "ERR reset\n");
			else
				fprintf(out, "OK %u\n", qp->qp_num);
		} else if (!strncmp(line, "COUNTERS", 8)) {
			fprintf(out, "CNT %lld %lld\n", hw_counter("duplicate_request"), hw_counter("out_of_seq_request"));
		} else if (!strncmp(line, "QUIT", 4)) {
			break;
		} else {
			fprintf(out, "ERR unknown command\n");
		}
		fflush(out);
	}
	return 0;
}
