/*
 * cm_reject: the rdma_cm side of the interop suite's reject scenario, a plain librdmacm
 * program (built against Debian's librdmacm-dev; on ferroce through its librdmacm.so.1, in the
 * guest on the kernel's rdma_cm).
 *
 *   cm_reject server ADDR PORT DATA   listen; reject the first request with DATA as the REJ's
 *                                     private data; exit 0
 *   cm_reject serve ADDR PORT [DATA]  listen; reject every request with DATA, until killed
 *                                     (the rdma_cm listener of `ferroce fuzz`'s cm campaign)
 *   cm_reject accept ADDR PORT        listen; accept every request with a QP and a 64 KiB region
 *                                     of its own, filled with byte i = (i*31 + SEED) & 255 (SEED:
 *                                     the first 8 bytes of the request's private data, big
 *                                     endian; a 9th byte 1 posts a 4 KiB receive), the REP's
 *                                     private data naming it (rkey, addr: 4 + 8 bytes, big
 *                                     endian); each torn down when disconnected (`ferroce fuzz
 *                                     --via-cm`)
 *   cm_reject client ADDR PORT        connect; print "REJECTED status S len L data D" (D: the
 *                                     private data up to its first NUL); exit 0 if rejected
 */
#include <netdb.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <rdma/rdma_cma.h>

static struct rdma_cm_event *next(struct rdma_event_channel *ch, enum rdma_cm_event_type want) {
	struct rdma_cm_event *e;
	if (rdma_get_cm_event(ch, &e)) {
		perror("rdma_get_cm_event");
		exit(2);
	}
	if (e->event != want && want != (enum rdma_cm_event_type)-1) {
		printf("unexpected %s status %d\n", rdma_event_str(e->event), e->status);
		exit(3);
	}
	return e;
}

/* The long-running modes' listener: bound, listening, announced on stdout. */
static void listen_or_exit(struct rdma_cm_id *id, struct addrinfo *ai) {
	if (rdma_bind_addr(id, ai->ai_addr) || rdma_listen(id, 16)) {
		perror("listen");
		exit(1);
	}
	printf("LISTENING\n");
	fflush(stdout);
}

