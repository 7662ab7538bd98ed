/*
 * errors.c - every result code of spinwire.h, provoked from C.
 *
 * Run by scripts/ci/ffi.sh (gcc, against ffi/include/spinwire.h and libspinwire). Each case
 * checks the code, that sw_errmsg() explains it and that sw_strerror() names it. Four codes
 * cannot be provoked here by a correct program on a healthy host: SW_CONN_FAILED (a peer
 * violating the protocol or going silent: ffi/tests/reasons.rs provokes both through the C API
 * with mem:// fault injection), SW_SHUTDOWN (the engine's control thread gone), SW_REFUSED (a
 * listener holding its 1024 connections) and SW_INTERNAL (a panic inside the library); their
 * mapping is tested in Rust (ffi/src/error.rs tests, ffi/tests/api.rs), as is the panic guard
 * itself.
 *
 * Build: gcc -Wall -Iffi/include ffi/tests/c/errors.c -Ltarget/release -lspinwire -o errors
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime, nanosleep */

#include <arpa/inet.h>
#include <netinet/in.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include "spinwire.h"

static int failures;
static int seen[1 - SW_CODE_MIN];

#define MS 1000000ull
/* A claim above the inline threshold (120 B) and within the 256 B buffers: a pool buffer. */
#define POOL_LEN 200

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

/* Checks that `got` is `want`, with a message that mentions `needle` (NULL: any message). */
static void expect(const char *what, int64_t got, int32_t want, const char *needle) {
    const char *msg = sw_errmsg();
    int ok = got == want;
    if (ok && want != SW_OK && (msg[0] == '\0' || (needle && !strstr(msg, needle)))) ok = 0;
    if (ok && strcmp(sw_strerror(want), "SW_UNKNOWN") == 0) ok = 0;
    printf("%-4s %-52s %-18s %s\n", ok ? "ok" : "FAIL", what, sw_strerror((int32_t)got),
           want == SW_OK ? "" : msg);
    if (!ok) {
        printf("     expected %s\n", sw_strerror(want));
        failures++;
    }
    if (ok && want <= 0 && want >= SW_CODE_MIN) seen[-want] = 1;
}

static void on_msg(void *clientd, const uint8_t *data, size_t len) {
    (void)data;
    (void)len;
    (*(int *)clientd)++;
}

/* Records a large message's length once its bytes check out (byte i is i * 7). */
static void on_large(void *clientd, const uint8_t *data, size_t len) {
    for (size_t i = 0; i < len; i++)
        if (data[i] != (uint8_t)(i * 7)) return;
    *(size_t *)clientd = len;
}

static sw_conn *close_target;
static int32_t close_result = 1;
static void close_from_handler(void *clientd, const uint8_t *data, size_t len) {
    (void)clientd;
    (void)data;
    (void)len;
    close_result = sw_conn_close(close_target);
}

/* An sw_offer_in_place writer: zeros. */
static void write_zeros(void *clientd, uint8_t *data, size_t len) {
    (void)clientd;
    memset(data, 0, len);
}

/* A connected pair on `engine` over shm://<name>. */
static void pair(sw_engine *engine, const char *name, sw_listener **l, sw_conn **client,
                 sw_conn **server) {
    int32_t r = sw_listen(engine, name, l);
    if (r != SW_OK) {
        printf("FAIL listen %s: %s %s\n", name, sw_strerror(r), sw_errmsg());
        exit(1);
    }
    r = sw_connect(engine, name, 5000 * MS, client);
    if (r != SW_OK) {
        printf("FAIL connect %s: %s %s\n", name, sw_strerror(r), sw_errmsg());
        exit(1);
    }
    r = sw_accept(*l, 5000 * MS, server);
    if (r != SW_OK) {
        printf("FAIL accept %s: %s %s\n", name, sw_strerror(r), sw_errmsg());
        exit(1);
    }
}

