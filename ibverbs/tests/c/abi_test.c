/* A verbs program of ours that exercises ferroce's libibverbs ABI in one process: two devices
   (FERROCE_DEVICES=a,b), a pair of RC QPs between them, every operation with data and
   completion checks, completion events, and the error paths verbs defines. Built against
   Debian's libibverbs-dev and linked with -libverbs like any program; run with
   LD_LIBRARY_PATH pointing at ferroce's libibverbs.so.1. Prints "abi_test OK: N checks". */
#include <arpa/inet.h>
#include <dlfcn.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>
#include <infiniband/verbs.h>

static int checks;

#define CHECK(cond, ...)                                                        \
	do {                                                                    \
		checks++;                                                       \
		if (!(cond)) {                                                  \
			fprintf(stderr, "FAIL line %d: %s: ", __LINE__, #cond); \
			fprintf(stderr, __VA_ARGS__);                           \
			fprintf(stderr, "\n");                                  \
			exit(1);                                                \
		}                                                               \
	} while (0)

#define LEN (1 << 20)
#define ACCESS (IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | \
		IBV_ACCESS_REMOTE_ATOMIC)

struct side {
	struct ibv_context *ctx;
	struct ibv_pd *pd;
	struct ibv_comp_channel *ch;
	struct ibv_cq *cq;
	struct ibv_qp *qp;
	struct ibv_mr *mr;
	uint8_t *buf;
	union ibv_gid gid;
};

static struct ibv_wc wait_wc(struct ibv_cq *cq)
{
	struct ibv_wc wc;
	struct timespec t0, t;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	for (;;) {
		int n = ibv_poll_cq(cq, 1, &wc);
		if (n == 1)
			return wc;
		clock_gettime(CLOCK_MONOTONIC, &t);
		if (n < 0 || t.tv_sec - t0.tv_sec >= 20)
			CHECK(0, "poll_cq gave %d, or no completion within 20 s", n);
	}
}

static struct ibv_qp *make_qp(struct side *s)
{
	struct ibv_qp_init_attr ia = {
		.send_cq = s->cq, .recv_cq = s->cq, .qp_type = IBV_QPT_RC, .qp_context = s,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2,
			 .max_inline_data = 64 },
	};
	struct ibv_qp *qp = ibv_create_qp(s->pd, &ia);
	CHECK(qp, "create_qp errno %d", errno);
	CHECK(qp->qp_num > 0 && qp->state == IBV_QPS_RESET && qp->qp_context == s, "qp fields");
	return qp;
}

static void connect_qp(struct ibv_qp *qp, uint32_t dest_qpn, union ibv_gid *dgid)
{
	struct ibv_qp_attr a = { .qp_state = IBV_QPS_INIT, .pkey_index = 0, .port_num = 1,
				 .qp_access_flags = ACCESS };
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					   IBV_QP_ACCESS_FLAGS) == 0, "INIT");
	memset(&a, 0, sizeof(a));
	a.qp_state = IBV_QPS_RTR;
	a.path_mtu = IBV_MTU_1024;
	a.dest_qp_num = dest_qpn;
	a.rq_psn = 100;
	a.max_dest_rd_atomic = 4;
	a.min_rnr_timer = 1;
	a.ah_attr.is_global = 1;
	a.ah_attr.grh.dgid = *dgid;
	a.ah_attr.grh.sgid_index = 1;
	a.ah_attr.grh.hop_limit = 1;
	a.ah_attr.port_num = 1;
	/* RTR without MIN_RNR_TIMER: the transition requires it. */
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC) == EINVAL,
	      "RTR with a missing attribute is EINVAL");
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_AV | IBV_QP_PATH_MTU | IBV_QP_DEST_QPN |
					   IBV_QP_RQ_PSN | IBV_QP_MAX_DEST_RD_ATOMIC |
					   IBV_QP_MIN_RNR_TIMER) == 0, "RTR");
	a.qp_state = IBV_QPS_RTS;
	a.sq_psn = 100;
	a.timeout = 12;
	a.retry_cnt = 7;
	a.rnr_retry = 7;
	a.max_rd_atomic = 4;
	CHECK(ibv_modify_qp(qp, &a, IBV_QP_STATE | IBV_QP_TIMEOUT | IBV_QP_RETRY_CNT |
					   IBV_QP_RNR_RETRY | IBV_QP_SQ_PSN | IBV_QP_MAX_QP_RD_ATOMIC) == 0,
	      "RTS");
	CHECK(qp->state == IBV_QPS_RTS, "qp->state follows");
}

static void setup(struct side *s, struct ibv_device *dev)
{
	s->ctx = ibv_open_device(dev);
	CHECK(s->ctx, "open_device errno %d", errno);
	s->pd = ibv_alloc_pd(s->ctx);
	CHECK(s->pd, "alloc_pd");
	s->buf = aligned_alloc(4096, LEN);
	memset(s->buf, 0, LEN);
	s->mr = ibv_reg_mr(s->pd, s->buf, LEN, ACCESS);
	CHECK(s->mr && s->mr->addr == s->buf && s->mr->length == LEN, "reg_mr errno %d", errno);
	s->ch = ibv_create_comp_channel(s->ctx);
	CHECK(s->ch && s->ch->fd >= 0, "comp channel");
	s->cq = ibv_create_cq(s->ctx, 64, s, s->ch, 0);
	CHECK(s->cq && s->cq->cqe >= 64 && s->cq->cq_context == s, "create_cq");
	CHECK(ibv_query_gid(s->ctx, 1, 1, &s->gid) == 0, "query_gid");
	s->qp = make_qp(s);
}

static void post(struct ibv_qp *qp, enum ibv_wr_opcode op, uint64_t wr_id, void *addr,
		 uint32_t len, uint32_t lkey, uint64_t raddr, uint32_t rkey)
{
	struct ibv_sge sge = { .addr = (uintptr_t)addr, .length = len, .lkey = lkey };
	struct ibv_send_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1, .opcode = op,
				  .send_flags = IBV_SEND_SIGNALED }, *bad = NULL;
	if (op == IBV_WR_ATOMIC_CMP_AND_SWP || op == IBV_WR_ATOMIC_FETCH_AND_ADD) {
		wr.wr.atomic.remote_addr = raddr;
		wr.wr.atomic.rkey = rkey;
	} else {
		wr.wr.rdma.remote_addr = raddr;
		wr.wr.rdma.rkey = rkey;
	}
	wr.imm_data = htonl(0x12345678);
	CHECK(ibv_post_send(qp, &wr, &bad) == 0 && !bad, "post_send op %d", op);
}

static void post_recv(struct side *s, uint64_t wr_id, uint32_t off, uint32_t len)
{
	struct ibv_sge sge = { .addr = (uintptr_t)(s->buf + off), .length = len, .lkey = s->mr->lkey };
	struct ibv_recv_wr wr = { .wr_id = wr_id, .sg_list = &sge, .num_sge = 1 }, *bad = NULL;
	CHECK(ibv_post_recv(s->qp, &wr, &bad) == 0, "post_recv");
}

/* Threads: one posts, one polls, the main thread queries the QP meanwhile. */
#define THREADED_WRS 3000
struct threaded {
	struct ibv_qp *qp;
	struct ibv_cq *cq;
	struct side *a, *b;
	int bad_order, errors, done, polled;
};

static void *poster(void *arg)
{
	struct threaded *t = arg;
	for (int i = 0; i < THREADED_WRS; i++) {
		struct ibv_sge sge = { (uintptr_t)t->a->buf + (i % 64) * 64, 64, t->a->mr->lkey };
		struct ibv_send_wr wr = { .wr_id = 1000 + i, .sg_list = &sge, .num_sge = 1,
					  .opcode = IBV_WR_RDMA_WRITE,
					  .send_flags = IBV_SEND_SIGNALED }, *bad;
		wr.wr.rdma.remote_addr = (uintptr_t)t->b->buf + 900000 + (i % 64) * 64;
		wr.wr.rdma.rkey = t->b->mr->rkey;
		int r;
		/* Never more unpolled completions than the CQ holds (64): overrunning a CQ is the
		   program's error in verbs (IBV_EVENT_CQ_ERR, completions lost). */
		while (i - __atomic_load_n(&t->polled, __ATOMIC_SEQ_CST) >= 60)
			sched_yield();
		while ((r = ibv_post_send(t->qp, &wr, &bad)) == ENOMEM)
			sched_yield();
		if (r) {
			__atomic_add_fetch(&t->errors, 1, __ATOMIC_SEQ_CST);
			return NULL;
		}
	}
	return NULL;
}

