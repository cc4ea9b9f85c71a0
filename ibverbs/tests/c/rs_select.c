/* rsockets through their own API: a listener and a client rsocket in one process, the
 * accept and the data awaited with rselect and rpoll, a nonblocking rrecv's EAGAIN, the
 * peer's name, rsendmsg/rrecvmsg over iovecs, and the end of the stream after rshutdown.
 * Prints "ok" when all hold. */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <poll.h>
#include <stdio.h>
#include <string.h>
#include <sys/select.h>
#include <rdma/rsocket.h>

#define CHECK(c, ...) do { if (!(c)) { printf("FAIL line %d: %s: ", __LINE__, #c); \
	printf(__VA_ARGS__); printf(" (errno %d)\n", errno); return 1; } } while (0)

int main(int argc, char **argv)
{
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(7960) };
	inet_pton(AF_INET, argc > 1 ? argv[1] : "127.0.80.1", &a.sin_addr);
	int l = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(l >= 0, "rsocket");
	CHECK(rbind(l, (void *)&a, sizeof a) == 0 && rlisten(l, 4) == 0, "bind, listen");
	int c = rsocket(AF_INET, SOCK_STREAM, 0);
	CHECK(c >= 0 && rconnect(c, (void *)&a, sizeof a) == 0, "rconnect");
	fd_set r;
	FD_ZERO(&r);
	FD_SET(l, &r);
	struct timeval t = { .tv_sec = 5 };
	CHECK(rselect(l + 1, &r, NULL, NULL, &t) == 1 && FD_ISSET(l, &r), "rselect on the listener");
	int s = raccept(l, NULL, NULL);
	CHECK(s >= 0, "raccept");
	char buf[64];
	CHECK(rfcntl(s, F_SETFL, O_NONBLOCK) == 0, "O_NONBLOCK");
	CHECK(rrecv(s, buf, sizeof buf, 0) < 0 && errno == EAGAIN, "nothing yet: EAGAIN");
	CHECK(rsend(c, "hello rsockets", 14, 0) == 14, "rsend");
	struct pollfd p = { .fd = s, .events = POLLIN };
	CHECK(rpoll(&p, 1, 5000) == 1 && (p.revents & POLLIN), "rpoll for the data");
	CHECK(rrecv(s, buf, sizeof buf, 0) == 14 && !memcmp(buf, "hello rsockets", 14), "rrecv");
	struct sockaddr_in peer;
	socklen_t len = sizeof peer;
	CHECK(rgetpeername(s, (void *)&peer, &len) == 0 && peer.sin_addr.s_addr == a.sin_addr.s_addr,
	      "the peer's name");
	{
		/* rsendmsg gathers, rrecvmsg scatters; control data is refused as rdma-core's. */
		char a1[] = "scatter ", a2[] = "gather", b1[5], b2[16];
		struct iovec out[2] = { { a1, 8 }, { a2, 6 } }, in[2] = { { b1, 5 }, { b2, 16 } };
		struct msghdr m = { .msg_iov = out, .msg_iovlen = 2 };
		char ctl[16];
		CHECK(rsendmsg(c, &m, 0) == 14, "rsendmsg");
		m.msg_iov = in;
		CHECK(rpoll(&p, 1, 5000) == 1, "rpoll for the message");
		CHECK(rrecvmsg(s, &m, 0) == 14 && !memcmp(b1, "scatt", 5) && !memcmp(b2, "er gather", 9),
		      "rrecvmsg");
		m.msg_control = ctl;
		m.msg_controllen = sizeof ctl;
		CHECK(rsendmsg(c, &m, 0) < 0 && errno == ENOTSUP, "control data: ENOTSUP");
	}
	CHECK(rshutdown(c, SHUT_RDWR) == 0, "rshutdown");
	CHECK(rfcntl(s, F_SETFL, 0) == 0, "blocking again");
	CHECK(rrecv(s, buf, sizeof buf, 0) == 0, "the end of the stream");
	CHECK(rclose(c) == 0 && rclose(s) == 0 && rclose(l) == 0, "rclose");
	CHECK(rclose(l) < 0 && errno == EBADF, "a closed rsocket is EBADF");
	printf("ok\n");
	return 0;
}
