/*
 * pingpong.c - two-process shm ping-pong and one-way stream over libspinwire's C API.
 *
 *   pingpong server <endpoint> <messages>          echo <messages> messages, then exit
 *   pingpong client <endpoint> <messages> [size]   ping-pong, print RTT percentiles
 *   pingpong sink   <endpoint> <messages>          receive a stream with sw_poll, print rate
 *   pingpong source <endpoint> <messages> [size]   send a stream with sw_offer_batched
 *
 * Every message carries its sequence number and a payload derived from it; the server echoes
 * each one and then checks it, the client checks each echo once its round trip is timed (the
 * checks stay out of the measured round trip, as in `bench lat`), the sink checks order and
 * contents.
 * Both sides run in run-to-completion mode (no poller thread: one spinning thread per process).
 * Every wait is bounded, and every spin calls sw_spin_pause after a call that found nothing;
 * exit status 0 means every message was verified.
 *
 * Build (from the repository root):
 *   gcc -O2 -Iffi/include ffi/examples/pingpong.c -Ltarget/release \
 *       -Wl,-rpath,$PWD/target/release -lspinwire -o pingpong
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "spinwire.h"

#define WAIT_NS (10ull * 1000 * 1000 * 1000) /* bound of every wait */

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

static void die(const char *what, int64_t code) {
    fprintf(stderr, "pingpong: %s: %s (%s)\n", what, sw_strerror((int32_t)code), sw_errmsg());
    exit(1);
}

/* Dies on a failed call (a negative code). */
static void ok(const char *what, int64_t r) {
    if (r < 0) die(what, r);
}

/* The payload of message `seq` (at most 4096 bytes): the sequence number, then bytes derived
 * from it, copied from `pattern` (byte j is j mod 256) with one memcpy: a byte loop per message
 * cost the stream's source more instructions than its send (callgrind). */
static uint8_t pattern[256 + 4096];

static void init_pattern(void) {
    for (size_t j = 0; j < sizeof pattern; j++) pattern[j] = (uint8_t)j;
}

/* Where bytes 8.. of message `seq` are in `pattern`: byte i of the payload is
 * (seq * 31 + i) mod 256. */
static const uint8_t *tail(uint64_t seq) {
    return pattern + (size_t)((seq * 31 + 8) & 0xff);
}

static void fill(uint8_t *p, size_t size, uint64_t seq) {
    memcpy(p, &seq, size < 8 ? size : 8);
    if (size > 8) memcpy(p + 8, tail(seq), size - 8);
}

static int check(const uint8_t *p, size_t len, size_t size, uint64_t seq) {
    if (len != size || size > 4096) return 0;
    if (memcmp(p, &seq, size < 8 ? size : 8) != 0) return 0;
    return size <= 8 || memcmp(p + 8, tail(seq), size - 8) == 0;
}

/* Receive state: what the handler checks and what it copies for an echo. */
struct rx {
    uint64_t expect; /* next sequence number */
    size_t size;     /* 0: learn from the first message */
    uint64_t bad;
    uint8_t last[4096];
    size_t last_len;
};

/* The stream's handler: checks each message where it lies (nothing is kept). */
static void on_msg(void *clientd, const uint8_t *data, size_t len) {
    struct rx *rx = clientd;
    if (rx->size == 0) rx->size = len;
    if (!check(data, len, rx->size, rx->expect)) rx->bad++;
    rx->expect++;
}

/* The ping-pong's handler: keeps a copy of the message, checked by check_last afterwards. */
static void on_echo(void *clientd, const uint8_t *data, size_t len) {
    struct rx *rx = clientd;
    rx->last_len = len < sizeof rx->last ? len : sizeof rx->last;
    memcpy(rx->last, data, rx->last_len);
}

/* Checks the copy on_echo kept as the next message expected. */
static void check_last(struct rx *rx) {
    if (rx->size == 0) rx->size = rx->last_len;
    if (!check(rx->last, rx->last_len, rx->size, rx->expect)) rx->bad++;
    rx->expect++;
}

/* Waits (bounded) for one message, handed to `handler` (on_echo: copied into `clientd`). */
static void recv_one(sw_conn *conn, sw_handler handler, void *clientd) {
    uint64_t deadline = 0;
    for (uint32_t spins = 0;; spins++) {
        int64_t n = sw_poll(conn, handler, clientd, 1);
        if (n > 0) return;
        if (n < 0) die("sw_poll", n);
        sw_spin_pause(); /* a spin without it costs each round trip ~30 ns per side here */
        if ((spins & 1023) == 0) {
            uint64_t t = now_ns();
            if (deadline == 0) deadline = t + WAIT_NS;
            else if (t > deadline) die("recv", SW_TIMEOUT);
        }
    }
}