int main(void) {
    char name[128], name2[128];
    int pid = (int)getpid();
    sw_config cfg;
    sw_engine *engine = NULL;
    uint8_t buf[8192] = {0};

    /* SW_BAD_ARG: NULL pointers and handles, a pointer that is not a handle. */
    expect("sw_config_init(NULL)", sw_config_init(NULL), SW_BAD_ARG, "NULL");
    expect("sw_engine_new(out = NULL)", sw_engine_new(NULL, NULL), SW_BAD_ARG, "NULL");
    expect("sw_offer(NULL conn)", sw_offer(NULL, buf, 1), SW_BAD_ARG, "sw_conn handle");
    expect("sw_offer_in_place(NULL conn)", sw_offer_in_place(NULL, 1, write_zeros, NULL),
           SW_BAD_ARG, "sw_conn handle");
    expect("sw_poll(NULL conn)", sw_poll(NULL, on_msg, NULL, 1), SW_BAD_ARG, "NULL");
    expect("sw_engine_poll(NULL)", sw_engine_poll(NULL), SW_BAD_ARG, "sw_engine handle");
    expect("sw_conn_close(NULL)", sw_conn_close(NULL), SW_BAD_ARG, "NULL");
    uint64_t not_a_handle[8] = {0x1234};
    expect("sw_flush(not a handle)", sw_flush((sw_conn *)not_a_handle), SW_BAD_ARG,
           "not a live handle");
    expect("sw_engine_close(not a handle)", sw_engine_close((sw_engine *)not_a_handle),
           SW_BAD_ARG, "not a live handle");

    /* SW_BAD_CONFIG. */
    (void)!sw_config_init(&cfg);
    cfg.buffers = 0;
    expect("sw_engine_new(buffers = 0)", sw_engine_new(&cfg, &engine), SW_BAD_CONFIG, "buffers");
    (void)!sw_config_init(&cfg);
    cfg.idle = 7;
    expect("sw_engine_new(idle = 7)", sw_engine_new(&cfg, &engine), SW_BAD_CONFIG, "idle");
    /* Every documented range of sw_config, just outside it: SW_BAD_CONFIG naming the field. */
    {
        struct {
            const char *what, *field;
            size_t off;
            int is64;
            uint64_t value;
        } bad[] = {
#define SW_FIELD(f) #f, offsetof(sw_config, f)
            {"buffer_size = 0", SW_FIELD(buffer_size), 0, 0},
            {"buffer_size = SW_MAX_BUFFER_SIZE + 1", SW_FIELD(buffer_size), 0, SW_MAX_BUFFER_SIZE + 1},
            {"buffers = SW_MAX_BUFFERS + 1", SW_FIELD(buffers), 0, SW_MAX_BUFFERS + 1},
            {"depth = buffers + 1", SW_FIELD(depth), 0, 257},
            {"batch = 0", SW_FIELD(batch), 0, 0},
            {"batch = SW_MAX_BATCH + 1", SW_FIELD(batch), 0, SW_MAX_BATCH + 1},
            {"inline_threshold = SW_INLINE_MAX + 1", SW_FIELD(inline_threshold), 0, SW_INLINE_MAX + 1},
            {"inline_threshold = 500", SW_FIELD(inline_threshold), 0, 500},
            {"connect_timeout_ns = 0", SW_FIELD(connect_timeout_ns), 1, 0},
            {"liveness_timeout_ns = min - 1", SW_FIELD(liveness_timeout_ns), 1,
             SW_MIN_LIVENESS_TIMEOUT_NS - 1},
            {"max_connections_per_poller = 0", SW_FIELD(max_connections_per_poller), 0, 0},
            {"max_connections_per_poller = max + 1", SW_FIELD(max_connections_per_poller), 0,
             SW_MAX_CONNECTIONS_PER_POLLER + 1},
            {"max_message_size = 0", SW_FIELD(max_message_size), 0, 0},
            {"max_message_size = SW_MAX_MESSAGE_SIZE + 1", SW_FIELD(max_message_size), 0,
             SW_MAX_MESSAGE_SIZE + 1},
            {"large_buffers = SW_MAX_LARGE_BUFFERS + 1", SW_FIELD(large_buffers), 0,
             SW_MAX_LARGE_BUFFERS + 1},
#undef SW_FIELD
        };
        for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
            char what[128], needle[96];
            (void)!sw_config_init(&cfg);
            unsigned char *field = (unsigned char *)&cfg + bad[i].off;
            if (bad[i].is64) {
                uint64_t v = bad[i].value;
                memcpy(field, &v, sizeof v);
            } else {
                size_t v = (size_t)bad[i].value;
                memcpy(field, &v, sizeof v);
            }
            snprintf(what, sizeof what, "sw_engine_new(%s)", bad[i].what);
            snprintf(needle, sizeof needle, "sw_config.%s = ", bad[i].field);
            engine = NULL;
            expect(what, sw_engine_new(&cfg, &engine), SW_BAD_CONFIG, needle);
            if (!strstr(sw_errmsg(), "out of range: must be")) {
                printf("FAIL %s: the message names no range\n", what);
                failures++;
            }
        }
        /* poller_cores: present when poller_count > 0, distinct, below the CPU count. */
        size_t cores_dup[2] = {0, 0}, cores_far[1] = {1u << 20};
        (void)!sw_config_init(&cfg);
        cfg.poller_count = 1;
        expect("sw_engine_new(poller_count 1, poller_cores NULL)", sw_engine_new(&cfg, &engine),
               SW_BAD_CONFIG, "poller_cores");
        cfg.poller_cores = cores_dup;
        cfg.poller_count = 2;
        expect("sw_engine_new(poller_cores {0, 0})", sw_engine_new(&cfg, &engine), SW_BAD_CONFIG,
               "core");
        cfg.poller_cores = cores_far;
        cfg.poller_count = 1;
        expect("sw_engine_new(poller_cores {1 << 20})", sw_engine_new(&cfg, &engine),
               SW_BAD_CONFIG, "core");
        engine = NULL;
        /* The edges are accepted. */
        (void)!sw_config_init(&cfg);
        cfg.inline_threshold = SW_INLINE_MAX;
        cfg.batch = SW_MAX_BATCH;
        cfg.depth = cfg.buffers;
        cfg.liveness_timeout_ns = SW_MIN_LIVENESS_TIMEOUT_NS;
        expect("sw_engine_new(every field at its edge)", sw_engine_new(&cfg, &engine), SW_OK, NULL);
        expect("sw_engine_close", sw_engine_close(engine), SW_OK, NULL);
        engine = NULL;
    }

    /* Large messages: above the buffer size through a large slot, up to max_message_size. */
    (void)!sw_config_init(&cfg);
    cfg.buffers = 8;
    cfg.buffer_size = 256;
    cfg.max_message_size = 64 * 1024;
    cfg.large_buffers = 2;
    cfg.idle = SW_IDLE_BACKOFF;
    expect("sw_engine_new(64 KiB messages)", sw_engine_new(&cfg, &engine), SW_OK, NULL);
    if (!engine) return 1;
    {
        sw_listener *ll = NULL;
        sw_conn *lc = NULL, *ls = NULL;
        snprintf(name, sizeof name, "shm://ffi-errors-large-%d", pid);
        pair(engine, name, &ll, &lc, &ls);
        expect("sw_conn_max_message_size(64 KiB)", sw_conn_max_message_size(lc) == 64 * 1024 ? SW_OK : -99,
               SW_OK, NULL);
        static uint8_t big[64 * 1024 + 1];
        for (size_t i = 0; i < sizeof big; i++) big[i] = (uint8_t)(i * 7);
        expect("sw_offer(40000 bytes)", sw_offer(lc, big, 40000) > 0 ? SW_OK : -99, SW_OK, NULL);
        size_t large_len = 0;
        uint64_t until = now_ns() + 5000 * MS;
        while (large_len == 0 && now_ns() < until) (void)!sw_poll(ls, on_large, &large_len, 1);
        expect("large message arrived whole", large_len == 40000 ? SW_OK : -99, SW_OK, NULL);
        expect("sw_offer(64 KiB + 1)", sw_offer(lc, big, sizeof big), SW_TOO_LARGE, "65536");
        (void)!sw_conn_close(lc);
        (void)!sw_conn_close(ls);
        (void)!sw_listener_close(ll);
    }
    expect("sw_engine_close", sw_engine_close(engine), SW_OK, NULL);
    engine = NULL;

    /* The rest on a pool-only engine: its limit is the buffer size. */
    (void)!sw_config_init(&cfg);
    cfg.buffers = 8;
    cfg.buffer_size = 256;
    cfg.large_buffers = 0;
    cfg.idle = SW_IDLE_BACKOFF;
    expect("sw_engine_new(defaults, 8 x 256 B)", sw_engine_new(&cfg, &engine), SW_OK, NULL);
    if (!engine) return 1;

    /* Held messages: at most sw_conn_max_held (the receive pool), then SW_BACK_PRESSURED. */
    {
        sw_listener *hl = NULL;
        sw_conn *hc = NULL, *hs = NULL;
        sw_msg held[16], extra;
        snprintf(name, sizeof name, "shm://ffi-errors-held-%d", pid);
        pair(engine, name, &hl, &hc, &hs);
        int64_t max_held = sw_conn_max_held(hs);
        expect("sw_conn_max_held(8 buffers)", max_held == 8 ? SW_OK : -99, SW_OK, NULL);
        int nheld = 0;
        uint64_t until = now_ns() + 5000 * MS;
        for (int64_t i = 0; i < max_held; i++) (void)!sw_offer(hc, buf, 16);
        while (nheld < max_held && now_ns() < until) {
            int32_t h = sw_hold(hs, &held[nheld]);
            if (h == 1) nheld++;
            else if (h < 0) break;
        }
        expect("sw_hold(max_held messages)", nheld == max_held ? SW_OK : -99, SW_OK, NULL);
        expect("sw_offer(one more)", sw_offer(hc, buf, 16) > 0 ? SW_OK : -99, SW_OK, NULL);
        expect("sw_hold(past the pool)", sw_hold(hs, &extra), SW_BACK_PRESSURED, "release one");
        expect("sw_release", sw_release(&held[0]), SW_OK, NULL);
        expect("sw_release(released message)", sw_release(&held[0]), SW_BAD_ARG, "stale");
        expect("sw_release(NULL)", sw_release(NULL), SW_BAD_ARG, "NULL");
        until = now_ns() + 5000 * MS;
        int32_t h = 0;
        while (h == 0 && now_ns() < until) h = sw_hold(hs, &held[0]);
        expect("sw_hold(after a release)", h == 1 ? SW_OK : h, SW_OK, NULL);
        expect("sw_conn_outstanding(held)", sw_conn_outstanding(hs) == max_held ? SW_OK : -99, SW_OK,
               NULL);
        /* Closing with messages held releases them. */
        expect("sw_conn_close(messages held)", sw_conn_close(hs), SW_OK, NULL);
        expect("sw_conn_close", sw_conn_close(hc), SW_OK, NULL);
        expect("sw_listener_close", sw_listener_close(hl), SW_OK, NULL);
    }

    /* SW_BAD_ENDPOINT, SW_UNSUPPORTED, SW_NOT_CONNECTED, SW_SETUP_FAILED. */
    sw_conn *c = NULL;
    sw_listener *l = NULL;
    expect("sw_connect(\"nope://x\")", sw_connect(engine, "nope://x", 0, &c), SW_BAD_ENDPOINT,
           "nope://x");
    expect("sw_listen(\"shm://a/b\")", sw_listen(engine, "shm://a/b", &l), SW_BAD_ENDPOINT,
           "shm://a/b");
    expect("sw_connect(NULL endpoint)", sw_connect(engine, NULL, 0, &c), SW_BAD_ARG, "endpoint");
    expect("sw_connect(\"rdma://127.0.0.1:1\")", sw_connect(engine, "rdma://127.0.0.1:1", 0, &c),
           SW_UNSUPPORTED, "rdma");
    snprintf(name, sizeof name, "shm://ffi-errors-nobody-%d", pid);
    expect("sw_connect(nobody listening)", sw_connect(engine, name, 500 * MS, &c),
           SW_NOT_CONNECTED, "connect to");
    snprintf(name, sizeof name, "shm://ffi-errors-%d", pid);
    sw_listener *l1 = NULL, *l2 = NULL;
    expect("sw_listen", sw_listen(engine, name, &l1), SW_OK, NULL);
    expect("sw_listen(same name again)", sw_listen(engine, name, &l2), SW_SETUP_FAILED, "listen");
    expect("sw_listener_close", sw_listener_close(l1), SW_OK, NULL);

    /* SW_TIMEOUT: a TCP peer that accepts (kernel backlog) but never answers the hello; an
     * accept with nobody connecting. */
    int fd = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in sa = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t salen = sizeof sa;
    if (fd < 0 || bind(fd, (struct sockaddr *)&sa, sizeof sa) != 0 || listen(fd, 4) != 0 ||
        getsockname(fd, (struct sockaddr *)&sa, &salen) != 0) {
        perror("errors: tcp socket");
        return 1;
    }
    char tcp[64];
    snprintf(tcp, sizeof tcp, "tcp://127.0.0.1:%d", ntohs(sa.sin_port));
    uint64_t t0 = now_ns();
    expect("sw_connect(silent tcp peer, 200 ms)", sw_connect(engine, tcp, 200 * MS, &c),
           SW_TIMEOUT, "timed out");
    uint64_t took = (now_ns() - t0) / MS;
    if (took > 2000) {
        printf("FAIL connect timeout took %llu ms\n", (unsigned long long)took);
        failures++;
    }
    close(fd);
    snprintf(name2, sizeof name2, "shm://ffi-errors-accept-%d", pid);
    expect("sw_listen", sw_listen(engine, name2, &l2), SW_OK, NULL);
    expect("sw_accept(nobody, 0 ns)", sw_accept(l2, 0, &c), SW_TIMEOUT, "no connection");
    expect("sw_accept(nobody, 50 ms)", sw_accept(l2, 50 * MS, &c), SW_TIMEOUT, "timed out");
    (void)!sw_listener_close(l2);

    /* A connected pair for the data-path codes. */
    snprintf(name, sizeof name, "shm://ffi-errors-pair-%d", pid);
    sw_conn *client = NULL, *server = NULL;
    pair(engine, name, &l, &client, &server);
    int64_t max = sw_conn_max_message_size(client);
    if (max < 256 || max > (int64_t)sizeof buf - 1) {
        printf("FAIL max message size %lld\n", (long long)max);
        return 1;
    }

    /* SW_TOO_LARGE. */
    expect("sw_offer(max + 1 bytes)", sw_offer(client, buf, (size_t)max + 1), SW_TOO_LARGE,
           "exceeds");
    sw_claim claim;
    expect("sw_try_claim(max + 1 bytes)", sw_try_claim(client, (size_t)max + 1, &claim),
           SW_TOO_LARGE, "exceeds");
    expect("sw_offer_in_place(max + 1 bytes)",
           sw_offer_in_place(client, (size_t)max + 1, write_zeros, NULL), SW_TOO_LARGE, "exceeds");
    expect("sw_offer_in_place(NULL writer)", sw_offer_in_place(client, 8, NULL, NULL), SW_BAD_ARG,
           "write is NULL");
    expect("sw_offer(max bytes)", sw_offer(client, buf, (size_t)max) > 0 ? SW_OK : -99, SW_OK,
           NULL);
    expect("sw_poll(NULL handler)", sw_poll(server, NULL, NULL, 1), SW_BAD_ARG, "handler");

    /* Claims: commit, then a stale commit and abort; SW_CLAIM_OPEN while a ring claim is open;
     * SW_POOL_EXHAUSTED once the application holds every buffer. On shm a claim up to the
     * inline threshold (120 B) is a ring claim, written in the ring record itself (one open at
     * a time); a larger one (POOL_LEN) gets a pool buffer. */
    int got = 0;
    for (int i = 0; i < 1000 && got == 0; i++) (void)!sw_poll(server, on_msg, &got, 8);
    expect("sw_try_claim(16)", sw_try_claim(client, 16, &claim), SW_OK, NULL);
    sw_claim copy = claim;
    memset(claim.data, 0xab, claim.len);
    expect("sw_claim_commit", sw_claim_commit(&claim) > 0 ? SW_OK : -99, SW_OK, NULL);
    expect("sw_claim_commit(spent claim)", sw_claim_commit(&claim), SW_BAD_ARG, "stale");
    expect("sw_claim_commit(stale copy)", sw_claim_commit(&copy), SW_BAD_ARG, "stale");
    expect("sw_claim_abort(stale copy)", sw_claim_abort(&copy), SW_BAD_ARG, "stale");
    expect("sw_claim_commit(NULL)", sw_claim_commit(NULL), SW_BAD_ARG, "NULL");
    /* Two claims open at once: refused while the first is a ring claim; so is an offer. */
    sw_claim ring, pool;
    expect("sw_try_claim(16: ring claim)", sw_try_claim(client, 16, &ring), SW_OK, NULL);
    expect("sw_try_claim(16, ring claim open)", sw_try_claim(client, 16, &pool), SW_CLAIM_OPEN,
           "claim is open");
    expect("sw_try_claim(POOL_LEN, ring claim open)", sw_try_claim(client, POOL_LEN, &pool),
           SW_CLAIM_OPEN, "claim is open");
    expect("sw_offer(ring claim open)", sw_offer(client, buf, 8), SW_CLAIM_OPEN,
           "claim is open");
    memset(ring.data, 0xcd, ring.len);
    expect("sw_claim_commit(ring claim)", sw_claim_commit(&ring) > 0 ? SW_OK : -99, SW_OK, NULL);
    expect("sw_offer(after the commit)", sw_offer(client, buf, 8) > 0 ? SW_OK : -99, SW_OK, NULL);
    /* A pool-buffer claim's commit waits for an open ring claim (the claim is kept). */
    expect("sw_try_claim(POOL_LEN: pool claim)", sw_try_claim(client, POOL_LEN, &pool), SW_OK,
           NULL);
    expect("sw_try_claim(16: ring claim over it)", sw_try_claim(client, 16, &ring), SW_OK, NULL);
    expect("sw_claim_commit(pool claim, ring claim open)", sw_claim_commit(&pool), SW_CLAIM_OPEN,
           "claim is open");
    expect("sw_claim_abort(ring claim)", sw_claim_abort(&ring), SW_OK, NULL);
    expect("sw_claim_commit(the kept pool claim)", sw_claim_commit(&pool) > 0 ? SW_OK : -99,
           SW_OK, NULL);
    /* Let the buffers come back, then claim all of them. */
    uint64_t deadline = now_ns() + 5000 * MS;
    sw_claim claims[64];
    int held = 0;
    int32_t r = SW_OK;
    while (now_ns() < deadline) {
        (void)!sw_poll(server, on_msg, &got, 64);
        r = sw_try_claim(client, POOL_LEN, &claims[held]);
        if (r == SW_OK) {
            if (++held == 64) break;
        } else if (r != SW_BACK_PRESSURED) {
            break;
        }
    }
    expect("sw_try_claim(every buffer held)", r, SW_POOL_EXHAUSTED, "exhausted");
    expect("sw_offer(POOL_LEN, every buffer held)", sw_offer(client, buf, POOL_LEN),
           SW_POOL_EXHAUSTED, "exhausted");
    /* An offer up to the inline threshold is copied into the ring record: no pool buffer. */
    expect("sw_offer(8, every buffer held)", sw_offer(client, buf, 8) > 0 ? SW_OK : -99, SW_OK,
           NULL);
    /* A ring claim needs no pool buffer; closing with it open aborts it (checked in Rust). */
    expect("sw_try_claim(16, every buffer held)", sw_try_claim(client, 16, &ring), SW_OK, NULL);
    expect("sw_claim_abort(ring claim)", sw_claim_abort(&ring), SW_OK, NULL);
    for (int i = 0; i < held; i++) {
        if (sw_claim_abort(&claims[i]) != SW_OK) {
            printf("FAIL abort claim %d: %s\n", i, sw_errmsg());
            failures++;
        }
    }

    /* SW_BACK_PRESSURED: flood a receiver that does not poll. */
    r = SW_OK;
    int64_t o = 0;
    for (long i = 0; i < 1000000; i++) {
        o = sw_offer(client, buf, 64);
        if (o < 0) break;
        if ((i & 15) == 0) (void)!sw_flush(client);
    }
    expect("sw_offer(flood, receiver not polling)", o, SW_BACK_PRESSURED, "would block");
    expect("sw_offer_in_place(flood, receiver not polling)",
           sw_offer_in_place(client, 64, write_zeros, NULL), SW_BACK_PRESSURED, "would block");
    sw_conn_stats st;
    expect("sw_conn_get_stats", sw_conn_get_stats(client, &st), SW_OK, NULL);
    if (st.would_block + st.alloc_failures == 0) {
        printf("FAIL stats show no back-pressure\n");
        failures++;
    }

    /* Closing from inside the connection's own poll handler is refused. */
    close_target = server;
    int64_t n = 0;
    deadline = now_ns() + 5000 * MS;
    while (n == 0 && now_ns() < deadline) n = sw_poll(server, close_from_handler, NULL, 1);
    expect("sw_conn_close(inside its sw_poll handler)", close_result, SW_BAD_ARG, "handler");

    /* SW_CLOSED: the peer closes. */
    expect("sw_conn_close(server side)", sw_conn_close(server), SW_OK, NULL);
    deadline = now_ns() + 5000 * MS;
    do {
        n = sw_poll(client, on_msg, &got, 64);
    } while (n >= 0 && now_ns() < deadline);
    expect("sw_poll(peer closed)", n, SW_CLOSED, "disconnected");
    expect("sw_offer(peer closed)", sw_offer(client, buf, 8), SW_CLOSED, "disconnected");
    expect("sw_offer_in_place(peer closed)", sw_offer_in_place(client, 8, write_zeros, NULL),
           SW_CLOSED, "disconnected");
    expect("sw_conn_is_open(peer closed)", sw_conn_is_open(client), 0, NULL);

    /* Events: Connected (twice: the pair's two ends) and Disconnected came through. */
    sw_event ev;
    int connected = 0, disconnected = 0;
    while (sw_next_event(engine, 0, &ev) == 1) {
        connected += ev.kind == SW_EVENT_CONNECTED;
        disconnected += ev.kind == SW_EVENT_DISCONNECTED;
    }
    if (connected == 0) {
        printf("FAIL no SW_EVENT_CONNECTED seen\n");
        failures++;
    }
    sw_engine_stats es;
    expect("sw_engine_get_stats", sw_engine_get_stats(engine, &es), SW_OK, NULL);
    expect("sw_conn_close(client)", sw_conn_close(client), SW_OK, NULL);
    expect("sw_listener_close", sw_listener_close(l), SW_OK, NULL);
    expect("sw_engine_close", sw_engine_close(engine), SW_OK, NULL);
    printf("events: %d connected, %d disconnected; engine: %llu connections opened\n", connected,
           disconnected, (unsigned long long)es.connections_opened);

    /* Every code that a correct program can provoke was seen. */
    const int32_t reachable[] = {SW_BACK_PRESSURED, SW_NOT_CONNECTED, SW_CLOSED,     SW_TIMEOUT,
                                 SW_TOO_LARGE,      SW_BAD_ARG,       SW_BAD_ENDPOINT, SW_BAD_CONFIG,
                                 SW_POOL_EXHAUSTED, SW_SETUP_FAILED,  SW_UNSUPPORTED,
                                 SW_CLAIM_OPEN};
    for (size_t i = 0; i < sizeof reachable / sizeof reachable[0]; i++) {
        if (!seen[-reachable[i]]) {
            printf("FAIL %s was never provoked\n", sw_strerror(reachable[i]));
            failures++;
        }
    }
    if (strcmp(sw_strerror(1), "SW_UNKNOWN") != 0) failures++;
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "errors.c passed", failures);
    return failures ? 1 : 0;
}
