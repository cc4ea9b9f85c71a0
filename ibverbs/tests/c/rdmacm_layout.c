/* Prints the size and field offsets of the librdmacm structures ferroce's librdmacm mirrors,
   as the real <rdma/rdma_cma.h> lays them out; tests/rdmacm_layout.rs compares them with the
   Rust definitions. One line per item: "name value". */
#include <stddef.h>
#include <stdio.h>
#include <rdma/rdma_cma.h>

#define S(t) printf("sizeof %s %zu\n", #t, sizeof(struct t))
#define O(t, f) printf("offsetof %s.%s %zu\n", #t, #f, offsetof(struct t, f))

int main(void)
{
	S(rdma_event_channel); O(rdma_event_channel, fd);
	S(rdma_cm_id); O(rdma_cm_id, verbs); O(rdma_cm_id, channel); O(rdma_cm_id, context);
	O(rdma_cm_id, qp); O(rdma_cm_id, route); O(rdma_cm_id, ps); O(rdma_cm_id, port_num);
	O(rdma_cm_id, event); O(rdma_cm_id, send_cq_channel); O(rdma_cm_id, send_cq);
	O(rdma_cm_id, recv_cq_channel); O(rdma_cm_id, recv_cq); O(rdma_cm_id, srq);
	O(rdma_cm_id, pd); O(rdma_cm_id, qp_type);
	S(rdma_route); O(rdma_route, addr); O(rdma_route, path_rec); O(rdma_route, num_paths);
	S(rdma_addr); O(rdma_addr, src_addr); O(rdma_addr, dst_addr); O(rdma_addr, addr);
	S(rdma_ib_addr); O(rdma_ib_addr, sgid); O(rdma_ib_addr, dgid); O(rdma_ib_addr, pkey);
	S(rdma_conn_param); O(rdma_conn_param, private_data); O(rdma_conn_param, private_data_len);
	O(rdma_conn_param, responder_resources); O(rdma_conn_param, initiator_depth);
	O(rdma_conn_param, flow_control); O(rdma_conn_param, retry_count);
	O(rdma_conn_param, rnr_retry_count); O(rdma_conn_param, srq); O(rdma_conn_param, qp_num);
	S(rdma_ud_param); O(rdma_ud_param, private_data); O(rdma_ud_param, private_data_len);
	O(rdma_ud_param, ah_attr); O(rdma_ud_param, qp_num); O(rdma_ud_param, qkey);
	S(rdma_cm_event); O(rdma_cm_event, id); O(rdma_cm_event, listen_id); O(rdma_cm_event, event);
	O(rdma_cm_event, status); O(rdma_cm_event, param);
	S(rdma_addrinfo); O(rdma_addrinfo, ai_flags); O(rdma_addrinfo, ai_family);
	O(rdma_addrinfo, ai_qp_type); O(rdma_addrinfo, ai_port_space); O(rdma_addrinfo, ai_src_len);
	O(rdma_addrinfo, ai_dst_len); O(rdma_addrinfo, ai_src_addr); O(rdma_addrinfo, ai_dst_addr);
	O(rdma_addrinfo, ai_src_canonname); O(rdma_addrinfo, ai_dst_canonname);
	O(rdma_addrinfo, ai_route_len); O(rdma_addrinfo, ai_route); O(rdma_addrinfo, ai_connect_len);
	O(rdma_addrinfo, ai_connect); O(rdma_addrinfo, ai_next);
	return 0;
}
