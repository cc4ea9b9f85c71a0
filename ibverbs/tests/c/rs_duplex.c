/* Full duplex on rsockets from several threads: a connected pair in one process, and on each
 * socket one thread sending 8 MiB (blocking rsend) while another receives the peer's 8 MiB
 * (blocking rrecv) — a receiver waiting for data must not keep its socket's sender out. Every
 * byte is checked. Prints "ok" when all hold; an alarm ends a stuck run. */
#include <arpa/inet.h>
#include <errno.h>
#include <pthread.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <unistd.h>
#include <rdma/rsocket.h>

#define TOTAL (8u << 20)

struct job {
	int fd;
	unsigned seed;
	int ok;
};

static uint8_t byte_at(unsigned seed, size_t i)
{
	return (uint8_t)(i * 31 + i / 4093 + seed);
}

static void *sender(void *arg)
{
	struct job *j = arg;
	static __thread uint8_t buf[65536];
	size_t off = 0;
	while (off < TOTAL) {
		size_t n = TOTAL - off < sizeof buf ? TOTAL - off : sizeof buf;
		for (size_t i = 0; i < n; i++)
			buf[i] = byte_at(j->seed, off + i);
		ssize_t k = rsend(j->fd, buf, n, 0);
		if (k <= 0) {
			printf("FAIL rsend at %zu: errno %d\n", off, errno);
			return NULL;
		}
		off += (size_t)k;
	}
	j->ok = 1;
	return NULL;
}

static void *receiver(void *arg)
{
	struct job *j = arg;
	static __thread uint8_t buf[40000];
	size_t off = 0;
	while (off < TOTAL) {
		ssize_t k = rrecv(j->fd, buf, sizeof buf, 0);
		if (k <= 0) {
			printf("FAIL rrecv at %zu: %zd, errno %d\n", off, k, errno);
			return NULL;
		}
		for (ssize_t i = 0; i < k; i++)
			if (buf[i] != byte_at(j->seed, off + i)) {
				printf("FAIL byte %zu\n", off + i);
				return NULL;
			}
		off += (size_t)k;
	}
	j->ok = 1;
	return NULL;
}

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(7961) };
	inet_pton(AF_INET, argc > 1 ? argv[1] : "127.0.80.2", &a.sin_addr);
	alarm(100);
	int l = rsocket(AF_INET, SOCK_STREAM, 0);
	if (l < 0 || rbind(l, (void *)&a, sizeof a) || rlisten(l, 4)) {
		printf("FAIL listen: errno %d\n", errno);
		return 1;
	}
	int c = rsocket(AF_INET, SOCK_STREAM, 0);
	if (c < 0 || rconnect(c, (void *)&a, sizeof a)) {
		printf("FAIL rconnect: errno %d\n", errno);
		return 1;
	}
	int s = raccept(l, NULL, NULL);
	if (s < 0) {
		printf("FAIL raccept: errno %d\n", errno);
		return 1;
	}
	/* c sends seed 1 and receives seed 2; s the other way round. */
	struct job jobs[4] = { { c, 1, 0 }, { s, 1, 0 }, { s, 2, 0 }, { c, 2, 0 } };
	pthread_t t[4];
	pthread_create(&t[0], NULL, sender, &jobs[0]);
	pthread_create(&t[1], NULL, receiver, &jobs[1]);
	pthread_create(&t[2], NULL, sender, &jobs[2]);
	pthread_create(&t[3], NULL, receiver, &jobs[3]);
	for (int i = 0; i < 4; i++)
		pthread_join(t[i], NULL);
	for (int i = 0; i < 4; i++)
		if (!jobs[i].ok) {
			printf("FAIL job %d\n", i);
			return 1;
		}
	rclose(c);
	rclose(s);
	rclose(l);
	printf("ok\n");
	return 0;
}
