/* consumer.c - one message over shm through an installed libspinwire (CMake consumer). */
#include <stdio.h>
#include <string.h>
#include <unistd.h>

#include <spinwire.h>

static void on_msg(void *clientd, const uint8_t *data, size_t len) {
    memcpy(clientd, data, len < 16 ? len : 16);
}

int main(void) {
    sw_engine *e = NULL;
    sw_listener *l = NULL;
    sw_conn *a = NULL, *b = NULL;
    char ep[64], got[16] = {0};
    snprintf(ep, sizeof ep, "shm://ffi-cmake-c-%d", (int)getpid());
    if (sw_engine_new(NULL, &e) != SW_OK || sw_listen(e, ep, &l) != SW_OK ||
        sw_connect(e, ep, 5000000000ull, &a) != SW_OK || sw_accept(l, 5000000000ull, &b) != SW_OK) {
        fprintf(stderr, "consumer_c: %s\n", sw_errmsg());
        return 1;
    }
    const char hello[] = "hello, cmake";
    if (sw_offer(a, hello, sizeof hello) < 1) return 1;
    for (long i = 0; i < 100000000 && got[0] == 0; i++)
        if (sw_poll(b, on_msg, got, 1) < 0) return 1;
    int ok = strcmp(got, hello) == 0;
    ok &= sw_conn_close(a) == SW_OK && sw_conn_close(b) == SW_OK;
    ok &= sw_listener_close(l) == SW_OK && sw_engine_close(e) == SW_OK;
    printf("consumer_c: %s\n", ok ? got : "FAILED");
    return ok ? 0 : 1;
}
