/*
 * zmq_peer: the ZeroMQ side of scripts/tcp-compare.sh, a benchmark peer, not a test.
 *
 * One process per side, each pinned by the script (taskset) to its own core, over
 * tcp://HOST:PORT with stock libzmq settings (one I/O thread per context, default
 * high-water marks, no socket options but the bounded waits below). HOST is 127.0.0.1, or the
 * IPv4 address in ZMQ_PEER_HOST (the server's, where both sides bind and connect: across
 * scripts/netns-two, 198.18.0.1):
 *
 *   zmq_peer pull PORT N SIZE          bind PULL, receive N messages of SIZE bytes, print
 *                                      "msgs_per_sec=R" (first to last message, at the receiver)
 *   zmq_peer push PORT N SIZE          connect PUSH, send N messages of SIZE bytes
 *   zmq_peer rep  PORT N SIZE WARMUP   bind REP, echo WARMUP + N messages
 *   zmq_peer req  PORT N SIZE WARMUP   connect REQ, WARMUP untimed then N timed round trips
 *                                      (clock_gettime(CLOCK_MONOTONIC) around each), print
 *                                      "rtt_ns p50=A p99_9=B min=C max=D n=N"
 *
 * Every wait is bounded: receives by ZMQ_RCVTIMEO, sends by ZMQ_SNDTIMEO, the close by
 * ZMQ_LINGER (WAIT_MS each). Every failing call prints what failed and exits 1; bad arguments
 * exit 2.
 *
 * Build: gcc -O2 -Wall -Wextra -Werror -o zmq_peer zmq_peer.c -lzmq
 */
#define _POSIX_C_SOURCE 200809L

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <zmq.h>

/* The longest any single receive, send or close may wait. */
#define WAIT_MS 10000

static void die(const char *what)
{
    fprintf(stderr, "zmq_peer: %s: %s\n", what, zmq_strerror(zmq_errno()));
    exit(1);
}