/* Sends one message (`batched`: sw_offer_batched, published by a later flush), polling
 * (bounded) while back-pressured. An sw_offer needs no flush: on shm it is visible when the call
 * returns, and elsewhere the next sw_poll posts it (the ping-pong's next call). */
static void send_one(sw_conn *conn, const uint8_t *data, size_t len, int batched) {
    uint64_t deadline = 0;
    for (uint32_t spins = 0;; spins++) {
        int64_t r = batched ? sw_offer_batched(conn, data, len) : sw_offer(conn, data, len);
        if (r > 0) break;
        if (r != SW_BACK_PRESSURED) die("sw_offer", r);
        sw_spin_pause();
        if ((spins & 1023) == 0) {
            uint64_t t = now_ns();
            if (deadline == 0) deadline = t + WAIT_NS;
            else if (t > deadline) die("send", SW_TIMEOUT);
        }
        ok("sw_flush", sw_flush(conn));
    }
}

/* The server's handler: echoes the message from where it lies (sw_offer from inside the
 * handler, no copy first), then keeps a copy for check_last, after the echo is on its way. */
struct echo {
    sw_conn *conn;
    struct rx *rx;
};

static void on_ping(void *clientd, const uint8_t *data, size_t len) {
    struct echo *e = clientd;
    send_one(e->conn, data, len, 0);
    on_echo(e->rx, data, len);
}

static int cmp_u64(const void *a, const void *b) {
    uint64_t x = *(const uint64_t *)a, y = *(const uint64_t *)b;
    return x < y ? -1 : x > y;
}

/* The mean of the sorted round trips up to the p99 ("tm99"): where the clock ticks coarsely
 * (10 ns on some guests) a p50 moves a whole tick at a time, and this resolves a few ns. */
static double tm99(const uint64_t *sorted, uint64_t n) {
    uint64_t last = (n - 1) * 99 / 100;
    double sum = 0;
    for (uint64_t i = 0; i <= last; i++) sum += (double)sorted[i];
    return sum / (double)(last + 1);
}

static sw_conn *connect_retry(sw_engine *engine, const char *ep) {
    sw_conn *conn = NULL;
    uint64_t deadline = now_ns() + WAIT_NS;
    for (;;) {
        int32_t r = sw_connect(engine, ep, 2000000000ull, &conn);
        if (r == SW_OK) return conn;
        /* The server may not listen yet. */
        if (r != SW_NOT_CONNECTED || now_ns() > deadline) die("sw_connect", r);
        struct timespec ts = {0, 10 * 1000 * 1000};
        nanosleep(&ts, NULL);
    }
}

static sw_conn *accept_one(sw_engine *engine, const char *ep, sw_listener **l) {
    sw_conn *conn = NULL;
    int32_t r = sw_listen(engine, ep, l);
    if (r != SW_OK) die("sw_listen", r);
    fprintf(stderr, "listening on %s\n", ep);
    r = sw_accept(*l, 30ull * 1000000000ull, &conn);
    if (r != SW_OK) die("sw_accept", r);
    return conn;
}

/* Drains until the peer has closed (bounded), so the last messages are not lost to our exit. */
static void wait_closed(sw_conn *conn, struct rx *rx) {
    uint64_t deadline = now_ns() + WAIT_NS;
    while (now_ns() < deadline) {
        int64_t n = sw_poll(conn, on_msg, rx, 64);
        if (n == SW_CLOSED) return;
        if (n < 0) die("sw_poll", n);
        if (n == 0) sw_spin_pause();
    }
    die("waiting for the peer to close", SW_TIMEOUT);
}

