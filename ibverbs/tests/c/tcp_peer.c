/* A plain TCP program, knowing nothing of RDMA: `tcp_peer server ADDR PORT` receives 4 MiB
 * and answers their checksum; `tcp_peer client ADDR PORT` sends them and checks the answer.
 * Run under librspreload.so it goes over rsockets. */
#include <arpa/inet.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>
#define N (4 << 20)
int main(int argc, char **argv) {
	struct sockaddr_in a = { .sin_family = AF_INET, .sin_port = htons(atoi(argv[3])) };
	inet_pton(AF_INET, argv[2], &a.sin_addr);
	int s = socket(AF_INET, SOCK_STREAM, 0);
	unsigned char *buf = malloc(N);
	unsigned long sum = 0;
	if (!strcmp(argv[1], "server")) {
		int one = 1;
		setsockopt(s, SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
		if (bind(s, (void *)&a, sizeof a) || listen(s, 1)) { perror("bind/listen"); return 1; }
		int c = accept(s, NULL, NULL);
		if (c < 0) { perror("accept"); return 1; }
		long got = 0;
		while (got < N) { long n = recv(c, buf + got, N - got, 0); if (n <= 0) { perror("recv"); return 1; } got += n; }
		for (long i = 0; i < N; i++) sum = sum * 31 + buf[i];
		if (send(c, &sum, sizeof sum, 0) != sizeof sum) { perror("send"); return 1; }
		printf("server: %ld bytes, sum %lx\n", got, sum);
		close(c);
	} else {
		if (connect(s, (void *)&a, sizeof a)) { perror("connect"); return 1; }
		for (long i = 0; i < N; i++) buf[i] = (unsigned char)(i * 7 + i / 251);
		for (long i = 0; i < N; i++) sum = sum * 31 + buf[i];
		long sent = 0;
		while (sent < N) { long n = send(s, buf + sent, N - sent, 0); if (n <= 0) { perror("send"); return 1; } sent += n; }
		unsigned long back = 0; long got = 0;
		while (got < (long)sizeof back) { long n = recv(s, (char *)&back + got, sizeof back - got, 0); if (n <= 0) { perror("recv"); return 1; } got += n; }
		printf("client: sum %s\n", back == sum ? "matches" : "differs");
		return back == sum ? 0 : 1;
	}
	close(s);
	return 0;
}
