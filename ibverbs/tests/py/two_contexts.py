"""Two contexts of one ferroce device in one process, the pyverbs test suite's pattern: an RC QP
of each connected to the other over the one address, SEND and RDMA WRITE both ways with the bytes
checked, then one context closed while the other stays usable. Run by ibverbs/tests/programs.rs
with LD_LIBRARY_PATH at ferroce's libibverbs.so.1."""
import pyverbs.device as d
import pyverbs.enums as e
from pyverbs.pd import PD
from pyverbs.cq import CQ
from pyverbs.mr import MR
from pyverbs.qp import QPInitAttr, QPCap, QP, QPAttr
from pyverbs.addr import AHAttr, GlobalRoute
from pyverbs.wr import SGE, SendWR, RecvWR

def side(name):
    ctx = d.Context(name=name)
    pd = PD(ctx)
    cq = CQ(ctx, 16)
    qp = QP(pd, QPInitAttr(qp_type=e.IBV_QPT_RC, scq=cq, rcq=cq, cap=QPCap(max_send_wr=8, max_recv_wr=8)))
    acc = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
    mr = MR(pd, 4096, acc)
    return ctx, pd, cq, qp, mr

def up(me, peer):
    ctx, qp = me[0], me[3]
    gid = peer[0].query_gid(1, 1)
    gr = GlobalRoute(dgid=gid, sgid_index=1)
    attr = QPAttr(qp_state=e.IBV_QPS_RTS, path_mtu=e.IBV_MTU_1024)
    attr.dest_qp_num = peer[3].qp_num
    attr.ah_attr = AHAttr(gr=gr, is_global=1, port_num=1)
    attr.qp_access_flags = e.IBV_ACCESS_LOCAL_WRITE | e.IBV_ACCESS_REMOTE_WRITE | e.IBV_ACCESS_REMOTE_READ
    attr.max_dest_rd_atomic = 1
    attr.max_rd_atomic = 1
    attr.min_rnr_timer = 12
    attr.timeout = 14
    attr.retry_cnt = 7
    attr.rnr_retry = 7
    qp.to_rts(attr)

def poll(cq):
    for _ in range(2000000):
        n, wcs = cq.poll()
        if n:
            assert wcs[0].status == e.IBV_WC_SUCCESS, wcs[0].status
            return wcs[0]
    raise SystemExit("no completion")

server, client = side('ferroce0'), side('ferroce0')
assert server[3].qp_num != client[3].qp_num
up(server, client); up(client, server)
for (src, dst, tag) in [(client, server, b'c2s'), (server, client, b's2c')]:
    msg = tag * 100
    dst[4].write(b'\0' * 300, 300, 0)
    dst[3].post_recv(RecvWR(wr_id=1, num_sge=1, sg=[SGE(dst[4].buf, 300, dst[4].lkey)]))
    src[4].write(msg, len(msg), 0)
    src[3].post_send(SendWR(wr_id=2, opcode=e.IBV_WR_SEND, num_sge=1, sg=[SGE(src[4].buf, len(msg), src[4].lkey)], send_flags=e.IBV_SEND_SIGNALED))
    poll(src[2]); wc = poll(dst[2])
    assert wc.byte_len == len(msg) and dst[4].read(len(msg), 0) == msg
    # RDMA WRITE into the other context's region.
    wr = SendWR(wr_id=3, opcode=e.IBV_WR_RDMA_WRITE, num_sge=1, sg=[SGE(src[4].buf, len(msg), src[4].lkey)], send_flags=e.IBV_SEND_SIGNALED)
    wr.set_wr_rdma(dst[4].rkey, dst[4].buf + 1024)
    src[3].post_send(wr)
    poll(src[2])
    assert dst[4].read(len(msg), 1024) == msg
# One context closed, the other still works on its own device.
client[3].close(); client[4].close(); client[2].close(); client[1].close(); client[0].close()
print(server[0].query_port(1).state == e.IBV_PORT_ACTIVE and "two contexts ok")