static void *poller(void *arg)
{
	struct threaded *t = arg;
	uint64_t next = 1000;
	struct ibv_wc wc[8];
	struct timespec t0, t1;
	clock_gettime(CLOCK_MONOTONIC, &t0);
	while (next < 1000 + THREADED_WRS) {
		int n = ibv_poll_cq(t->cq, 8, wc);
		for (int i = 0; i < n; i++) {
			if (wc[i].status != IBV_WC_SUCCESS)
				__atomic_add_fetch(&t->errors, 1, __ATOMIC_SEQ_CST);
			if (wc[i].wr_id != next) {
				if (t->bad_order < 5)
					fprintf(stderr, "out of order: expected %llu got %llu (batch %d/%d)\n",
						(unsigned long long)next,
						(unsigned long long)wc[i].wr_id, i, n);
				t->bad_order++;
			}
			next = wc[i].wr_id + 1;
		}
		__atomic_add_fetch(&t->polled, n, __ATOMIC_SEQ_CST);
		clock_gettime(CLOCK_MONOTONIC, &t1);
		if (t1.tv_sec - t0.tv_sec > 60) {
			__atomic_add_fetch(&t->errors, 1, __ATOMIC_SEQ_CST);
			break;
		}
	}
	__atomic_store_n(&t->done, 1, __ATOMIC_SEQ_CST);
	return NULL;
}

/* An async-event handler that takes its time: gets one event, reads the CQ it names after a
   pause (which must still be allocated), then acknowledges it. */
struct handler {
	struct ibv_context *ctx;
	struct ibv_async_event ev;
	int got, acked;
};

static void *slow_event_handler(void *arg)
{
	struct handler *h = arg;
	if (ibv_get_async_event(h->ctx, &h->ev) != 0)
		return NULL;
	__atomic_store_n(&h->got, 1, __ATOMIC_SEQ_CST);
	usleep(300 * 1000);
	volatile int cqe = h->ev.element.cq->cqe; /* the CQ is still there */
	(void)cqe;
	__atomic_store_n(&h->acked, 1, __ATOMIC_SEQ_CST);
	ibv_ack_async_event(&h->ev);
	return NULL;
}

/* Acknowledges one completion event of a CQ after a pause. */
struct cq_acker {
	struct ibv_cq *cq;
	int acked;
};

static void *slow_cq_acker(void *arg)
{
	struct cq_acker *k = arg;
	usleep(300 * 1000);
	volatile int cqe = k->cq->cqe;
	(void)cqe;
	__atomic_store_n(&k->acked, 1, __ATOMIC_SEQ_CST);
	ibv_ack_cq_events(k->cq, 1);
	return NULL;
}