int main(int argc, char **argv) {
    init_pattern();
    if (argc < 4) {
        fprintf(stderr, "usage: pingpong server|client|sink|source <endpoint> <messages> [size]\n");
        return 2;
    }
    const char *role = argv[1], *ep = argv[2];
    uint64_t count = strtoull(argv[3], NULL, 10);
    size_t size = argc > 4 ? strtoul(argv[4], NULL, 10) : 32;
    if (size < 8 || size > 4096) {
        fprintf(stderr, "pingpong: size must be in 8..=4096\n");
        return 2;
    }
    sw_config cfg;
    ok("sw_config_init", sw_config_init(&cfg));
    cfg.buffer_size = 4096;
    cfg.buffers = 64;
    sw_engine *engine = NULL;
    int32_t r = sw_engine_new(&cfg, &engine);
    if (r != SW_OK) die("sw_engine_new", r);
    struct rx rx = {0};
    sw_listener *l = NULL;

    if (strcmp(role, "server") == 0) {
        sw_conn *conn = accept_one(engine, ep, &l);
        uint64_t echoed = 0;
        struct echo echo = {conn, &rx};
        while (echoed < count) {
            recv_one(conn, on_ping, &echo);
            check_last(&rx);
            echoed++;
        }
        wait_closed(conn, &rx);
        fprintf(stderr, "server: echoed %llu messages, %llu bad\n", (unsigned long long)echoed,
                (unsigned long long)rx.bad);
        ok("sw_conn_close", sw_conn_close(conn));
        ok("sw_listener_close", sw_listener_close(l));
        ok("sw_engine_close", sw_engine_close(engine));
        return rx.bad == 0 ? 0 : 1;
    }
    if (strcmp(role, "client") == 0) {
        sw_conn *conn = connect_retry(engine, ep);
        /* The first tenth warms up (verified, not timed). */
        uint64_t warmup = count / 10, timed = count - warmup;
        uint64_t *rtt = malloc(sizeof(uint64_t) * (timed ? timed : 1));
        uint8_t msg[4096];
        uint64_t bad = 0;
        for (uint64_t i = 0; i < count; i++) {
            fill(msg, size, i);
            uint64_t t0 = now_ns();
            send_one(conn, msg, size, 0);
            rx.expect = i;
            rx.size = size;
            uint64_t bad_before = rx.bad;
            recv_one(conn, on_echo, &rx);
            uint64_t t = now_ns() - t0;
            check_last(&rx);
            if (rx.bad != bad_before) bad++;
            if (i >= warmup) rtt[i - warmup] = t;
        }
        if (timed == 0) timed = 1, rtt[0] = 0;
        qsort(rtt, timed, sizeof *rtt, cmp_u64);
        printf("C ping-pong: %llu verified round trips of %zu B (%llu timed), %llu bad: "
               "RTT p50 %llu ns, tm99 %.1f ns, p99 %llu ns, max %llu ns\n",
               (unsigned long long)count, size, (unsigned long long)timed,
               (unsigned long long)bad, (unsigned long long)rtt[timed / 2], tm99(rtt, timed),
               (unsigned long long)rtt[(timed - 1) * 99 / 100],
               (unsigned long long)rtt[timed - 1]);
        free(rtt);
        ok("sw_conn_close", sw_conn_close(conn));
        ok("sw_engine_close", sw_engine_close(engine));
        return bad == 0 ? 0 : 1;
    }
    if (strcmp(role, "sink") == 0) {
        sw_conn *conn = accept_one(engine, ep, &l);
        uint64_t t0 = 0, deadline = now_ns() + 4 * WAIT_NS;
        for (uint32_t spins = 0; rx.expect < count; spins++) {
            int64_t n = sw_poll(conn, on_msg, &rx, 64);
            if (n < 0) die("sw_poll", n);
            if (n == 0) sw_spin_pause();
            if (n > 0 && t0 == 0) t0 = now_ns();
            if ((spins & 1023) == 0 && now_ns() > deadline) die("sink", SW_TIMEOUT);
        }
        uint64_t ns = now_ns() - t0;
        wait_closed(conn, &rx);
        printf("C stream (sw_poll): %llu messages of %zu B, %llu bad: %.2f Mmsg/s\n",
               (unsigned long long)rx.expect, rx.size, (unsigned long long)rx.bad,
               (double)count * 1e3 / (double)(ns ? ns : 1));
        ok("sw_conn_close", sw_conn_close(conn));
        ok("sw_listener_close", sw_listener_close(l));
        ok("sw_engine_close", sw_engine_close(engine));
        return rx.bad == 0 ? 0 : 1;
    }
    if (strcmp(role, "source") == 0) {
        sw_conn *conn = connect_retry(engine, ep);
        uint8_t msg[4096];
        for (uint64_t i = 0; i < count; i++) {
            fill(msg, size, i);
            send_one(conn, msg, size, 1);
        }
        ok("sw_flush", sw_flush(conn));
        /* Let the sink take everything before closing (bounded). */
        sw_conn_stats st;
        uint64_t deadline = now_ns() + WAIT_NS;
        do {
            ok("sw_engine_poll", sw_engine_poll(engine));
            ok("sw_conn_get_stats", sw_conn_get_stats(conn, &st));
        } while (st.tx_msgs < count && now_ns() < deadline);
        ok("sw_conn_close", sw_conn_close(conn));
        ok("sw_engine_close", sw_engine_close(engine));
        return st.tx_msgs >= count ? 0 : 1;
    }
    fprintf(stderr, "pingpong: unknown role %s\n", role);
    return 2;
}
