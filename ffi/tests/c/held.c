/*
 * held.c - held messages (sw_hold / sw_release) from C, meant to run under AddressSanitizer:
 * hold messages beyond the call, forward them without copying them into the application,
 * release them, hold past the pool (SW_BACK_PRESSURED), and close connections with messages
 * still held (sw_conn_close releases them; ASan and LeakSanitizer see no error or leak).
 *
 * Run by scripts/ci/ffi.sh, built with gcc -fsanitize=address against libspinwire.
 *
 * Build: gcc -std=c99 -g -fsanitize=address -Iffi/include ffi/tests/c/held.c -Ltarget/release
 *        -Wl,-rpath,$PWD/target/release -lspinwire -o held
 */
#define _POSIX_C_SOURCE 200809L /* clock_gettime */

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "spinwire.h"

#define MS 1000000ull
#define BUFFERS 8
#define ROUNDS 200

static int failures;

static uint64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (uint64_t)ts.tv_sec * 1000000000ull + (uint64_t)ts.tv_nsec;
}

#define CHECK(cond, ...)                                                                       \
    do {                                                                                       \
        if (!(cond)) {                                                                         \
            printf("FAIL %s:%d: ", __FILE__, __LINE__);                                       \
            printf(__VA_ARGS__);                                                               \
            printf(" (%s)\n", sw_errmsg());                                                    \
            failures++;                                                                        \
        }                                                                                      \
    } while (0)

static void fill(uint8_t *p, size_t len, unsigned seq) {
    for (size_t i = 0; i < len; i++) p[i] = (uint8_t)(seq * 31 + i);
}

static int intact(const sw_msg *m, size_t len, unsigned seq) {
    if (m->data == NULL || m->len != len) return 0;
    for (size_t i = 0; i < len; i++)
        if (m->data[i] != (uint8_t)(seq * 31 + i)) return 0;
    return 1;
}

/* Offers (bounded retry while back-pressured). */
static void offer(sw_conn *c, const void *data, size_t len) {
    uint64_t until = now_ns() + 5000 * MS;
    for (;;) {
        int64_t r = sw_offer(c, data, len);
        if (r > 0) return;
        if (r != SW_BACK_PRESSURED || now_ns() > until) {
            CHECK(0, "sw_offer: %s", sw_strerror((int32_t)r));
            return;
        }
        (void)!sw_flush(c);
    }
}

/* Holds the next message (bounded wait); 1 on success. */
static int hold(sw_conn *c, sw_msg *m) {
    uint64_t until = now_ns() + 5000 * MS;
    for (;;) {
        int32_t r = sw_hold(c, m);
        if (r == 1) return 1;
        if (r < 0 || now_ns() > until) {
            CHECK(0, "sw_hold: %s", sw_strerror(r));
            return 0;
        }
    }
}

static void pair(sw_engine *e, const char *name, sw_listener **l, sw_conn **a, sw_conn **b) {
    if (sw_listen(e, name, l) != SW_OK || sw_connect(e, name, 5000 * MS, a) != SW_OK ||
        sw_accept(*l, 5000 * MS, b) != SW_OK) {
        printf("FAIL pair %s: %s\n", name, sw_errmsg());
        exit(1);
    }
}