int main(void)
{
	int n = 0;
	struct ibv_device **list = ibv_get_device_list(&n);
	CHECK(list && n == 2 && list[2] == NULL, "two devices from FERROCE_DEVICES, got %d", n);
	CHECK(strcmp(ibv_get_device_name(list[0]), "ferroce0") == 0, "name %s",
	      ibv_get_device_name(list[0]));
	CHECK(strcmp(ibv_get_device_name(list[1]), "ferroce1") == 0, "name 1");
	CHECK(ibv_get_device_guid(list[0]) != 0, "guid");
	CHECK(list[0]->transport_type == IBV_TRANSPORT_IB && list[0]->node_type == IBV_NODE_CA,
	      "device types");

	struct side a = { 0 }, b = { 0 };
	setup(&a, list[0]);
	setup(&b, list[1]);
	ibv_free_device_list(list);

	/* Queries. */
	struct ibv_device_attr da;
	CHECK(ibv_query_device(a.ctx, &da) == 0 && da.max_qp > 0 && da.phys_port_cnt == 1 &&
		      da.atomic_cap == IBV_ATOMIC_HCA, "query_device");
	CHECK(da.max_mcast_grp == 8192 && da.max_mcast_qp_attach == 56 &&
		      da.max_total_mcast_qp_attach == 8192 * 56, "multicast limits as rxe's");
	CHECK(da.node_guid == ibv_get_device_guid(a.ctx->device) && da.node_guid != 0,
	      "node_guid is the device's GUID");
	struct ibv_device_attr_ex dx;
	CHECK(ibv_query_device_ex(a.ctx, NULL, &dx) == 0 && dx.orig_attr.max_qp == da.max_qp,
	      "query_device_ex");
	/* IB_UVERBS_DEVICE_FLUSH_GLOBAL (bit 38) and ATOMIC_WRITE (bit 40), as rxe 6.2+; not
	 * FLUSH_PERSISTENT (bit 39); the low word is device_cap_flags. */
	CHECK((dx.device_cap_flags_ex >> 38 & 7) == 5 &&
		      (uint32_t)dx.device_cap_flags_ex == da.device_cap_flags,
	      "device_cap_flags_ex: %#llx", (unsigned long long)dx.device_cap_flags_ex);
	struct ibv_port_attr pa;
	CHECK(ibv_query_port(a.ctx, 1, &pa) == 0 && pa.state == IBV_PORT_ACTIVE &&
		      pa.link_layer == IBV_LINK_LAYER_ETHERNET && pa.gid_tbl_len == 2,
	      "query_port");
	CHECK(ibv_query_port(a.ctx, 2, &pa) != 0, "port 2 does not exist");
	CHECK(a.gid.raw[10] == 0xff && a.gid.raw[11] == 0xff, "GID 1 is IPv4-mapped");
	struct ibv_gid_entry ge;
	CHECK(ibv_query_gid_ex(a.ctx, 1, 1, &ge, 0) == 0 && ge.gid_type == IBV_GID_TYPE_ROCE_V2 &&
		      memcmp(&ge.gid, &a.gid, 16) == 0, "query_gid_ex");
	struct ibv_gid_entry tbl[4];
	CHECK(ibv_query_gid_table(a.ctx, tbl, 4, 0) == 2, "query_gid_table");
	uint16_t pkey;
	CHECK(ibv_query_pkey(a.ctx, 1, 0, &pkey) == 0 && pkey == 0xffff, "query_pkey");

	connect_qp(a.qp, b.qp->qp_num, &b.gid);
	connect_qp(b.qp, a.qp->qp_num, &a.gid);
	struct ibv_qp_attr qa;
	struct ibv_qp_init_attr qia;
	CHECK(ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qia) == 0 && qa.qp_state == IBV_QPS_RTS &&
		      qa.dest_qp_num == b.qp->qp_num && qa.path_mtu == IBV_MTU_1024 &&
		      qa.retry_cnt == 7 && qia.send_cq == a.cq && qia.sq_sig_all == 0, "query_qp");
	{
		struct ibv_qp_init_attr sa = {
			.send_cq = a.cq, .recv_cq = a.cq, .qp_type = IBV_QPT_RC, .sq_sig_all = 1,
			.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		};
		struct ibv_qp *sq = ibv_create_qp(a.pd, &sa);
		CHECK(sq && ibv_query_qp(sq, &qa, IBV_QP_STATE, &qia) == 0 && qia.sq_sig_all == 1,
		      "query_qp reports sq_sig_all as created");
		CHECK(ibv_destroy_qp(sq) == 0, "destroy sq_sig_all QP");
	}

	/* RDMA WRITE 64 KiB a -> b, then READ it back into another part of a. */
	for (int i = 0; i < 65536; i++)
		a.buf[i] = (uint8_t)(i * 7 + 3);
	post(a.qp, IBV_WR_RDMA_WRITE, 1, a.buf, 65536, a.mr->lkey, (uintptr_t)b.buf, b.mr->rkey);
	struct ibv_wc wc = wait_wc(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 1 && wc.opcode == IBV_WC_RDMA_WRITE &&
		      wc.qp_num == a.qp->qp_num, "write wc %s", ibv_wc_status_str(wc.status));
	CHECK(memcmp(a.buf, b.buf, 65536) == 0, "written bytes");
	post(a.qp, IBV_WR_RDMA_READ, 2, a.buf + 65536, 65536, a.mr->lkey, (uintptr_t)b.buf,
	     b.mr->rkey);
	wc = wait_wc(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_RDMA_READ && wc.byte_len == 65536,
	      "read wc");
	CHECK(memcmp(a.buf, a.buf + 65536, 65536) == 0, "read bytes");

	/* SEND_WITH_IMM: receive completion with byte_len, imm in network order, flags. */
	post_recv(&b, 77, 200000, 5000);
	post(a.qp, IBV_WR_SEND_WITH_IMM, 3, a.buf, 3000, a.mr->lkey, 0, 0);
	CHECK(wait_wc(a.cq).status == IBV_WC_SUCCESS, "send wc");
	wc = wait_wc(b.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.wr_id == 77 && wc.opcode == IBV_WC_RECV &&
		      wc.byte_len == 3000 && (wc.wc_flags & IBV_WC_WITH_IMM) &&
		      ntohl(wc.imm_data) == 0x12345678 && wc.src_qp == a.qp->qp_num,
	      "recv wc: opcode %d len %u flags %u imm %x", wc.opcode, wc.byte_len, wc.wc_flags,
	      ntohl(wc.imm_data));
	CHECK(memcmp(a.buf, b.buf + 200000, 3000) == 0, "sent bytes");

	/* IBV_SEND_INLINE from a stack buffer with no lkey: read at post time, lkey ignored. */
	char note[48];
	snprintf(note, sizeof(note), "inline bytes from the stack %d", 42);
	struct ibv_sge isge = { .addr = (uintptr_t)note, .length = sizeof(note), .lkey = 0 };
	struct ibv_send_wr iwr = { .wr_id = 6, .sg_list = &isge, .num_sge = 1, .opcode = IBV_WR_SEND,
				   .send_flags = IBV_SEND_SIGNALED | IBV_SEND_INLINE }, *ibad;
	post_recv(&b, 79, 250000, 100);
	int ir = ibv_post_send(a.qp, &iwr, &ibad);
	CHECK(ir == 0, "post inline: %d", ir);
	memset(note, 0, sizeof(note)); /* verbs: the buffer is free once post_send returns */
	CHECK(wait_wc(a.cq).status == IBV_WC_SUCCESS, "inline send wc");
	wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 79 && wc.byte_len == sizeof(note) &&
		      strcmp((char *)b.buf + 250000, "inline bytes from the stack 42") == 0,
	      "inline bytes received: %.48s", (char *)b.buf + 250000);

	/* RDMA_WRITE_WITH_IMM consumes a receive and reports RECV_RDMA_WITH_IMM. */
	post_recv(&b, 78, 0, 0);
	post(a.qp, IBV_WR_RDMA_WRITE_WITH_IMM, 4, a.buf, 100, a.mr->lkey, (uintptr_t)b.buf + 300000,
	     b.mr->rkey);
	CHECK(wait_wc(a.cq).status == IBV_WC_SUCCESS, "write imm wc");
	wc = wait_wc(b.cq);
	CHECK(wc.opcode == IBV_WC_RECV_RDMA_WITH_IMM && wc.wr_id == 78 &&
		      ntohl(wc.imm_data) == 0x12345678, "write-with-imm recv wc");

	/* Atomics: CMP_SWAP then FETCH_ADD, originals returned into a. */
	uint64_t *target = (uint64_t *)(b.buf + 400000), *orig = (uint64_t *)(a.buf + 400000);
	*target = 5;
	struct ibv_sge sge = { .addr = (uintptr_t)orig, .length = 8, .lkey = a.mr->lkey };
	struct ibv_send_wr wr = { .wr_id = 5, .sg_list = &sge, .num_sge = 1,
				  .opcode = IBV_WR_ATOMIC_CMP_AND_SWP,
				  .send_flags = IBV_SEND_SIGNALED }, *bad;
	wr.wr.atomic.remote_addr = (uintptr_t)target;
	wr.wr.atomic.rkey = b.mr->rkey;
	wr.wr.atomic.compare_add = 5;
	wr.wr.atomic.swap = 40;
	CHECK(ibv_post_send(a.qp, &wr, &bad) == 0, "post cmp_swap");
	wc = wait_wc(a.cq);
	CHECK(wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_COMP_SWAP && *orig == 5 &&
		      *target == 40, "cmp_swap: orig %llu target %llu", (unsigned long long)*orig,
	      (unsigned long long)*target);
	wr.opcode = IBV_WR_ATOMIC_FETCH_AND_ADD;
	wr.wr.atomic.compare_add = 2;
	CHECK(ibv_post_send(a.qp, &wr, &bad) == 0, "post fetch_add");
	wc = wait_wc(a.cq);
	CHECK(wc.opcode == IBV_WC_FETCH_ADD && *orig == 40 && *target == 42, "fetch_add");

	/* Implicit ODP: one region over the whole address space (NULL, SIZE_MAX, ON_DEMAND);
	   a peer WRITE lands in memory no other region covers. */
	struct ibv_device_attr_ex odx;
	CHECK(ibv_query_device_ex(b.ctx, NULL, &odx) == 0 &&
		      (odx.odp_caps.general_caps & IBV_ODP_SUPPORT_IMPLICIT),
	      "implicit ODP advertised");
	CHECK(!ibv_reg_mr(b.pd, NULL, SIZE_MAX, IBV_ACCESS_LOCAL_WRITE) && errno == EINVAL,
	      "the whole address space without ON_DEMAND");
	struct ibv_mr *imr = ibv_reg_mr(b.pd, NULL, SIZE_MAX,
					IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE |
						IBV_ACCESS_ON_DEMAND);
	CHECK(imr && imr->addr == NULL && imr->length == SIZE_MAX, "implicit MR errno %d", errno);
	char *elsewhere = calloc(1, 4096);
	CHECK(elsewhere, "calloc");
	memcpy(a.buf + 450000, "implicit odp", 13);
	struct ibv_sge osge = { (uintptr_t)a.buf + 450000, 13, a.mr->lkey };
	struct ibv_send_wr owr = { .wr_id = 7, .sg_list = &osge, .num_sge = 1,
				   .opcode = IBV_WR_RDMA_WRITE, .send_flags = IBV_SEND_SIGNALED },
			   *obad;
	owr.wr.rdma.remote_addr = (uintptr_t)elsewhere + 100;
	owr.wr.rdma.rkey = imr->rkey;
	CHECK(ibv_post_send(a.qp, &owr, &obad) == 0, "post write through the implicit MR");
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 7 && wc.status == IBV_WC_SUCCESS && strcmp(elsewhere + 100, "implicit odp") == 0,
	      "write through the implicit MR: %s", ibv_wc_status_str(wc.status));
	CHECK(ibv_dereg_mr(imr) == 0, "dereg implicit MR");
	free(elsewhere);

	/* A linked list of three WRITEs, only the last signaled, two SGEs each. */
	struct ibv_sge sg2[3][2];
	struct ibv_send_wr wl[3];
	memset(wl, 0, sizeof(wl));
	for (int i = 0; i < 3; i++) {
		sg2[i][0] = (struct ibv_sge){ (uintptr_t)a.buf + i * 100, 50, a.mr->lkey };
		sg2[i][1] = (struct ibv_sge){ (uintptr_t)a.buf + i * 100 + 50, 50, a.mr->lkey };
		wl[i].wr_id = 10 + i;
		wl[i].sg_list = sg2[i];
		wl[i].num_sge = 2;
		wl[i].opcode = IBV_WR_RDMA_WRITE;
		wl[i].wr.rdma.remote_addr = (uintptr_t)b.buf + 500000 + i * 100;
		wl[i].wr.rdma.rkey = b.mr->rkey;
		wl[i].next = i < 2 ? &wl[i + 1] : NULL;
	}
	wl[2].send_flags = IBV_SEND_SIGNALED;
	CHECK(ibv_post_send(a.qp, wl, &bad) == 0, "post list");
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 12 && wc.status == IBV_WC_SUCCESS, "only the signaled WR completes");
	CHECK(memcmp(a.buf, b.buf + 500000, 300) == 0, "list bytes");

	/* Completion events: arm, send, the event names our CQ and its context. */
	CHECK(ibv_req_notify_cq(a.cq, 0) == 0, "req_notify");
	post(a.qp, IBV_WR_RDMA_WRITE, 20, a.buf, 10, a.mr->lkey, (uintptr_t)b.buf, b.mr->rkey);
	struct ibv_cq *ev_cq;
	void *ev_ctx;
	CHECK(ibv_get_cq_event(a.ch, &ev_cq, &ev_ctx) == 0 && ev_cq == a.cq && ev_ctx == &a,
	      "get_cq_event");
	CHECK(ibv_destroy_cq(a.cq) == EBUSY, "a CQ with a QP (and an unacked event) is busy");
	ibv_ack_cq_events(a.cq, 1);
	CHECK(wait_wc(a.cq).wr_id == 20, "the event's completion");
	fcntl(a.ch->fd, F_SETFL, fcntl(a.ch->fd, F_GETFL) | O_NONBLOCK);
	CHECK(ibv_get_cq_event(a.ch, &ev_cq, &ev_ctx) == -1 && errno == EAGAIN,
	      "non-blocking channel without events gives EAGAIN");

	/* Immediate errors: a full send queue gives ENOMEM and bad_wr at the first WR that did not
	   fit (the QP's peer QPN does not exist, so nothing is ever acknowledged: exactly
	   max_send_wr = 16 fit), too many SGEs give EINVAL. */
	struct ibv_cq *cq3 = ibv_create_cq(a.ctx, 64, NULL, NULL, 0);
	struct side s3 = a;
	s3.cq = cq3;
	struct ibv_qp *a3 = make_qp(&s3);
	connect_qp(a3, 0xfffff0, &b.gid);
	struct ibv_send_wr many[20];
	memset(many, 0, sizeof(many));
	for (int i = 0; i < 20; i++) {
		many[i].wr_id = 100 + i;
		many[i].opcode = IBV_WR_RDMA_WRITE;
		many[i].wr.rdma.rkey = b.mr->rkey;
		many[i].wr.rdma.remote_addr = (uintptr_t)b.buf;
		many[i].next = i < 19 ? &many[i + 1] : NULL;
	}
	bad = NULL;
	int r = ibv_post_send(a3, many, &bad);
	CHECK(r == ENOMEM && bad == &many[16], "full queue: r %d bad index %ld", r,
	      bad ? (long)(bad - many) : -1L);
	struct ibv_sge three[3] = { 0 };
	struct ibv_send_wr w3 = { .wr_id = 9, .sg_list = three, .num_sge = 3,
				  .opcode = IBV_WR_SEND };
	CHECK(ibv_post_send(b.qp, &w3, &bad) == EINVAL && bad == &w3, "too many SGEs");
	CHECK(ibv_destroy_qp(a3) == 0 && ibv_destroy_cq(cq3) == 0, "destroy the stuck QP");

	/* Completion errors: a bad lkey is LOC_PROT_ERR; then the QP is in ERR and the rest flush. */
	post(a.qp, IBV_WR_RDMA_WRITE, 40, a.buf, 8, a.mr->lkey ^ 0x5a5a00, (uintptr_t)b.buf,
	     b.mr->rkey);
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 40 && wc.status == IBV_WC_LOC_PROT_ERR, "bad lkey: %s",
	      ibv_wc_status_str(wc.status));
	CHECK(ibv_query_qp(a.qp, &qa, IBV_QP_STATE, &qia) == 0 && qa.qp_state == IBV_QPS_ERR,
	      "QP in ERR");

	/* A bad rkey on a fresh pair is REM_ACCESS_ERR at the requester. */
	struct ibv_qp *a2 = make_qp(&a), *b2 = make_qp(&b);
	connect_qp(a2, b2->qp_num, &b.gid);
	connect_qp(b2, a2->qp_num, &a.gid);
	post(a2, IBV_WR_RDMA_WRITE, 50, a.buf, 8, a.mr->lkey, (uintptr_t)b.buf, b.mr->rkey + 1);
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 50 && wc.status == IBV_WC_REM_ACCESS_ERR, "bad rkey: %s",
	      ibv_wc_status_str(wc.status));
	/* ferroce's extension says why, in a line (and FERROCE_LOG=info logged it). */
	int (*last_error)(struct ibv_qp *, char *, size_t) =
		(int (*)(struct ibv_qp *, char *, size_t))dlsym(RTLD_DEFAULT, "ferroce_qp_last_error");
	CHECK(last_error, "ferroce_qp_last_error is exported");
	char why[512];
	int why_len = last_error ? last_error(a2, why, sizeof why) : 0;
	CHECK(why_len > 0 && strncmp(why, "REM_ACCESS_ERR (wr_id 50): ", 27) == 0 &&
		      strstr(why, "remote access error") && strstr(why, "rkey"),
	      "the reason: %s", why_len > 0 ? why : "(none)");
	CHECK(last_error && last_error(b2, why, sizeof why) > 0 && strstr(why, "refused"),
	      "the responder's side: %s", why);
	CHECK(last_error && last_error(a2, why, 8) == why_len && strlen(why) == 7, "cut to the buffer");
	CHECK(strcmp(ibv_wc_status_str(IBV_WC_SUCCESS), "success") == 0, "status string");

	/* The extended send API: ibv_create_qp_ex with send-ops flags, ibv_wr_* batches. */
	struct ibv_qp_init_attr_ex xa = {
		.send_cq = a.cq, .recv_cq = a.cq, .qp_type = IBV_QPT_RC,
		.cap = { .max_send_wr = 16, .max_recv_wr = 16, .max_send_sge = 2, .max_recv_sge = 2,
			 .max_inline_data = 64 },
		.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_SEND_OPS_FLAGS, .pd = a.pd,
		.send_ops_flags = IBV_QP_EX_WITH_TSO,
	};
	CHECK(!ibv_create_qp_ex(a.ctx, &xa) && errno == EOPNOTSUPP, "TSO send op refused");
	xa.send_ops_flags = IBV_QP_EX_WITH_RDMA_WRITE | IBV_QP_EX_WITH_SEND_WITH_IMM |
			    IBV_QP_EX_WITH_ATOMIC_FETCH_AND_ADD | IBV_QP_EX_WITH_ATOMIC_WRITE;
	struct ibv_qp *qx = ibv_create_qp_ex(a.ctx, &xa);
	CHECK(qx, "create_qp_ex errno %d", errno);
	struct ibv_qp_ex *qpx = ibv_qp_to_qp_ex(qx);
	CHECK(qpx && &qpx->qp_base == qx, "qp_ex of an ex QP");
	CHECK(ibv_qp_to_qp_ex(b.qp) == NULL, "no qp_ex for a plain QP");
	struct ibv_qp *qy = make_qp(&b);
	connect_qp(qx, qy->qp_num, &b.gid);
	connect_qp(qy, qx->qp_num, &a.gid);
	struct ibv_sge ysge = { (uintptr_t)b.buf + 620000, 100, b.mr->lkey };
	struct ibv_recv_wr yrecv = { .wr_id = 90, .sg_list = &ysge, .num_sge = 1 }, *ybad;
	CHECK(ibv_post_recv(qy, &yrecv, &ybad) == 0, "post_recv on qy");
	char xnote[20] = "wr api inline bytes";
	uint64_t *xt = (uint64_t *)(b.buf + 610000), *xo = (uint64_t *)(a.buf + 610000);
	*xt = 100;
	ibv_wr_start(qpx);
	qpx->wr_id = 60;
	qpx->wr_flags = 0;
	ibv_wr_rdma_write(qpx, b.mr->rkey, (uintptr_t)b.buf + 600000);
	ibv_wr_set_sge(qpx, a.mr->lkey, (uintptr_t)a.buf, 4000);
	qpx->wr_id = 61;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_send_imm(qpx, htonl(0xabcdef01));
	ibv_wr_set_inline_data(qpx, xnote, sizeof(xnote));
	qpx->wr_id = 62;
	ibv_wr_atomic_fetch_add(qpx, b.mr->rkey, (uintptr_t)xt, 7);
	ibv_wr_set_sge(qpx, a.mr->lkey, (uintptr_t)xo, 8);
	CHECK(ibv_wr_complete(qpx) == 0, "wr_complete");
	memset(xnote, 0, sizeof(xnote));
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 61 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_SEND,
	      "wr api send: id %llu %s", (unsigned long long)wc.wr_id, ibv_wc_status_str(wc.status));
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 62 && wc.opcode == IBV_WC_FETCH_ADD && *xo == 100 && *xt == 107,
	      "wr api fetch_add");
	wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 90 && wc.byte_len == 20 && ntohl(wc.imm_data) == 0xabcdef01 &&
		      strcmp((char *)b.buf + 620000, "wr api inline bytes") == 0, "wr api receive");
	CHECK(memcmp(a.buf, b.buf + 600000, 4000) == 0, "wr api write bytes");
	/* ATOMIC WRITE (IBTA 1.5): 8 bytes stored at once; the value is copied by the call. */
	uint64_t aw = 0x0123456789abcdefULL, *awt = (uint64_t *)(b.buf + 630000);
	*awt = 1;
	ibv_wr_start(qpx);
	qpx->wr_id = 65;
	qpx->wr_flags = IBV_SEND_SIGNALED;
	ibv_wr_atomic_write(qpx, b.mr->rkey, (uintptr_t)awt, &aw);
	aw = 0;
	CHECK(ibv_wr_complete(qpx) == 0, "wr_complete of an atomic write");
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 65 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_ATOMIC_WRITE &&
		      *awt == 0x0123456789abcdefULL,
	      "wr api atomic write: %s opcode %d target %llx", ibv_wc_status_str(wc.status),
	      wc.opcode, (unsigned long long)*awt);
	/* Through ibv_post_send the value is the 8 bytes of the SGE (read at post). */
	*(uint64_t *)(a.buf + 631000) = 0xfeedfacecafebeefULL;
	struct ibv_sge awsge = { (uintptr_t)a.buf + 631000, 8, a.mr->lkey };
	struct ibv_send_wr awr = { .wr_id = 66, .sg_list = &awsge, .num_sge = 1,
				   .opcode = IBV_WR_ATOMIC_WRITE, .send_flags = IBV_SEND_SIGNALED },
			   *awbad;
	awr.wr.rdma.remote_addr = (uintptr_t)awt;
	awr.wr.rdma.rkey = b.mr->rkey;
	CHECK(ibv_post_send(qx, &awr, &awbad) == 0, "post atomic write");
	wc = wait_wc(a.cq);
	CHECK(wc.wr_id == 66 && wc.status == IBV_WC_SUCCESS && wc.opcode == IBV_WC_ATOMIC_WRITE &&
		      *awt == 0xfeedfacecafebeefULL, "post_send atomic write");
	awsge.length = 4;
	CHECK(ibv_post_send(qx, &awr, &awbad) == EINVAL && awbad == &awr,
	      "an atomic write of 4 bytes is refused at post");
	/* wr_abort posts nothing; an operation ferroce lacks fails the whole batch. */
	ibv_wr_start(qpx);
	qpx->wr_id = 63;
	ibv_wr_rdma_write(qpx, b.mr->rkey, (uintptr_t)b.buf);
	ibv_wr_set_sge(qpx, a.mr->lkey, (uintptr_t)a.buf, 8);
	ibv_wr_abort(qpx);
	ibv_wr_start(qpx);
	ibv_wr_send_tso(qpx, NULL, 0, 0);
	CHECK(ibv_wr_complete(qpx) == EOPNOTSUPP, "TSO is EOPNOTSUPP");
	ibv_wr_start(qpx);
	qpx->wr_id = 64;
	ibv_wr_rdma_write(qpx, b.mr->rkey, (uintptr_t)b.buf);
	ibv_wr_set_sge(qpx, a.mr->lkey, (uintptr_t)a.buf, 8);
	CHECK(ibv_wr_complete(qpx) == 0, "wr_complete after an abort");
	CHECK(wait_wc(a.cq).wr_id == 64, "the aborted WR was never posted");
	CHECK(ibv_destroy_qp(qx) == 0 && ibv_destroy_qp(qy) == 0, "destroy ex QPs");

	/* An SRQ with its limit armed: receives through it, then the SRQ_LIMIT_REACHED async event
	   (async_fd readable first) naming the SRQ. */
	struct ibv_srq_init_attr sia = { .srq_context = &b, .attr = { .max_wr = 8, .max_sge = 1 } };
	struct ibv_srq *srq = ibv_create_srq(b.pd, &sia);
	CHECK(srq && srq->srq_context == &b, "create_srq errno %d", errno);
	for (int i = 0; i < 4; i++) {
		struct ibv_sge rs = { (uintptr_t)b.buf + 700000 + i * 1024, 1024, b.mr->lkey };
		struct ibv_recv_wr rw = { .wr_id = 200 + i, .sg_list = &rs, .num_sge = 1 }, *rb;
		CHECK(ibv_post_srq_recv(srq, &rw, &rb) == 0, "post_srq_recv");
	}
	struct ibv_srq_attr sa = { .srq_limit = 3 };
	CHECK(ibv_modify_srq(srq, &sa, IBV_SRQ_LIMIT) == 0, "arm the SRQ limit");
	CHECK(ibv_query_srq(srq, &sa) == 0 && sa.max_wr >= 8 && sa.srq_limit == 3, "query_srq");
	struct ibv_qp_init_attr sqa = { .send_cq = b.cq, .recv_cq = b.cq, .srq = srq,
					.qp_type = IBV_QPT_RC,
					.cap = { .max_send_wr = 4, .max_send_sge = 1 } };
	struct ibv_qp *sq_b = ibv_create_qp(b.pd, &sqa), *sq_a = make_qp(&a);
	CHECK(sq_b && sq_b->srq == srq, "QP on the SRQ");
	connect_qp(sq_a, sq_b->qp_num, &b.gid);
	connect_qp(sq_b, sq_a->qp_num, &a.gid);
	post(sq_a, IBV_WR_SEND, 210, a.buf, 500, a.mr->lkey, 0, 0);
	post(sq_a, IBV_WR_SEND, 211, a.buf, 600, a.mr->lkey, 0, 0);
	CHECK(wait_wc(a.cq).wr_id == 210 && wait_wc(a.cq).wr_id == 211, "sends to the SRQ");
	wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 200 && wc.byte_len == 500 && wc.qp_num == sq_b->qp_num, "SRQ receive 1");
	wc = wait_wc(b.cq);
	CHECK(wc.wr_id == 201 && wc.byte_len == 600, "SRQ receive 2");
	struct pollfd pfd = { .fd = b.ctx->async_fd, .events = POLLIN };
	CHECK(poll(&pfd, 1, 5000) == 1, "async_fd readable");
	struct ibv_async_event ev;
	CHECK(ibv_get_async_event(b.ctx, &ev) == 0 && ev.event_type == IBV_EVENT_SRQ_LIMIT_REACHED &&
		      ev.element.srq == srq, "SRQ limit event: type %d", ev.event_type);
	ibv_ack_async_event(&ev);
	CHECK(ibv_destroy_qp(sq_b) == 0 && ibv_destroy_qp(sq_a) == 0 && ibv_destroy_srq(srq) == 0,
	      "destroy SRQ and its QPs");

	/* Busy parents and what ferroce does not offer. */
	CHECK(ibv_dealloc_pd(a.pd) == EBUSY, "PD with children is busy");
	CHECK(ibv_destroy_comp_channel(a.ch) == EBUSY, "channel with a CQ is busy");
	/* XRC: domains by file, XRC SRQs and their numbers, both QP types, ibv_open_qp. */
	struct ibv_qp_init_attr xrc = { .send_cq = a.cq, .qp_type = IBV_QPT_XRC_SEND,
					.cap = { .max_send_wr = 1, .max_send_sge = 1 } };
	struct ibv_qp *xs = ibv_create_qp(a.pd, &xrc);
	CHECK(xs && xs->qp_type == IBV_QPT_XRC_SEND && xrc.cap.max_recv_wr == 0,
	      "XRC_SEND without a recv_cq: errno %d", errno);
	CHECK(ibv_destroy_qp(xs) == 0, "destroy the XRC_SEND QP");
	xrc.qp_type = IBV_QPT_XRC_RECV;
	CHECK(!ibv_create_qp(a.pd, &xrc) && errno == EINVAL, "XRC_RECV needs ibv_create_qp_ex");
	char xname[] = "/tmp/ferroce-abi-xrcd-XXXXXX";
	int xfd = mkstemp(xname);
	CHECK(xfd >= 0, "temporary file");
	struct ibv_xrcd_init_attr xda = { .comp_mask = IBV_XRCD_INIT_ATTR_FD | IBV_XRCD_INIT_ATTR_OFLAGS,
					 .fd = xfd, .oflags = 0 };
	CHECK(!ibv_open_xrcd(a.ctx, &xda) && errno == EAGAIN, "no domain for the file, no O_CREAT");
	xda.oflags = O_CREAT;
	struct ibv_xrcd *xd = ibv_open_xrcd(a.ctx, &xda);
	struct ibv_xrcd *xd2 = ibv_open_xrcd(a.ctx, &xda);
	CHECK(xd && xd2, "open the domain twice by its file: errno %d", errno);
	xda.oflags = O_CREAT | O_EXCL;
	CHECK(!ibv_open_xrcd(a.ctx, &xda) && errno == EINVAL, "O_EXCL on an open domain");
	struct ibv_srq_init_attr_ex xsa = {
		.attr = { .max_wr = 4, .max_sge = 1 },
		.comp_mask = IBV_SRQ_INIT_ATTR_TYPE | IBV_SRQ_INIT_ATTR_PD | IBV_SRQ_INIT_ATTR_XRCD |
			     IBV_SRQ_INIT_ATTR_CQ,
		.srq_type = IBV_SRQT_XRC, .pd = a.pd, .xrcd = xd2, .cq = a.cq };
	struct ibv_srq *xsrq = ibv_create_srq_ex(a.ctx, &xsa);
	uint32_t srqn = 0;
	CHECK(xsrq && ibv_get_srq_num(xsrq, &srqn) == 0 && srqn != 0, "XRC SRQ: errno %d", errno);
	xsa.srq_type = IBV_SRQT_TM;
	CHECK(!ibv_create_srq_ex(a.ctx, &xsa) && errno == EOPNOTSUPP, "tag-matching SRQ");
	struct ibv_qp_init_attr_ex xe = { .qp_type = IBV_QPT_XRC_RECV,
					  .comp_mask = IBV_QP_INIT_ATTR_XRCD, .xrcd = xd };
	struct ibv_qp *xr = ibv_create_qp_ex(a.ctx, &xe);
	CHECK(xr && xr->qp_type == IBV_QPT_XRC_RECV && !xr->pd && !xr->send_cq, "XRC_RECV: errno %d",
	      errno);
	struct ibv_qp_open_attr oa = { .comp_mask = IBV_QP_OPEN_ATTR_NUM | IBV_QP_OPEN_ATTR_XRCD |
						    IBV_QP_OPEN_ATTR_CONTEXT | IBV_QP_OPEN_ATTR_TYPE,
				       .qp_num = xr->qp_num, .xrcd = xd2, .qp_type = IBV_QPT_XRC_RECV };
	struct ibv_qp *xop = ibv_open_qp(a.ctx, &oa);
	CHECK(xop && xop != xr && xop->qp_num == xr->qp_num, "ibv_open_qp: errno %d", errno);
	oa.qp_num = 0xabcdef;
	CHECK(!ibv_open_qp(a.ctx, &oa) && errno == ENOENT, "ibv_open_qp of no QP");
	struct ibv_qp_attr xq = { .qp_state = IBV_QPS_INIT, .port_num = 1,
				  .qp_access_flags = IBV_ACCESS_REMOTE_WRITE };
	CHECK(ibv_modify_qp(xop, &xq, IBV_QP_STATE | IBV_QP_PKEY_INDEX | IBV_QP_PORT |
					       IBV_QP_ACCESS_FLAGS) == 0,
	      "modify through the opened handle");
	CHECK(ibv_destroy_qp(xr) == 0 && ibv_destroy_qp(xop) == 0, "destroy both handles");
	CHECK(ibv_destroy_srq(xsrq) == 0, "destroy the XRC SRQ");
	CHECK(ibv_close_xrcd(xd) == 0 && ibv_close_xrcd(xd2) == 0, "close both domain handles");
	close(xfd);
	unlink(xname);
	CHECK(ibv_attach_mcast(a.qp, &a.gid, 0) == EINVAL, "an RC QP and a unicast GID: EINVAL");
	CHECK(!ibv_reg_dmabuf_mr(a.pd, 0, 4096, 0, -1, ACCESS) && errno == EOPNOTSUPP, "dmabuf");
	CHECK(!ibv_reg_mr(a.pd, NULL, 4096, ACCESS) && errno == EINVAL, "NULL memory");
	/* The extended CQ: completions through ibv_start_poll / ibv_next_poll / ibv_wc_read_*. */
	struct ibv_cq_init_attr_ex cqa = { .cqe = 8, .wc_flags = IBV_WC_EX_WITH_FLOW_TAG };
	CHECK(!ibv_create_cq_ex(a.ctx, &cqa) && errno == EOPNOTSUPP, "no flow tags");
	/* Completion timestamps: the free-running clock is CLOCK_MONOTONIC in ns, the wall clock
	 * ns since the epoch; both fall between the moments around the wait below. */
	cqa.wc_flags = IBV_WC_STANDARD_FLAGS | IBV_WC_EX_WITH_COMPLETION_TIMESTAMP |
		       IBV_WC_EX_WITH_COMPLETION_TIMESTAMP_WALLCLOCK;
	cqa.cq_context = &a;
	struct ibv_cq_ex *cqx = ibv_create_cq_ex(a.ctx, &cqa);
	CHECK(cqx && cqx->cq_context == &a, "create_cq_ex errno %d", errno);
	struct side sx = a;
	sx.cq = ibv_cq_ex_to_cq(cqx);
	struct ibv_qp *qa4 = make_qp(&sx), *qb4 = make_qp(&b);
	connect_qp(qa4, qb4->qp_num, &b.gid);
	connect_qp(qb4, qa4->qp_num, &a.gid);
	struct ibv_poll_cq_attr pattr = { 0 };
	CHECK(ibv_start_poll(cqx, &pattr) == ENOENT, "empty extended CQ");
	post(qa4, IBV_WR_RDMA_WRITE, 301, a.buf, 777, a.mr->lkey, (uintptr_t)b.buf, b.mr->rkey);
	post(qa4, IBV_WR_RDMA_READ, 302, a.buf + 800000, 555, a.mr->lkey, (uintptr_t)b.buf,
	     b.mr->rkey);
	int got = 0, pr;
	struct timespec xt0, xt1, wt0, wt1;
	clock_gettime(CLOCK_REALTIME, &wt0);
	clock_gettime(CLOCK_MONOTONIC, &xt0);
	while ((pr = ibv_start_poll(cqx, &pattr)) == ENOENT) {
		clock_gettime(CLOCK_MONOTONIC, &xt1);
		if (xt1.tv_sec - xt0.tv_sec >= 20)
			CHECK(0, "no extended completion within 20 s");
	}
	CHECK(pr == 0, "start_poll %d", pr);
	do {
		got++;
		CHECK(cqx->status == IBV_WC_SUCCESS && ibv_wc_read_qp_num(cqx) == qa4->qp_num,
		      "extended completion status %d", cqx->status);
		clock_gettime(CLOCK_MONOTONIC, &xt1);
		clock_gettime(CLOCK_REALTIME, &wt1);
		uint64_t ts = ibv_wc_read_completion_ts(cqx), wall = ibv_wc_read_completion_wallclock_ns(cqx);
		CHECK(ts >= (uint64_t)xt0.tv_sec * 1000000000 + xt0.tv_nsec - 1000000000ull &&
			      ts <= (uint64_t)xt1.tv_sec * 1000000000 + xt1.tv_nsec,
		      "completion_ts %llu on CLOCK_MONOTONIC", (unsigned long long)ts);
		CHECK(wall >= (uint64_t)wt0.tv_sec * 1000000000 + wt0.tv_nsec - 1000000000ull &&
			      wall <= (uint64_t)wt1.tv_sec * 1000000000 + wt1.tv_nsec,
		      "completion wallclock %llu", (unsigned long long)wall);
		if (cqx->wr_id == 301)
			CHECK(ibv_wc_read_opcode(cqx) == IBV_WC_RDMA_WRITE, "read_opcode write");
		else
			CHECK(cqx->wr_id == 302 && ibv_wc_read_opcode(cqx) == IBV_WC_RDMA_READ &&
				      ibv_wc_read_byte_len(cqx) == 555, "read completion fields");
		if (got == 2)
			break;
		while ((pr = ibv_next_poll(cqx)) == ENOENT)
			;
		CHECK(pr == 0, "next_poll %d", pr);
	} while (1);
	ibv_end_poll(cqx);
	CHECK(ibv_destroy_qp(qa4) == 0 && ibv_destroy_qp(qb4) == 0, "destroy cq_ex QPs");
	CHECK(ibv_destroy_cq(ibv_cq_ex_to_cq(cqx)) == 0, "destroy the extended CQ");
	struct ibv_values_ex rt = { .comp_mask = IBV_VALUES_MASK_RAW_CLOCK };
	CHECK(ibv_query_rt_values_ex(a.ctx, &rt) == 0 && rt.comp_mask == IBV_VALUES_MASK_RAW_CLOCK &&
		      rt.raw_clock.tv_sec >= xt1.tv_sec,
	      "query_rt_values_ex reads the free-running clock");
	struct ibv_device_attr_ex dxc;
	CHECK(ibv_query_device_ex(a.ctx, NULL, &dxc) == 0 && dxc.hca_core_clock == 1000000 &&
		      dxc.completion_timestamp_mask == UINT64_MAX &&
		      (dxc.odp_caps.general_caps & IBV_ODP_SUPPORT) &&
		      (dxc.odp_caps.per_transport_caps.rc_odp_caps & IBV_ODP_SUPPORT_WRITE),
	      "clock and ODP capabilities");
	CHECK(dxc.cq_mod_caps.max_cq_count == UINT16_MAX && dxc.cq_mod_caps.max_cq_period == UINT16_MAX,
	      "CQ moderation capabilities");
	struct ibv_modify_cq_attr mca = { .attr_mask = IBV_CQ_ATTR_MODERATE,
					  .moderate = { .cq_count = 4, .cq_period = 100 } };
	CHECK(ibv_modify_cq(a.cq, &mca) == 0, "modify_cq moderation, errno %d", errno);
	mca.moderate.cq_count = 1;
	mca.moderate.cq_period = 0;
	CHECK(ibv_modify_cq(a.cq, &mca) == 0, "moderation off again");
	mca.attr_mask = 1 << 5;
	errno = 0;
	CHECK(ibv_modify_cq(a.cq, &mca) == EINVAL && errno == EINVAL, "modify_cq unknown mask");

	/* Concurrency: posting, polling and querying one QP from three threads. */
	struct side s5 = a;
	s5.cq = ibv_create_cq(a.ctx, 64, NULL, NULL, 0);
	struct ibv_qp *qa5 = make_qp(&s5), *qb5 = make_qp(&b);
	connect_qp(qa5, qb5->qp_num, &b.gid);
	connect_qp(qb5, qa5->qp_num, &a.gid);
	struct threaded th = { .qp = qa5, .cq = s5.cq, .a = &a, .b = &b };
	pthread_t tp, tc;
	CHECK(pthread_create(&tc, NULL, poller, &th) == 0 && pthread_create(&tp, NULL, poster, &th) == 0,
	      "threads");
	int queries = 0, query_bad = 0;
	while (!__atomic_load_n(&th.done, __ATOMIC_SEQ_CST)) {
		if (ibv_query_qp(qa5, &qa, IBV_QP_STATE, &qia) != 0 || qa.qp_state != IBV_QPS_RTS)
			query_bad++;
		queries++;
	}
	CHECK(query_bad == 0, "%d of %d queries while busy failed", query_bad, queries);
	pthread_join(tp, NULL);
	pthread_join(tc, NULL);
	CHECK(th.errors == 0 && th.bad_order == 0, "%d WRITEs from one thread, completions in order "
	      "in another: %d errors, %d out of order (%d queries)", THREADED_WRS, th.errors,
	      th.bad_order, queries);
	CHECK(memcmp(a.buf, b.buf + 900000, 64 * 64) == 0, "threaded bytes");
	CHECK(ibv_destroy_qp(qa5) == 0 && ibv_destroy_qp(qb5) == 0 && ibv_destroy_cq(s5.cq) == 0,
	      "threaded teardown");

	/* Overrunning a CQ is the program's error: IBV_EVENT_CQ_ERR names the CQ. */
	struct ibv_cq *small = ibv_create_cq(a.ctx, 1, NULL, NULL, 0);
	CHECK(small && small->cqe >= 1, "a one-entry CQ");
	struct side s6 = a;
	s6.cq = small;
	struct ibv_qp *qa6 = make_qp(&s6), *qb6 = make_qp(&b);
	connect_qp(qa6, qb6->qp_num, &b.gid);
	connect_qp(qb6, qa6->qp_num, &a.gid);
	for (int i = 0; i < small->cqe + 2; i++)
		post(qa6, IBV_WR_RDMA_WRITE, 400 + i, a.buf, 8, a.mr->lkey, (uintptr_t)b.buf,
		     b.mr->rkey);
	struct pollfd apfd = { .fd = a.ctx->async_fd, .events = POLLIN };
	CHECK(poll(&apfd, 1, 10000) == 1, "async_fd readable after the overrun");
	/* One thread handles the event (slowly) while this one destroys its CQ: as in rdma-core,
	   ibv_destroy_cq returns only after the event is acknowledged, so the handler may still
	   read the CQ it names. */
	struct handler h = { .ctx = a.ctx };
	pthread_t th6;
	pthread_create(&th6, NULL, slow_event_handler, &h);
	while (!__atomic_load_n(&h.got, __ATOMIC_SEQ_CST))
		usleep(1000);
	CHECK(h.ev.event_type == IBV_EVENT_CQ_ERR && h.ev.element.cq == small,
	      "CQ_ERR event: type %d", h.ev.event_type);
	CHECK(ibv_destroy_qp(qa6) == 0 && ibv_destroy_qp(qb6) == 0 && ibv_destroy_cq(small) == 0,
	      "overrun teardown");
	CHECK(__atomic_load_n(&h.acked, __ATOMIC_SEQ_CST) == 1,
	      "ibv_destroy_cq waited for the CQ_ERR event's acknowledgement");
	pthread_join(th6, NULL);

	/* The same for a completion event: got, not yet acked by another thread. */
	struct ibv_comp_channel *ch7 = ibv_create_comp_channel(a.ctx);
	struct ibv_cq *cq7 = ibv_create_cq(a.ctx, 16, NULL, ch7, 0);
	CHECK(ch7 && cq7, "cq7 with its own channel");
	struct side s7 = a;
	s7.cq = cq7;
	struct ibv_qp *qa7 = make_qp(&s7), *qb7 = make_qp(&b);
	connect_qp(qa7, qb7->qp_num, &b.gid);
	connect_qp(qb7, qa7->qp_num, &a.gid);
	CHECK(ibv_req_notify_cq(cq7, 0) == 0, "arm cq7");
	post(qa7, IBV_WR_RDMA_WRITE, 700, a.buf, 8, a.mr->lkey, (uintptr_t)b.buf, b.mr->rkey);
	struct ibv_cq *ecq7;
	void *ectx7;
	CHECK(ibv_get_cq_event(ch7, &ecq7, &ectx7) == 0 && ecq7 == cq7, "cq7 event");
	CHECK(wait_wc(cq7).status == IBV_WC_SUCCESS, "cq7 completion");
	CHECK(ibv_destroy_qp(qa7) == 0 && ibv_destroy_qp(qb7) == 0, "cq7 QPs gone");
	struct cq_acker ack7 = { .cq = cq7 };
	pthread_t tk7;
	pthread_create(&tk7, NULL, slow_cq_acker, &ack7);
	CHECK(ibv_destroy_cq(cq7) == 0, "destroy_cq with a got, unacked completion event");
	CHECK(__atomic_load_n(&ack7.acked, __ATOMIC_SEQ_CST) == 1,
	      "ibv_destroy_cq waited for ibv_ack_cq_events");
	pthread_join(tk7, NULL);
	CHECK(ibv_destroy_comp_channel(ch7) == 0, "cq7's channel");

	/* What middleware tripped on (the pyverbs suite, UCX, libfabric): each check failed
	 * before its fix. */
	{
		/* The CREATE_FLAGS bit with no flags is accepted (the suite sets it at random); a
		 * flag ferroce lacks is EOPNOTSUPP. */
		struct ibv_qp_init_attr_ex xa = {
			.send_cq = a.cq, .recv_cq = a.cq, .qp_type = IBV_QPT_RC, .pd = a.pd,
			.comp_mask = IBV_QP_INIT_ATTR_PD | IBV_QP_INIT_ATTR_CREATE_FLAGS,
			.cap = { .max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1 },
		};
		struct ibv_qp *q0 = ibv_create_qp_ex(a.ctx, &xa);
		CHECK(q0, "create_qp_ex with create_flags 0, errno %d", errno);
		xa.create_flags = IBV_QP_CREATE_SCATTER_FCS;
		errno = 0;
		CHECK(!ibv_create_qp_ex(a.ctx, &xa) && errno == EOPNOTSUPP,
		      "a creation flag ferroce lacks: errno %d", errno);
		/* errno is the error an int-returning verb returns. */
		struct ibv_qp_attr bad = { .qp_state = IBV_QPS_RTS };
		errno = 0;
		int rc = ibv_modify_qp(q0, &bad, IBV_QP_STATE);
		CHECK(rc == EINVAL && errno == EINVAL, "modify_qp RESET->RTS: rc %d errno %d", rc, errno);
		errno = 0;
		rc = ibv_destroy_cq(a.cq);
		CHECK(rc == EBUSY && errno == EBUSY, "destroy_cq in use: rc %d errno %d", rc, errno);
		/* GID 0 is the device's address, usable for AHs and paths; index 2 does not exist. */
		union ibv_gid g0;
		CHECK(ibv_query_gid(a.ctx, 1, 0, &g0) == 0 && memcmp(&g0, &a.gid, 16) == 0,
		      "GID 0 is the device's address");
		struct ibv_ah_attr aa = { .is_global = 1, .port_num = 1,
					  .grh = { .dgid = g0, .sgid_index = 0, .hop_limit = 64 } };
		struct ibv_ah *ah0 = ibv_create_ah(a.pd, &aa);
		CHECK(ah0, "create_ah to GID 0, errno %d", errno);
		aa.grh.sgid_index = 2;
		errno = 0;
		CHECK(!ibv_create_ah(a.pd, &aa) && errno == EINVAL, "sgid_index 2: errno %d", errno);
		CHECK(ibv_destroy_ah(ah0) == 0, "destroy_ah");
		/* An IOVA other than the address: peers address the region by it. */
		uint64_t iova = 0x5a0000000000ull | ((uintptr_t)b.buf & 4095);
		struct ibv_mr *bi = ibv_reg_mr_iova(b.pd, b.buf, 4096, iova, ACCESS);
		CHECK(bi && bi->addr == b.buf, "reg_mr_iova, errno %d", errno);
		memset(b.buf + 100, 0, 16);
		memcpy(a.buf, "iova-addressed!", 16);
		struct ibv_qp *qi = make_qp(&a), *qbi = make_qp(&b);
		connect_qp(qi, qbi->qp_num, &b.gid);
		connect_qp(qbi, qi->qp_num, &a.gid);
		post(qi, IBV_WR_RDMA_WRITE, 900, a.buf, 16, a.mr->lkey, iova + 100, bi->rkey);
		struct ibv_wc wci = wait_wc(a.cq);
		CHECK(wci.status == IBV_WC_SUCCESS && wci.wr_id == 900, "WRITE to the IOVA: status %d",
		      wci.status);
		CHECK(memcmp(b.buf + 100, "iova-addressed!", 16) == 0,
		      "a WRITE to the IOVA lands at the address");
		CHECK(ibv_destroy_qp(qi) == 0 && ibv_destroy_qp(qbi) == 0, "IOVA QPs gone");
		errno = 0;
		CHECK(!ibv_reg_mr_iova(b.pd, b.buf, 4096, iova + 8, ACCESS) && errno == EINVAL,
		      "an IOVA with another page offset: errno %d", errno);
		CHECK(ibv_dereg_mr(bi) == 0, "dereg the IOVA region");
		/* phys_port_cnt_ex, and a real cmd_fd. */
		struct ibv_device_attr_ex dx0;
		CHECK(ibv_query_device_ex(a.ctx, NULL, &dx0) == 0 && dx0.phys_port_cnt_ex == 1,
		      "phys_port_cnt_ex %u", dx0.phys_port_cnt_ex);
		CHECK(a.ctx->cmd_fd >= 0 && fcntl(a.ctx->cmd_fd, F_GETFD) >= 0, "cmd_fd %d is open",
		      a.ctx->cmd_fd);
		errno = 0;
		CHECK(!ibv_import_device(a.ctx->cmd_fd) && errno == EOPNOTSUPP,
		      "import_device: errno %d", errno);
		/* An SRQ with a QP attached is EBUSY, as on rxe. */
		struct ibv_srq_init_attr sa = { .attr = { .max_wr = 4, .max_sge = 1 } };
		struct ibv_srq *srq = ibv_create_srq(a.pd, &sa);
		CHECK(srq, "create_srq errno %d", errno);
		struct ibv_qp_init_attr qs = {
			.send_cq = a.cq, .recv_cq = a.cq, .srq = srq, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 1, .max_send_sge = 1 },
		};
		struct ibv_qp *qsrq = ibv_create_qp(a.pd, &qs);
		CHECK(qsrq, "QP on the SRQ, errno %d", errno);
		errno = 0;
		rc = ibv_destroy_srq(srq);
		CHECK(rc == EBUSY && errno == EBUSY, "destroy_srq with a QP: rc %d errno %d", rc, errno);
		CHECK(ibv_destroy_qp(qsrq) == 0 && ibv_destroy_srq(srq) == 0, "then both go");
		/* A CQ whose channel holds an event nobody got is destroyed at once, and so is the
		 * channel (the event goes with the CQ, as in the kernel). Its QP connects through
		 * GID 0. */
		struct ibv_comp_channel *ch8 = ibv_create_comp_channel(a.ctx);
		struct ibv_cq *cq8 = ibv_create_cq(a.ctx, 8, NULL, ch8, 0);
		CHECK(ch8 && cq8, "channel and CQ");
		xa.comp_mask = IBV_QP_INIT_ATTR_PD;
		xa.create_flags = 0;
		xa.send_cq = xa.recv_cq = cq8;
		struct ibv_qp *q8 = ibv_create_qp_ex(a.ctx, &xa);
		union ibv_gid bg0;
		CHECK(q8 && ibv_query_gid(b.ctx, 1, 0, &bg0) == 0, "QP on cq8");
		struct ibv_qp *b8 = make_qp(&b);
		connect_qp(q8, b8->qp_num, &bg0);
		connect_qp(b8, q8->qp_num, &a.gid);
		CHECK(ibv_req_notify_cq(cq8, 0) == 0, "arm cq8");
		post(q8, IBV_WR_RDMA_WRITE, 800, a.buf, 8, a.mr->lkey, (uintptr_t)b.buf, b.mr->rkey);
		struct pollfd pf = { .fd = ch8->fd, .events = POLLIN };
		CHECK(poll(&pf, 1, 20000) == 1, "cq8's event is pending");
		CHECK(ibv_destroy_qp(q8) == 0 && ibv_destroy_qp(q0) == 0 && ibv_destroy_qp(b8) == 0,
		      "QPs gone");
		CHECK(ibv_destroy_cq(cq8) == 0, "destroy_cq with an event not got: errno %d", errno);
		CHECK(ibv_destroy_comp_channel(ch8) == 0, "then its channel: errno %d", errno);
	}

	/* Memory windows: a type 1 window bound with ibv_bind_mw keeps its region registered
	 * (dereg is EBUSY, as on rxe) until it is unbound (length 0). */
	{
		struct side sw = b;
		sw.cq = ibv_create_cq(b.ctx, 16, NULL, NULL, 0);
		struct ibv_mr *wm = ibv_reg_mr(b.pd, b.buf, 4096, ACCESS | IBV_ACCESS_MW_BIND);
		struct ibv_mw *mw = ibv_alloc_mw(b.pd, IBV_MW_TYPE_1);
		CHECK(sw.cq && wm && mw && mw->type == IBV_MW_TYPE_1, "alloc_mw errno %d", errno);
		struct ibv_qp *qw = make_qp(&sw), *qwa = make_qp(&a);
		connect_qp(qw, qwa->qp_num, &a.gid);
		connect_qp(qwa, qw->qp_num, &b.gid);
		uint32_t before = mw->rkey;
		struct ibv_mw_bind mb = {
			.wr_id = 950, .send_flags = IBV_SEND_SIGNALED,
			.bind_info = { .mr = wm, .addr = (uintptr_t)b.buf, .length = 4096,
				       .mw_access_flags = IBV_ACCESS_REMOTE_WRITE },
		};
		mb.bind_info.mw_access_flags |= IBV_ACCESS_ZERO_BASED;
		CHECK(ibv_bind_mw(qw, mw, &mb) == EINVAL && mw->rkey == before,
		      "a zero-based type 1 window is refused");
		mb.bind_info.mw_access_flags = IBV_ACCESS_REMOTE_WRITE;
		CHECK(ibv_bind_mw(qw, mw, &mb) == 0 && mw->rkey != before, "bind_mw errno %d", errno);
		struct ibv_wc bw = wait_wc(sw.cq);
		CHECK(bw.status == IBV_WC_SUCCESS && bw.opcode == IBV_WC_BIND_MW && bw.wr_id == 950,
		      "bind completion status %d", bw.status);
		errno = 0;
		CHECK(ibv_dereg_mr(wm) == EBUSY && errno == EBUSY, "dereg with a bound window: EBUSY");
		mb.bind_info.length = 0;
		mb.wr_id = 951;
		CHECK(ibv_bind_mw(qw, mw, &mb) == 0, "unbind errno %d", errno);
		CHECK(wait_wc(sw.cq).wr_id == 951, "unbind completion");
		CHECK(ibv_dereg_mr(wm) == 0 && ibv_dealloc_mw(mw) == 0, "then dereg and dealloc");
		CHECK(ibv_destroy_qp(qw) == 0 && ibv_destroy_qp(qwa) == 0 && ibv_destroy_cq(sw.cq) == 0,
		      "window QPs and CQ");
	}

	/* Teardown in verbs order; every call succeeds. */
	struct side *sides[2] = { &a, &b };
	struct ibv_qp *extra[2] = { a2, b2 };
	for (int i = 0; i < 2; i++) {
		struct side *s = sides[i];
		CHECK(ibv_destroy_qp(s->qp) == 0 && ibv_destroy_qp(extra[i]) == 0, "destroy_qp");
		CHECK(ibv_destroy_cq(s->cq) == 0, "destroy_cq");
		CHECK(ibv_destroy_comp_channel(s->ch) == 0, "destroy channel");
		CHECK(ibv_dereg_mr(s->mr) == 0, "dereg_mr");
		CHECK(ibv_dealloc_pd(s->pd) == 0, "dealloc_pd");
		CHECK(ibv_close_device(s->ctx) == 0, "close_device");
		free(s->buf);
	}
	/* Two contexts of one device at once (the pyverbs pattern): both work, resources stay
	 * apart, closing one leaves the other. */
	list = ibv_get_device_list(&n);
	{
		struct ibv_context *x = ibv_open_device(list[0]), *y = ibv_open_device(list[0]);
		CHECK(x && y && x != y, "two contexts of one device, errno %d", errno);
		struct ibv_pd *px = ibv_alloc_pd(x), *py = ibv_alloc_pd(y);
		struct ibv_cq *cy = ibv_create_cq(y, 4, NULL, NULL, 0);
		CHECK(px && py && cy, "resources on both contexts");
		struct ibv_qp_init_attr xa = {
			.send_cq = cy, .recv_cq = cy, .qp_type = IBV_QPT_RC,
			.cap = { .max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1 },
		};
		CHECK(!ibv_create_qp(px, &xa), "a CQ of another context is refused");
		CHECK(ibv_dealloc_pd(px) == 0 && ibv_close_device(x) == 0, "close the first");
		struct ibv_qp *qy = ibv_create_qp(py, &xa);
		CHECK(qy, "the second context still works, errno %d", errno);
		CHECK(ibv_destroy_qp(qy) == 0 && ibv_destroy_cq(cy) == 0 && ibv_dealloc_pd(py) == 0 &&
			      ibv_close_device(y) == 0,
		      "tear down the second");
	}
	/* Closing a context with a live PD is allowed (the PD leaks); the PD stays usable. */
	struct ibv_context *c3 = ibv_open_device(list[0]);
	CHECK(c3, "reopen errno %d", errno);
	struct ibv_pd *pd3 = ibv_alloc_pd(c3);
	CHECK(pd3 && ibv_close_device(c3) == 0, "close with a live PD");
	CHECK(ibv_dealloc_pd(pd3) == 0, "the PD outlives its closed context");
	ibv_free_device_list(list);
	printf("abi_test OK: %d checks\n", checks);
	return 0;
}
