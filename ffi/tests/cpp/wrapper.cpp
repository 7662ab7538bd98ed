// wrapper.cpp - spinwire.hpp's own rules: no name that collides with the C library
// (`using namespace spinwire;` next to <cstring>), errors the wrapper finds itself set
// errmsg(), stats() reports failure, Message holds a received message, a Claim that outlives
// its Connection aborts (SPINWIRE_CHECK_LIFETIMES), and with SPINWIRE_EXCEPTIONS failures
// throw spinwire::Error while SW_BACK_PRESSURED / SW_TIMEOUT stay results.
//
// Run by scripts/ci/ffi.sh, built with g++ and clang++ for C++14, C++17 and C++20, with and
// without -DSPINWIRE_EXCEPTIONS=1.
#include <csignal>
#include <cstdio>
#include <cstring>
#include <string>
#include <sys/wait.h>
#include <unistd.h>

#include "spinwire.hpp"

using namespace spinwire; // must not hide or clash with ::strerror

namespace {

int failures = 0;

void expect(bool ok, const char *what) {
    std::printf("%-4s %s\n", ok ? "ok" : "FAIL", what);
    if (!ok) {
        std::printf("     errmsg: %s\n", errmsg().c_str());
        failures++;
    }
}

std::string endpoint(const char *tag) {
    return std::string("shm://ffi-wrapper-") + tag + "-" + std::to_string(getpid()) +
           (SPINWIRE_EXCEPTIONS ? "-x" : "");
}

sw_config small_config() {
    sw_config cfg = default_config();
    cfg.buffers = 8;
    cfg.buffer_size = 512;
    cfg.large_buffers = 0;
    cfg.idle = SW_IDLE_BACKOFF;
    return cfg;
}

// A connected pair (bounded waits); false if it could not be made.
bool make_pair(Engine &e, const char *tag, Listener &l, Connection &a, Connection &b) {
    sw_config cfg = small_config();
    std::string ep = endpoint(tag);
    return Engine::open(e, &cfg) == SW_OK && e.listen(ep.c_str(), l) == SW_OK &&
           e.connect(ep.c_str(), 5000000000ull, a) == SW_OK &&
           l.accept(5000000000ull, b) == SW_OK;
}

int hold_one(Connection &c, Message &m) {
    for (int i = 0; i < 10000000; i++) {
        int r = c.hold(m);
        if (r != 0) return r;
    }
    return 0;
}

void names_and_errors() {
    // The C library's strerror is untouched; the wrapper's name is code_name.
    expect(std::strcmp(code_name(SW_CLOSED), "SW_CLOSED") == 0, "code_name(SW_CLOSED)");
    expect(std::strcmp(code_name(1), "SW_UNKNOWN") == 0, "code_name(1)");
    expect(std::strerror(2) != nullptr, "::strerror is libc's");

    // An empty Claim / Connection: the wrapper's own failures explain themselves.
    Claim claim;
#if !SPINWIRE_EXCEPTIONS
    expect(claim.commit() == SW_BAD_ARG, "Claim::commit without a claim is SW_BAD_ARG");
    expect(errmsg().find("spinwire::Claim::commit") != std::string::npos,
           "... and errmsg() says so (not an older message)");
    Connection none;
    sw_conn_stats st{};
    expect(none.stats(st) == SW_BAD_ARG, "stats() of an empty Connection reports SW_BAD_ARG");
    Engine nothing;
    sw_engine_stats es{};
    expect(nothing.stats(es) == SW_BAD_ARG, "stats() of an empty Engine reports SW_BAD_ARG");
#else
    bool thrown = false;
    try {
        detail::discard(claim.commit());
    } catch (const Error &e) {
        thrown = e.code() == SW_BAD_ARG &&
                 std::string(e.what()).find("spinwire::Claim::commit") != std::string::npos;
    }
    expect(thrown, "Claim::commit without a claim throws Error(SW_BAD_ARG)");
    thrown = false;
    sw_config bad = default_config();
    bad.inline_threshold = 500;
    Engine e;
    try {
        detail::discard(Engine::open(e, &bad));
    } catch (const Error &err) {
        thrown = err.code() == SW_BAD_CONFIG &&
                 std::string(err.what()).find("inline_threshold") != std::string::npos;
    }
    expect(thrown, "Engine::open(inline_threshold = 500) throws Error(SW_BAD_CONFIG)");
    thrown = false;
    Connection none;
    sw_conn_stats st{};
    try {
        detail::discard(none.stats(st));
    } catch (const Error &err) {
        thrown = err.code() == SW_BAD_ARG;
    }
    expect(thrown, "stats() of an empty Connection throws Error(SW_BAD_ARG)");
#endif
}

void held_messages() {
    Engine e;
    Listener l;
    Connection a, b;
    if (!make_pair(e, "held", l, a, b)) {
        expect(false, "connected pair");
        return;
    }
    const char text[] = "held in place"; // a char buffer: sw_offer takes const void *
    expect(a.offer(text, sizeof text) > 0, "offer(char buffer)");
    std::string big(300, 'x');
    expect(a.offer(big.data(), big.size()) > 0, "offer(300 B)");
    expect(b.wait(5000000000ull) == SW_OK, "wait: a message is ready");
    Message m1, m2;
    expect(hold_one(b, m1) == 1 && m1.size() == sizeof text &&
               std::memcmp(m1.data(), text, sizeof text) == 0,
           "hold: the first message");
    expect(hold_one(b, m2) == 1 && m2.size() == big.size(), "hold: the second, first still held");
    expect(std::memcmp(m1.data(), text, sizeof text) == 0, "the first is intact");
    expect(b.outstanding() == 2, "outstanding() counts held messages");
    Message moved = std::move(m1);
    expect(!m1 && moved && moved.size() == sizeof text, "a Message moves");
    expect(moved.release() == SW_OK && !moved, "release()");
    { Message gone = std::move(m2); } // the destructor releases
    expect(b.outstanding() == 0, "destructors release");
    // Past the pool: back-pressure is a result, also with exceptions on.
    int64_t max = b.max_held();
    expect(max == 8, "max_held() is the receive pool");
    Message held[8];
    for (int64_t i = 0; i < max; i++) {
        expect(a.offer(text, 8) > 0, "offer");
        expect(hold_one(b, held[i]) == 1, "hold up to the pool");
    }
    expect(a.offer(text, 8) > 0, "offer one more");
    Message extra;
    expect(b.hold(extra) == SW_BACK_PRESSURED && !extra,
           "hold past the pool returns SW_BACK_PRESSURED (no exception)");
    for (auto &m : held) expect(m.release() == SW_OK, "release");
    expect(hold_one(b, extra) == 1, "the waiting message after the releases");
}

void offer_in_place() {
    Engine e;
    Listener l;
    Connection a, b;
    if (!make_pair(e, "inplace", l, a, b)) {
        expect(false, "connected pair");
        return;
    }
    // A lambda with captures writes each message where it is sent: a ring record (8 B) and a
    // pool buffer (300 B).
    int calls = 0;
    for (size_t len : {size_t(8), size_t(300)}) {
        int64_t r = a.offer_in_place(len, [&](uint8_t *dst, size_t n) {
            calls++;
            std::memset(dst, static_cast<int>(n & 0xff), n);
        });
        expect(r > 0, "offer_in_place");
    }
    expect(calls == 2, "the writer ran once per message");
    for (size_t len : {size_t(8), size_t(300)}) {
        size_t got = 0;
        bool same = false;
        for (int spins = 0; got == 0 && spins < 1000000; spins++) {
            int64_t n = b.poll(
                [&](const uint8_t *p, size_t n) {
                    got = n;
                    same = n == len;
                    for (size_t i = 0; same && i < n; i++) same = p[i] == (len & 0xff);
                },
                1);
            if (n < 0) break;
        }
        expect(got == len && same, "the message arrives as written in place");
    }
    expect(a.outstanding() == 0, "offer_in_place leaves no claim open");
}

// A Claim declared before its Connection is destroyed after it: the check aborts.
struct Holder {
    Claim claim; // destroyed after conn: wrong order
    Engine engine;
    Listener listener;
    Connection conn, peer;
};

void lifetime_check() {
#if SPINWIRE_CHECK_LIFETIMES
    std::fflush(stdout);
    pid_t pid = fork();
    if (pid == 0) {
        // The child: its stderr shows the check's message.
        {
            Holder h;
            if (!make_pair(h.engine, "life", h.listener, h.conn, h.peer)) _exit(3);
            if (h.conn.try_claim(16, h.claim) != SW_OK) _exit(4);
        } // ~Holder: conn closes with the claim open -> abort
        _exit(0);
    }
    int status = 0;
    waitpid(pid, &status, 0);
    expect(WIFSIGNALED(status) && WTERMSIG(status) == SIGABRT,
           "a Claim outliving its Connection aborts (SPINWIRE_CHECK_LIFETIMES)");
#else
    expect(true, "lifetime check off (NDEBUG)");
#endif
}

} // namespace

int main() {
    names_and_errors();
    held_messages();
    offer_in_place();
    lifetime_check();
    std::printf("%s (C++ %ld%s): %d failure(s)\n", failures ? "FAILED" : "wrapper.cpp passed",
                static_cast<long>(__cplusplus), SPINWIRE_EXCEPTIONS ? ", exceptions" : "",
                failures);
    return failures ? 1 : 0;
}