static uint64_t now_ns(void)
{
    struct timespec ts;
    if (clock_gettime(CLOCK_MONOTONIC, &ts) != 0) {
        perror("zmq_peer: clock_gettime");
        exit(1);
    }
    return (uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec;
}

static long parse(const char *s, const char *name, long min)
{
    char *end;
    errno = 0;
    long v = strtol(s, &end, 10);
    if (errno != 0 || *end != '\0' || v < min) {
        fprintf(stderr, "zmq_peer: bad %s '%s' (an integer >= %ld)\n", name, s, min);
        exit(2);
    }
    return v;
}

static void set_int(void *sock, int option, int value, const char *what)
{
    if (zmq_setsockopt(sock, option, &value, sizeof value) != 0)
        die(what);
}

static void *open_socket(void *ctx, int type, int bind, long port)
{
    char endpoint[64];
    void *sock = zmq_socket(ctx, type);
    if (sock == NULL)
        die("zmq_socket");
    set_int(sock, ZMQ_RCVTIMEO, WAIT_MS, "ZMQ_RCVTIMEO");
    set_int(sock, ZMQ_SNDTIMEO, WAIT_MS, "ZMQ_SNDTIMEO");
    set_int(sock, ZMQ_LINGER, WAIT_MS, "ZMQ_LINGER");
    const char *host = getenv("ZMQ_PEER_HOST");
    if (host == NULL || *host == '\0')
        host = "127.0.0.1";
    int len = snprintf(endpoint, sizeof endpoint, "tcp://%s:%ld", host, port);
    if (len < 0 || (size_t)len >= sizeof endpoint) {
        fprintf(stderr, "zmq_peer: ZMQ_PEER_HOST is too long: %s\n", host);
        exit(2);
    }
    if ((bind ? zmq_bind(sock, endpoint) : zmq_connect(sock, endpoint)) != 0)
        die(bind ? "zmq_bind" : "zmq_connect");
    return sock;
}

static void send_exact(void *sock, const char *buf, size_t size)
{
    if (zmq_send(sock, buf, size, 0) != (int)size)
        die("zmq_send (or its ZMQ_SNDTIMEO ran out)");
}

static void recv_exact(void *sock, char *buf, size_t size)
{
    int n = zmq_recv(sock, buf, size, 0);
    if (n < 0)
        die("zmq_recv (or its ZMQ_RCVTIMEO ran out)");
    if ((size_t)n != size) {
        fprintf(stderr, "zmq_peer: received %d bytes, expected %zu\n", n, size);
        exit(1);
    }
}

static int cmp_u64(const void *a, const void *b)
{
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return (x > y) - (x < y);
}

/* Nearest rank: the smallest sample with at least q of the samples at or below it. */
static uint64_t percentile(const uint64_t *sorted, long n, double q)
{
    double exact = q * (double)n;
    long rank = (long)exact;
    if ((double)rank < exact)
        rank++; /* the ceiling, without libm */
    if (rank < 1)
        rank = 1;
    if (rank > n)
        rank = n;
    return sorted[rank - 1];
}

int main(int argc, char **argv)
{
    if (argc < 5 || argc > 6) {
        fprintf(stderr, "usage: zmq_peer pull|push|rep|req PORT N SIZE [WARMUP]\n");
        return 2;
    }
    const char *role = argv[1];
    long port = parse(argv[2], "PORT", 1);
    long n = parse(argv[3], "N", 2);
    long size = parse(argv[4], "SIZE", 1);
    long warmup = argc == 6 ? parse(argv[5], "WARMUP", 0) : 0;

    char *buf = calloc((size_t)size, 1);
    if (buf == NULL) {
        perror("zmq_peer: calloc");
        return 1;
    }
    void *ctx = zmq_ctx_new();
    if (ctx == NULL)
        die("zmq_ctx_new");

    void *sock;
    if (strcmp(role, "pull") == 0) {
        sock = open_socket(ctx, ZMQ_PULL, 1, port);
        recv_exact(sock, buf, (size_t)size);
        uint64_t t0 = now_ns();
        for (long i = 1; i < n; i++)
            recv_exact(sock, buf, (size_t)size);
        uint64_t dt = now_ns() - t0;
        /* n - 1 messages arrived in dt: the first one starts the clock. */
        printf("msgs_per_sec=%.0f n=%ld elapsed_ns=%llu\n", (double)(n - 1) * 1e9 / (double)dt,
               n, (unsigned long long)dt);
    } else if (strcmp(role, "push") == 0) {
        sock = open_socket(ctx, ZMQ_PUSH, 0, port);
        for (long i = 0; i < n; i++)
            send_exact(sock, buf, (size_t)size);
    } else if (strcmp(role, "rep") == 0) {
        sock = open_socket(ctx, ZMQ_REP, 1, port);
        for (long i = 0; i < warmup + n; i++) {
            recv_exact(sock, buf, (size_t)size);
            send_exact(sock, buf, (size_t)size);
        }
    } else if (strcmp(role, "req") == 0) {
        uint64_t *rtt = malloc((size_t)n * sizeof *rtt);
        if (rtt == NULL) {
            perror("zmq_peer: malloc");
            return 1;
        }
        sock = open_socket(ctx, ZMQ_REQ, 0, port);
        for (long i = 0; i < warmup; i++) {
            send_exact(sock, buf, (size_t)size);
            recv_exact(sock, buf, (size_t)size);
        }
        for (long i = 0; i < n; i++) {
            uint64_t t0 = now_ns();
            send_exact(sock, buf, (size_t)size);
            recv_exact(sock, buf, (size_t)size);
            rtt[i] = now_ns() - t0;
        }
        qsort(rtt, (size_t)n, sizeof *rtt, cmp_u64);
        printf("rtt_ns p50=%llu p99_9=%llu min=%llu max=%llu n=%ld\n",
               (unsigned long long)percentile(rtt, n, 0.5),
               (unsigned long long)percentile(rtt, n, 0.999), (unsigned long long)rtt[0],
               (unsigned long long)rtt[n - 1], n);
        free(rtt);
    } else {
        fprintf(stderr, "zmq_peer: unknown role '%s' (pull, push, rep or req)\n", role);
        return 2;
    }

    if (zmq_close(sock) != 0)
        die("zmq_close");
    if (zmq_ctx_term(ctx) != 0)
        die("zmq_ctx_term");
    free(buf);
    return 0;
}
