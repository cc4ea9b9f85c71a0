/*
 * late_listen.so: an LD_PRELOAD library for the server side of the interop suite's "late
 * listen" scenario. It makes the process's second rdma_listen wait 3 s before it listens, so
 * a perftest -R server (its control ID listens first, its data ID second) accepts the
 * control connection at once and has nobody listening when the client asks for the data
 * connection: the client's CM answer is REJ 8 (invalid ServiceID), deterministically. The
 * client under test is not touched.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <rdma/rdma_cma.h>
#include <unistd.h>

typedef int (*listen_fn)(struct rdma_cm_id *, int);

int rdma_listen(struct rdma_cm_id *id, int backlog)
{
	static int calls;
	listen_fn next = (listen_fn)dlsym(RTLD_NEXT, "rdma_listen");

	if (!next)
		return -1;
	if (++calls == 2)
		sleep(3);
	return next(id, backlog);
}
