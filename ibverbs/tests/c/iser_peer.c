/* An iSER initiator on libiscsi's API (Debian's libiscsi-dev; its iSER transport runs on
 * librdmacm and libibverbs): `iser_peer URL INITIATOR FILE` logs in to the LUN of
 * iser://ADDR/IQN/LUN, writes 4 KiB of a pattern at LBA 2048 (WRITE16), then reads the whole
 * LUN back (READ16, 64 KiB at a time) and compares every byte with FILE, the target's backing
 * store. Run against tgt's iSER target on ferroce's libraries (ibverbs/tests/middleware.rs).
 * Prints "ok iser" and exits 0, or says what broke and exits 1. */
#include <fcntl.h>
#include <iscsi/iscsi.h>
#include <iscsi/scsi-lowlevel.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#define BLOCK 512
#define CHUNK 65536

static void fail(struct iscsi_context *iscsi, const char *what)
{
	fprintf(stderr, "iser: %s: %s\n", what, iscsi ? iscsi_get_error(iscsi) : "");
	exit(1);
}

static void on_alarm(int sig)
{
	(void)sig;
	static const char msg[] = "hung: the alarm went off\n";
	(void)!write(2, msg, sizeof msg - 1);
	_exit(2);
}

int main(int argc, char **argv)
{
	if (argc != 4)
		return 2;
	signal(SIGALRM, on_alarm);
	alarm(120);
	struct iscsi_context *iscsi = iscsi_create_context(argv[2]);
	if (!iscsi)
		fail(NULL, "iscsi_create_context");
	struct iscsi_url *url = iscsi_parse_full_url(iscsi, argv[1]);
	if (!url)
		fail(iscsi, "iscsi_parse_full_url");
	iscsi_set_targetname(iscsi, url->target);
	iscsi_set_session_type(iscsi, ISCSI_SESSION_NORMAL);
	iscsi_set_header_digest(iscsi, ISCSI_HEADER_DIGEST_NONE_CRC32C);
	if (iscsi_full_connect_sync(iscsi, url->portal, url->lun) != 0)
		fail(iscsi, "login");

	/* A write the read-back must see. */
	unsigned char pattern[4096];
	for (size_t i = 0; i < sizeof pattern; i++)
		pattern[i] = (unsigned char)(i * 13 + 5);
	struct scsi_task *t = iscsi_write16_sync(iscsi, url->lun, 2048, pattern, sizeof pattern,
						 BLOCK, 0, 0, 1, 0, 0);
	if (!t || t->status != SCSI_STATUS_GOOD)
		fail(iscsi, "WRITE16");
	scsi_free_scsi_task(t);

	int fd = open(argv[3], O_RDONLY);
	if (fd < 0) {
		perror("open FILE");
		return 1;
	}
	off_t size = lseek(fd, 0, SEEK_END);
	static unsigned char want[CHUNK];
	for (off_t off = 0; off < size; off += CHUNK) {
		t = iscsi_read16_sync(iscsi, url->lun, off / BLOCK, CHUNK, BLOCK, 0, 0, 0, 0, 0);
		if (!t || t->status != SCSI_STATUS_GOOD || t->datain.size != CHUNK)
			fail(iscsi, "READ16");
		if (pread(fd, want, CHUNK, off) != CHUNK) {
			perror("pread FILE");
			return 1;
		}
		if (off == 2048 * BLOCK && memcmp(want, pattern, sizeof pattern) != 0) {
			fprintf(stderr, "iser: the backing store lacks the write\n");
			return 1;
		}
		if (memcmp(t->datain.data, want, CHUNK) != 0) {
			fprintf(stderr, "iser: the LUN's bytes at %lld differ from the file's\n",
				(long long)off);
			return 1;
		}
		scsi_free_scsi_task(t);
	}
	close(fd);
	iscsi_logout_sync(iscsi);
	iscsi_destroy_url(url);
	iscsi_destroy_context(iscsi);
	printf("ok iser (%lld bytes read and checked)\n", (long long)size);
	return 0;
}