int main(int argc, char **argv) {
	if (argc < 4) {
		fprintf(stderr, "usage: cm_reject server|client ADDR PORT [DATA]\n");
		return 1;
	}
	struct addrinfo *ai;
	if (getaddrinfo(argv[2], argv[3], NULL, &ai)) {
		fprintf(stderr, "bad address\n");
		return 1;
	}
	struct rdma_event_channel *ch = rdma_create_event_channel();
	struct rdma_cm_id *id;
	if (!ch || rdma_create_id(ch, &id, NULL, RDMA_PS_TCP)) {
		perror("rdma_create_id");
		return 1;
	}
	if (!strcmp(argv[1], "serve")) {
		const char *data = argc > 4 ? argv[4] : "no";
		listen_or_exit(id, ai);
		for (;;) {
			struct rdma_cm_event *e = next(ch, (enum rdma_cm_event_type)-1);
			if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST)
				rdma_reject(e->id, data, (uint8_t)(strlen(data) + 1));
			rdma_ack_cm_event(e);
		}
	}
	if (!strcmp(argv[1], "accept")) {
		listen_or_exit(id, ai);
		for (;;) {
			struct rdma_cm_event *e = next(ch, (enum rdma_cm_event_type)-1);
			struct rdma_cm_id *c = e->id;
			if (e->event == RDMA_CM_EVENT_CONNECT_REQUEST) {
				const uint8_t *pd = e->param.conn.private_data;
				uint64_t seed = 0;
				int recv = 0;
				if (pd && e->param.conn.private_data_len >= 9) {
					for (int i = 0; i < 8; i++)
						seed = seed << 8 | pd[i];
					recv = pd[8] == 1;
				}
				rdma_ack_cm_event(e);
				struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
							       .cap = {.max_send_wr = 4, .max_recv_wr = 4, .max_send_sge = 1, .max_recv_sge = 1}};
				uint8_t *buf = malloc(65536);
				struct ibv_mr *mr = NULL;
				if (buf && !rdma_create_qp(c, NULL, &qa))
					mr = ibv_reg_mr(c->qp->pd, buf, 65536,
							IBV_ACCESS_LOCAL_WRITE | IBV_ACCESS_REMOTE_WRITE | IBV_ACCESS_REMOTE_READ | IBV_ACCESS_REMOTE_ATOMIC);
				if (!mr) {
					rdma_reject(c, NULL, 0);
					continue;
				}
				for (size_t i = 0; i < 65536; i++)
					buf[i] = (uint8_t)((i * 31 + seed) & 255);
				if (recv) {
					struct ibv_sge sge = {.addr = (uintptr_t)buf, .length = 4096, .lkey = mr->lkey};
					struct ibv_recv_wr wr = {.wr_id = 1, .sg_list = &sge, .num_sge = 1}, *bad;
					ibv_post_recv(c->qp, &wr, &bad);
				}
				uint8_t rep[12];
				uint64_t a = (uintptr_t)buf;
				for (int i = 0; i < 4; i++)
					rep[i] = (uint8_t)(mr->rkey >> (24 - 8 * i));
				for (int i = 0; i < 8; i++)
					rep[4 + i] = (uint8_t)(a >> (56 - 8 * i));
				struct rdma_conn_param p = {.private_data = rep, .private_data_len = sizeof rep,
							    .responder_resources = 1, .initiator_depth = 1, .rnr_retry_count = 7};
				c->context = mr;
				if (rdma_accept(c, &p))
					perror("rdma_accept");
			} else if (e->event == RDMA_CM_EVENT_DISCONNECTED) {
				struct ibv_mr *mr = c->context;
				rdma_ack_cm_event(e);
				rdma_disconnect(c);
				rdma_destroy_qp(c);
				if (mr) {
					void *b = mr->addr;
					ibv_dereg_mr(mr);
					free(b);
				}
				rdma_destroy_id(c);
			} else {
				rdma_ack_cm_event(e);
			}
		}
	}
	if (!strcmp(argv[1], "server")) {
		const char *data = argc > 4 ? argv[4] : "no";
		if (rdma_bind_addr(id, ai->ai_addr) || rdma_listen(id, 1)) {
			perror("listen");
			return 1;
		}
		struct rdma_cm_event *e = next(ch, RDMA_CM_EVENT_CONNECT_REQUEST);
		if (rdma_reject(e->id, data, (uint8_t)(strlen(data) + 1))) {
			perror("rdma_reject");
			return 1;
		}
		printf("rejected with %s\n", data);
		rdma_ack_cm_event(e);
		sleep(1);
		return 0;
	}
	if (rdma_resolve_addr(id, NULL, ai->ai_addr, 2000)) {
		perror("rdma_resolve_addr");
		return 1;
	}
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ADDR_RESOLVED));
	if (rdma_resolve_route(id, 2000)) {
		perror("rdma_resolve_route");
		return 1;
	}
	rdma_ack_cm_event(next(ch, RDMA_CM_EVENT_ROUTE_RESOLVED));
	struct ibv_qp_init_attr qa = {.qp_type = IBV_QPT_RC,
				       .cap = {.max_send_wr = 1, .max_recv_wr = 1, .max_send_sge = 1, .max_recv_sge = 1}};
	if (rdma_create_qp(id, NULL, &qa)) {
		perror("rdma_create_qp");
		return 1;
	}
	struct rdma_conn_param p = {.responder_resources = 1, .initiator_depth = 1, .retry_count = 7, .rnr_retry_count = 7};
	if (rdma_connect(id, &p)) {
		perror("rdma_connect");
		return 1;
	}
	struct rdma_cm_event *e = next(ch, (enum rdma_cm_event_type)-1);
	char data[256] = {0};
	if (e->param.conn.private_data && e->param.conn.private_data_len)
		memcpy(data, e->param.conn.private_data, e->param.conn.private_data_len);
	data[255] = 0;
	printf("%s status %d len %u data %s\n", e->event == RDMA_CM_EVENT_REJECTED ? "REJECTED" : rdma_event_str(e->event),
	       e->status, e->param.conn.private_data_len, data);
	int rejected = e->event == RDMA_CM_EVENT_REJECTED;
	rdma_ack_cm_event(e);
	return rejected ? 0 : 4;
}