int main(void) {
    sw_config cfg;
    sw_engine *e = NULL;
    char name[3][96];
    sw_listener *l[3];
    sw_conn *src, *mid_in, *mid_out, *dst, *c3, *s3;
    /* Inline (on shm: in the ring record), pool buffer, and large-slot sizes. */
    const size_t sizes[] = {16, 100, 200, 300, 1000};
    static uint8_t buf[2048];

    if (sw_config_init(&cfg) != SW_OK) return 1;
    cfg.buffers = BUFFERS;
    cfg.buffer_size = 512;
    cfg.max_message_size = 2048;
    cfg.large_buffers = 2;
    cfg.idle = SW_IDLE_BACKOFF;
    if (sw_engine_new(&cfg, &e) != SW_OK) return 1;
    for (int i = 0; i < 3; i++) snprintf(name[i], sizeof name[i], "shm://ffi-held-%d-%d", i, (int)getpid());
    /* src -> mid (holds, forwards) -> dst. */
    pair(e, name[0], &l[0], &src, &mid_in);
    pair(e, name[1], &l[1], &mid_out, &dst);

    /* Hold, forward, release: each message is held in place, forwarded from where it lies,
     * released after the forward; a few stay held across the next receive. */
    for (unsigned r = 0; r < ROUNDS && failures == 0; r++) {
        sw_msg m[5];
        size_t n = sizeof sizes / sizeof sizes[0];
        for (size_t i = 0; i < n; i++) {
            fill(buf, sizes[i], r * 8 + (unsigned)i);
            offer(src, buf, sizes[i]);
        }
        for (size_t i = 0; i < n; i++) {
            if (!hold(mid_in, &m[i])) break;
            CHECK(intact(&m[i], sizes[i], r * 8 + (unsigned)i), "round %u message %zu", r, i);
        }
        /* Every held message is still intact after the later ones were received. */
        for (size_t i = 0; i < n; i++) {
            CHECK(intact(&m[i], sizes[i], r * 8 + (unsigned)i), "round %u held %zu", r, i);
            offer(mid_out, m[i].data, m[i].len);
            CHECK(sw_release(&m[i]) == SW_OK, "release");
            CHECK(m[i].data == NULL && m[i].token == 0, "spent");
        }
        for (size_t i = 0; i < n; i++) {
            sw_msg f;
            if (!hold(dst, &f)) break;
            CHECK(intact(&f, sizes[i], r * 8 + (unsigned)i), "round %u forwarded %zu", r, i);
            CHECK(sw_release(&f) == SW_OK, "release forwarded");
        }
        CHECK(sw_conn_outstanding(mid_in) == 0, "nothing held");
    }
    printf("held.c: %d rounds of hold / forward / release\n", ROUNDS);

    /* Past the pool: sw_conn_max_held messages, then SW_BACK_PRESSURED, nothing taken. */
    pair(e, name[2], &l[2], &c3, &s3);
    int64_t max = sw_conn_max_held(s3);
    CHECK(max == BUFFERS + 2, "max held %lld", (long long)max);
    sw_msg held[BUFFERS + 2], extra;
    for (int64_t i = 0; i < max; i++) {
        fill(buf, 16, (unsigned)i);
        offer(c3, buf, 16);
        if (!hold(s3, &held[i])) return 1;
    }
    fill(buf, 16, 99);
    offer(c3, buf, 16);
    CHECK(sw_hold(s3, &extra) == SW_BACK_PRESSURED, "hold past the pool");
    CHECK(strstr(sw_errmsg(), "release one") != NULL, "message says what to do");
    for (int64_t i = 0; i < max; i++) CHECK(intact(&held[i], 16, (unsigned)i), "held %lld", (long long)i);
    CHECK(sw_release(&held[3]) == SW_OK, "release one");
    CHECK(hold(s3, &held[3]) && intact(&held[3], 16, 99), "the waiting message, after a release");
    CHECK(sw_conn_outstanding(s3) == max, "outstanding");

    /* Close with messages held (and one held on mid_in): the close releases them. */
    sw_msg last;
    fill(buf, 300, 7);
    offer(src, buf, 300);
    CHECK(hold(mid_in, &last) && intact(&last, 300, 7), "one more held");
    CHECK(sw_conn_close(s3) == SW_OK, "close with %lld held", (long long)max);
    CHECK(sw_conn_close(mid_in) == SW_OK, "close with one held");
    CHECK(sw_conn_close(c3) == SW_OK && sw_conn_close(src) == SW_OK, "close");
    CHECK(sw_conn_close(mid_out) == SW_OK && sw_conn_close(dst) == SW_OK, "close");
    for (int i = 0; i < 3; i++) CHECK(sw_listener_close(l[i]) == SW_OK, "listener close");
    CHECK(sw_engine_close(e) == SW_OK, "engine close");
    printf("%s: %d failure(s)\n", failures ? "FAILED" : "held.c passed", failures);
    return failures ? 1 : 0;
}
