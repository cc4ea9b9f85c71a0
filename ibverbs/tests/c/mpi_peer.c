/*
 * mpi_peer: an MPI program for the MPI guard tests (ibverbs/tests/middleware.rs), built with
 * Open MPI's and MPICH's mpicc and run on ferroce's libraries through UCX's verbs transports.
 * Every byte is checked: a ping-pong between ranks 0 and 1 at every power of two from 1 byte
 * to 4 MiB, Allreduce, Bcast, Alltoall, and one-sided Put and Get in fence epochs. Prints
 * "ok mpi N ranks" from rank 0; exits 1 naming the first wrong byte otherwise.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static int rank, size;

static unsigned char pattern(long i, int seed)
{
	return (unsigned char)((i * 131 + seed * 7 + (i >> 9)) & 255);
}

static void fail(const char *what, long at, int got, int want)
{
	fprintf(stderr, "rank %d: %s: byte %ld is %d, not %d\n", rank, what, at, got, want);
	MPI_Abort(MPI_COMM_WORLD, 1);
}

static void ping_pong(void)
{
	const long max = 4L << 20;
	unsigned char *buf = malloc(max);
	for (long n = 1; n <= max; n *= 2) {
		if (rank == 0) {
			for (long i = 0; i < n; i++)
				buf[i] = pattern(i, (int)n);
			MPI_Send(buf, (int)n, MPI_BYTE, 1, 1, MPI_COMM_WORLD);
			memset(buf, 0, n);
			MPI_Recv(buf, (int)n, MPI_BYTE, 1, 2, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			for (long i = 0; i < n; i++)
				if (buf[i] != (unsigned char)~pattern(i, (int)n))
					fail("ping-pong back", i, buf[i], (unsigned char)~pattern(i, (int)n));
		} else if (rank == 1) {
			MPI_Recv(buf, (int)n, MPI_BYTE, 0, 1, MPI_COMM_WORLD, MPI_STATUS_IGNORE);
			for (long i = 0; i < n; i++) {
				if (buf[i] != pattern(i, (int)n))
					fail("ping-pong there", i, buf[i], pattern(i, (int)n));
				buf[i] = (unsigned char)~buf[i];
			}
			MPI_Send(buf, (int)n, MPI_BYTE, 0, 2, MPI_COMM_WORLD);
		}
	}
	free(buf);
}

static void collectives(void)
{
	const int n = 1 << 16;
	long *in = malloc(n * sizeof(long)), *out = malloc(n * sizeof(long));
	for (int i = 0; i < n; i++)
		in[i] = (long)i * (rank + 1);
	MPI_Allreduce(in, out, n, MPI_LONG, MPI_SUM, MPI_COMM_WORLD);
	long ranks = (long)size * (size + 1) / 2;
	for (int i = 0; i < n; i++)
		if (out[i] != (long)i * ranks)
			fail("allreduce", i, (int)out[i], (int)((long)i * ranks));

	unsigned char *b = malloc(1 << 20);
	for (long i = 0; i < (1 << 20); i++)
		b[i] = rank == 0 ? pattern(i, 3) : 0;
	MPI_Bcast(b, 1 << 20, MPI_BYTE, 0, MPI_COMM_WORLD);
	for (long i = 0; i < (1 << 20); i++)
		if (b[i] != pattern(i, 3))
			fail("bcast", i, b[i], pattern(i, 3));

	const int per = 4096;
	unsigned char *s = malloc((size_t)per * size), *r = malloc((size_t)per * size);
	for (int d = 0; d < size; d++)
		for (int i = 0; i < per; i++)
			s[d * per + i] = pattern(i, rank * 16 + d);
	MPI_Alltoall(s, per, MPI_BYTE, r, per, MPI_BYTE, MPI_COMM_WORLD);
	for (int src = 0; src < size; src++)
		for (int i = 0; i < per; i++)
			if (r[src * per + i] != pattern(i, src * 16 + rank))
				fail("alltoall", (long)src * per + i, r[src * per + i],
				     pattern(i, src * 16 + rank));
	free(in); free(out); free(b); free(s); free(r);
}

static void one_sided(void)
{
	const int n = 1 << 18;
	unsigned char *mem = malloc(n), *local = malloc(n);
	for (int i = 0; i < n; i++)
		mem[i] = pattern(i, 100 + rank);
	MPI_Win win;
	MPI_Win_create(mem, n, 1, MPI_INFO_NULL, MPI_COMM_WORLD, &win);
	int right = (rank + 1) % size, left = (rank + size - 1) % size;
	/* Get the right neighbour's memory. */
	MPI_Win_fence(0, win);
	MPI_Get(local, n, MPI_BYTE, right, 0, n, MPI_BYTE, win);
	MPI_Win_fence(0, win);
	for (int i = 0; i < n; i++)
		if (local[i] != pattern(i, 100 + right))
			fail("get", i, local[i], pattern(i, 100 + right));
	/* Put a pattern of our own into it. */
	for (int i = 0; i < n; i++)
		local[i] = pattern(i, 200 + rank);
	MPI_Win_fence(0, win);
	MPI_Put(local, n, MPI_BYTE, right, 0, n, MPI_BYTE, win);
	MPI_Win_fence(0, win);
	for (int i = 0; i < n; i++)
		if (mem[i] != pattern(i, 200 + left))
			fail("put", i, mem[i], pattern(i, 200 + left));
	MPI_Win_free(&win);
	free(mem); free(local);
}

int main(int argc, char **argv)
{
	MPI_Init(&argc, &argv);
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &size);
	ping_pong();
	collectives();
	one_sided();
	MPI_Barrier(MPI_COMM_WORLD);
	/* Where the ranks ran: the hosts are told apart by their names. */
	char name[MPI_MAX_PROCESSOR_NAME] = { 0 };
	int len = 0;
	MPI_Get_processor_name(name, &len);
	char *names = rank == 0 ? calloc(size, MPI_MAX_PROCESSOR_NAME) : NULL;
	MPI_Gather(name, MPI_MAX_PROCESSOR_NAME, MPI_CHAR, names, MPI_MAX_PROCESSOR_NAME, MPI_CHAR,
		   0, MPI_COMM_WORLD);
	if (rank == 0) {
		int hosts = 0;
		for (int i = 0; i < size; i++) {
			int seen = 0;
			for (int j = 0; j < i; j++)
				seen |= strcmp(names + i * MPI_MAX_PROCESSOR_NAME,
					       names + j * MPI_MAX_PROCESSOR_NAME) == 0;
			hosts += !seen;
		}
		printf("ok mpi %d ranks on %d host%s\n", size, hosts, hosts == 1 ? "" : "s");
		free(names);
	}
	MPI_Finalize();
	return 0;
}
