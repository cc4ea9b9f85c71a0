/* Prints the size and field offsets of the libibverbs structures ferroce's C ABI mirrors, as
   the real <infiniband/verbs.h> lays them out; tests/layout.rs compares them with the Rust
   definitions. One line per item: "name value". */
#include <stddef.h>
#include <stdio.h>
#include <infiniband/verbs.h>

#define S(t) printf("sizeof %s %zu\n", #t, sizeof(struct t))
#define O(t, f) printf("offsetof %s.%s %zu\n", #t, #f, offsetof(struct t, f))

int main(void)
{
	S(ibv_device); O(ibv_device, node_type); O(ibv_device, name); O(ibv_device, ibdev_path);
	S(ibv_context_ops); O(ibv_context_ops, alloc_mw); O(ibv_context_ops, poll_cq);
	O(ibv_context_ops, req_notify_cq); O(ibv_context_ops, post_srq_recv);
	O(ibv_context_ops, post_send); O(ibv_context_ops, post_recv);
	S(ibv_context); O(ibv_context, ops); O(ibv_context, cmd_fd); O(ibv_context, async_fd);
	O(ibv_context, num_comp_vectors); O(ibv_context, mutex); O(ibv_context, abi_compat);
	S(verbs_context); O(verbs_context, query_port); O(verbs_context, priv);
	O(verbs_context, query_device_ex); O(verbs_context, create_qp_ex); O(verbs_context, sz);
	O(verbs_context, context);
	S(ibv_device_attr); O(ibv_device_attr, node_guid); O(ibv_device_attr, max_qp);
	O(ibv_device_attr, atomic_cap); O(ibv_device_attr, max_pkeys); O(ibv_device_attr, phys_port_cnt);
	O(ibv_device_attr_ex, phys_port_cnt_ex); O(ibv_device_attr_ex, completion_timestamp_mask);
	O(ibv_device_attr_ex, hca_core_clock); O(ibv_device_attr_ex, device_cap_flags_ex);
	O(verbs_context, query_rt_values);
	S(ibv_values_ex); O(ibv_values_ex, raw_clock); O(verbs_context, advise_mr);
	O(ibv_device_attr_ex, odp_caps); O(ibv_device_attr_ex, cq_mod_caps);
	O(verbs_context, modify_cq); S(ibv_modify_cq_attr); O(ibv_modify_cq_attr, moderate); S(ibv_mw); O(ibv_mw, type); S(ibv_mw_bind);
	O(ibv_mw_bind, bind_info); S(ibv_mw_bind_info); O(ibv_mw_bind_info, mw_access_flags);
	O(ibv_send_wr, bind_mw.bind_info);
	S(ibv_port_attr); O(ibv_port_attr, pkey_tbl_len); O(ibv_port_attr, link_layer);
	O(ibv_port_attr, port_cap_flags2);
	S(ibv_async_event); O(ibv_async_event, event_type);
	S(ibv_wc); O(ibv_wc, status); O(ibv_wc, imm_data); O(ibv_wc, wc_flags); O(ibv_wc, sl);
	S(ibv_pd); S(ibv_mr); O(ibv_mr, length); O(ibv_mr, lkey); O(ibv_mr, rkey);
	S(ibv_global_route); S(ibv_grh); S(ibv_ah_attr); O(ibv_ah_attr, dlid); O(ibv_ah_attr, is_global);
	O(ibv_ah_attr, port_num);
	S(ibv_srq_attr); S(ibv_srq_init_attr); S(ibv_qp_cap);
	S(ibv_qp_init_attr); O(ibv_qp_init_attr, cap); O(ibv_qp_init_attr, qp_type);
	O(ibv_qp_init_attr, sq_sig_all);
	S(ibv_qp_init_attr_ex); O(ibv_qp_init_attr_ex, comp_mask); O(ibv_qp_init_attr_ex, pd);
	O(ibv_qp_init_attr_ex, create_flags); O(ibv_qp_init_attr_ex, rx_hash_conf);
	O(ibv_qp_init_attr_ex, source_qpn); O(ibv_qp_init_attr_ex, send_ops_flags);
	S(ibv_qp_attr); O(ibv_qp_attr, qp_access_flags); O(ibv_qp_attr, cap); O(ibv_qp_attr, ah_attr);
	O(ibv_qp_attr, alt_ah_attr); O(ibv_qp_attr, pkey_index); O(ibv_qp_attr, max_rd_atomic);
	O(ibv_qp_attr, timeout); O(ibv_qp_attr, rnr_retry); O(ibv_qp_attr, rate_limit);
	S(ibv_sge); S(ibv_send_wr); O(ibv_send_wr, num_sge); O(ibv_send_wr, send_flags);
	O(ibv_send_wr, imm_data); O(ibv_send_wr, wr); O(ibv_send_wr, wr.atomic.swap);
	O(ibv_send_wr, wr.atomic.rkey); O(ibv_send_wr, wr.ud.remote_qkey); O(ibv_send_wr, qp_type);
	O(ibv_send_wr, bind_mw);
	S(ibv_recv_wr); O(ibv_recv_wr, num_sge);
	S(ibv_srq); O(ibv_srq, handle); O(ibv_srq, mutex); O(ibv_srq, cond); O(ibv_srq, events_completed);
	S(ibv_qp); O(ibv_qp, qp_num); O(ibv_qp, state); O(ibv_qp, qp_type); O(ibv_qp, mutex);
	O(ibv_qp, events_completed);
	S(ibv_qp_ex); O(ibv_qp_ex, comp_mask); O(ibv_qp_ex, wr_flags); O(ibv_qp_ex, wr_atomic_cmp_swp);
	O(ibv_qp_ex, wr_rdma_write); O(ibv_qp_ex, wr_set_ud_addr); O(ibv_qp_ex, wr_set_sge);
	O(ibv_qp_ex, wr_start); O(ibv_qp_ex, wr_complete); O(ibv_qp_ex, wr_abort);
	O(ibv_qp_ex, wr_atomic_write); S(ibv_data_buf);
	S(ibv_comp_channel); O(ibv_comp_channel, fd);
	S(ibv_cq); O(ibv_cq, cqe); O(ibv_cq, mutex); O(ibv_cq, comp_events_completed);
	O(ibv_cq, async_events_completed);
	S(ibv_cq_ex); O(ibv_cq_ex, comp_mask); O(ibv_cq_ex, status); O(ibv_cq_ex, wr_id);
	O(ibv_cq_ex, start_poll); O(ibv_cq_ex, read_opcode); O(ibv_cq_ex, read_completion_wallclock_ns);
	S(ibv_cq_init_attr_ex); O(ibv_cq_init_attr_ex, wc_flags); O(ibv_cq_init_attr_ex, parent_domain);
	O(verbs_context, create_cq_ex);
	O(verbs_context, open_qp); O(verbs_context, get_srq_num); O(verbs_context, create_srq_ex);
	O(verbs_context, open_xrcd); O(verbs_context, close_xrcd); O(ibv_device_attr_ex, xrc_odp_caps);
	S(ibv_srq_init_attr_ex); O(ibv_srq_init_attr_ex, comp_mask); O(ibv_srq_init_attr_ex, srq_type);
	O(ibv_srq_init_attr_ex, pd); O(ibv_srq_init_attr_ex, xrcd); O(ibv_srq_init_attr_ex, cq);
	O(ibv_srq_init_attr_ex, tm_cap); S(ibv_xrcd); S(ibv_xrcd_init_attr); O(ibv_xrcd_init_attr, fd);
	O(ibv_xrcd_init_attr, oflags); S(ibv_qp_open_attr); O(ibv_qp_open_attr, qp_num);
	O(ibv_qp_open_attr, xrcd); O(ibv_qp_open_attr, qp_context); O(ibv_qp_open_attr, qp_type);
	O(ibv_qp_init_attr_ex, xrcd);
	S(ibv_ah); O(ibv_ah, handle);
	S(ibv_gid_entry); O(ibv_gid_entry, gid_type);
	return 0;
}
