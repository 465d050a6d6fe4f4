/* A stand-in HA slave for ha_bench.py syncasync --slave ideal: it acknowledges every frame as soon
 * as the frame is whole and stores nothing, so that a SYNC_MASTER waits for a slave costing next to
 * no CPU. It bounds what any slave implementation could do for the SYNC/ASYNC ratio on this host.
 *
 * Slave -> master report:          Master -> slave frame:
 *   0  int64  max offset (BE)        0  int64  commitlog offset of the body (BE)
 *                                    8  int32  body size (BE; 0 = heartbeat)
 *                                   12  body
 */
#include <arpa/inet.h>
#include <endian.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

static int report(int fd, int64_t offset) {
    uint64_t be = htobe64((uint64_t)offset);
    return send(fd, &be, sizeof be, 0) == (ssize_t)sizeof be ? 0 : -1;
}

int main(int argc, char **argv) {
    static unsigned char buf[1 << 22];
    if (argc != 2) {
        fprintf(stderr, "usage: %s HA_PORT (on 127.0.0.1)\n", argv[0]);
        return 2;
    }
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_port = htons((uint16_t)atoi(argv[1])),
                               .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    if (fd < 0 || connect(fd, (struct sockaddr *)&addr, sizeof addr) < 0) {
        perror("connect");
        return 1;
    }
    int one = 1;
    setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof one);
    int64_t end = 0;        /* end of the bytes received */
    int64_t body_left = 0;  /* bytes of the current frame's body still to come */
    size_t have = 0;
    time_t last = time(NULL);
    if (report(fd, 0) < 0)
        return 1;
    for (;;) {
        ssize_t n = recv(fd, buf + have, sizeof buf - have, 0);
        if (n <= 0)
            return 0;
        have += (size_t)n;
        size_t p = 0;
        for (;;) {
            if (body_left > 0) {
                size_t k = have - p < (size_t)body_left ? have - p : (size_t)body_left;
                p += k;
                body_left -= (int64_t)k;
                end += (int64_t)k;
                if (body_left > 0)
                    break;
                continue;
            }
            if (have - p < 12)
                break;
            uint64_t offset;
            uint32_t size;
            memcpy(&offset, buf + p, 8);
            memcpy(&size, buf + p + 8, 4);
            p += 12;
            if ((int64_t)be64toh(offset) != end) {
                fprintf(stderr, "frame at %lld, expected %lld\n", (long long)be64toh(offset), (long long)end);
                return 1;
            }
            body_left = (int32_t)ntohl(size);
        }
        memmove(buf, buf + p, have - p);
        have -= p;
        /* Whole frames are acknowledged at once; a heartbeat report at least once a second. */
        if (body_left == 0 || time(NULL) != last) {
            if (report(fd, end) < 0)
                return 1;
            last = time(NULL);
        }
    }
}
