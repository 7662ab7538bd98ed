// pingpong.cpp - the two-process shm ping-pong of pingpong.c on the C++ RAII wrapper
// (spinwire.hpp), sending zero-copy (offer_in_place: the message written in place, in one C
// call) on both sides.
//
//   pingpong_cpp server <endpoint> <messages>
//   pingpong_cpp client <endpoint> <messages> [size]
//
// Every message carries its sequence number and a payload derived from it; the server echoes
// each and then checks it, the client checks each echo once its round trip is timed (the checks
// stay out of the measured round trip, as in bench lat). Every wait is bounded; exit status 0
// means every message was verified.
//
// Build (from the repository root):
//   g++ -O2 -std=c++17 -Iffi/include ffi/examples/pingpong.cpp -Ltarget/release
//       -Wl,-rpath,$PWD/target/release -lspinwire -o pingpong_cpp
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "spinwire.hpp"

namespace {

using Clock = std::chrono::steady_clock;
constexpr auto kWait = std::chrono::seconds(10);

[[noreturn]] void die(const char *what, int64_t code) {
    std::fprintf(stderr, "pingpong_cpp: %s: %s (%s)\n", what, spinwire::code_name(code),
                 spinwire::errmsg().c_str());
    std::exit(1);
}

// The payload of message `seq` (at most 4096 bytes): the sequence number, then byte i is
// (seq * 31 + i) mod 256, copied from a pattern table (byte j is j mod 256) with one memcpy, as
// pingpong.c does. The client writes it in place inside the timed round trip (the C and Rust
// clients fill a buffer before their timestamp and copy it), so a byte loop there would time
// the example's own payload arithmetic (about 120 instructions at 32 B) as the engine's.
struct Pattern {
    uint8_t bytes[256 + 4096];
    Pattern() {
        for (size_t j = 0; j < sizeof bytes; j++) bytes[j] = static_cast<uint8_t>(j);
    }
    const uint8_t *tail(uint64_t seq) const { return bytes + ((seq * 31 + 8) & 0xff); }
};
const Pattern kPattern;

void fill(uint8_t *p, size_t size, uint64_t seq) {
    std::memcpy(p, &seq, std::min<size_t>(size, 8));
    if (size > 8) std::memcpy(p + 8, kPattern.tail(seq), size - 8);
}

bool check(const uint8_t *p, size_t len, size_t size, uint64_t seq) {
    if (len != size || size > 4096) return false;
    if (std::memcmp(p, &seq, std::min<size_t>(size, 8)) != 0) return false;
    return size <= 8 || std::memcmp(p + 8, kPattern.tail(seq), size - 8) == 0;
}

void flush(spinwire::Connection &conn) {
    if (int r = conn.flush(); r != SW_OK) die("flush", r);
}

// A bounded wait that reads the clock only once a try has found nothing, and then every
// 1024th try: a call that succeeds at once (the common case) pays no clock read.
class Deadline {
  public:
    // After a try that found nothing: one spin turn's pause (spin_pause: a spin without it
    // costs each round trip ~30 ns per side here), then whether the wait is over (the first
    // call starts it).
    bool passed() {
        spinwire::spin_pause();
        if (spins_++ == 0) {
            at_ = Clock::now() + kWait;
            return false;
        }
        return (spins_ & 1023) == 0 && Clock::now() > at_;
    }

  private:
    uint32_t spins_ = 0;
    Clock::time_point at_{};
};

// Waits (bounded) for one message and hands it to f.
template <class F> void recv_one(spinwire::Connection &conn, F &&f) {
    Deadline wait;
    for (;;) {
        int64_t n = conn.poll(f, 1);
        if (n > 0) return;
        if (n < 0) die("poll", n);
        if (wait.passed()) die("recv", SW_TIMEOUT);
    }
}

// Sends a message written in place by `write` (offer_in_place: zero-copy, one C call),
// polling while back-pressured (bounded wait).
template <class W> void send_in_place(spinwire::Connection &conn, size_t len, W &&write) {
    Deadline wait;
    for (;;) {
        int64_t r = conn.offer_in_place(len, write);
        if (r > 0) return;
        if (r != SW_BACK_PRESSURED) die("offer_in_place", r);
        if (wait.passed()) die("send", SW_TIMEOUT);
        flush(conn);
    }
}

}  // namespace

int main(int argc, char **argv) {
    if (argc < 4) {
        std::fprintf(stderr, "usage: pingpong_cpp server|client <endpoint> <messages> [size]\n");
        return 2;
    }
    std::string role = argv[1];
    const char *ep = argv[2];
    uint64_t count = std::strtoull(argv[3], nullptr, 10);
    size_t size = argc > 4 ? std::strtoul(argv[4], nullptr, 10) : 32;
    if (size < 8 || size > 4096) return 2;

    sw_config cfg = spinwire::default_config();
    cfg.buffer_size = 4096;
    cfg.buffers = 64;
    spinwire::Engine engine;
    if (int r = spinwire::Engine::open(engine, &cfg); r != SW_OK) die("engine", r);

    if (role == "server") {
        spinwire::Listener listener;
        if (int r = engine.listen(ep, listener); r != SW_OK) die("listen", r);
        std::fprintf(stderr, "listening on %s\n", ep);
        spinwire::Connection conn;
        if (int r = listener.accept(30'000'000'000ull, conn); r != SW_OK) die("accept", r);
        uint64_t bad = 0;
        std::vector<uint8_t> last(4096);
        size_t last_len = 0;
        for (uint64_t seq = 0; seq < count; seq++) {
            // Echoed from where the message lies (written in place from inside the handler: no
            // copy first), then kept for the check.
            recv_one(conn, [&](const uint8_t *p, size_t n) {
                send_in_place(conn, n, [&](uint8_t *dst, size_t len) { std::memcpy(dst, p, len); });
                last_len = n;
                std::memcpy(last.data(), p, n);
            });
            // Checked once echoed: out of the client's measured round trip.
            if (!check(last.data(), last_len, last_len, seq)) bad++;
        }
        // Wait (bounded) for the client to close.
        auto deadline = Clock::now() + kWait;
        for (;;) {
            int64_t n = conn.poll([](const uint8_t *, size_t) {}, 64);
            if (n == SW_CLOSED) break;
            if (n < 0) die("poll", n);
            if (n == 0) spinwire::spin_pause();
            if (Clock::now() > deadline) die("waiting for close", SW_TIMEOUT);
        }
        std::fprintf(stderr, "server: echoed %llu messages, %llu bad\n",
                     static_cast<unsigned long long>(count), static_cast<unsigned long long>(bad));
        return bad == 0 ? 0 : 1;
    }
    if (role == "client") {
        spinwire::Connection conn;
        auto deadline = Clock::now() + kWait;
        for (;;) {
            int r = engine.connect(ep, 2'000'000'000ull, conn);
            if (r == SW_OK) break;
            if (r != SW_NOT_CONNECTED || Clock::now() > deadline) die("connect", r);
            std::this_thread::sleep_for(std::chrono::milliseconds(10));
        }
        uint64_t warmup = count / 10, bad = 0;
        std::vector<uint8_t> echo(4096);
        size_t echo_len = 0;
        std::vector<uint64_t> rtt;
        rtt.reserve(count - warmup);
        for (uint64_t seq = 0; seq < count; seq++) {
            auto t0 = Clock::now();
            send_in_place(conn, size, [&](uint8_t *dst, size_t len) { fill(dst, len, seq); });
            recv_one(conn, [&](const uint8_t *p, size_t n) {
                echo_len = n < echo.size() ? n : echo.size();
                std::memcpy(echo.data(), p, echo_len);
            });
            auto ns = std::chrono::duration_cast<std::chrono::nanoseconds>(Clock::now() - t0).count();
            // Checked once the round trip is timed (as bench lat leaves its checks out).
            if (!check(echo.data(), echo_len, size, seq)) bad++;
            if (seq >= warmup) rtt.push_back(static_cast<uint64_t>(ns));
        }
        if (rtt.empty()) rtt.push_back(0);
        std::sort(rtt.begin(), rtt.end());
        // The mean up to the p99 ("tm99"): finer than a p50 where the clock ticks coarsely.
        const std::size_t last = (rtt.size() - 1) * 99 / 100;
        double sum = 0;
        for (std::size_t i = 0; i <= last; i++) sum += static_cast<double>(rtt[i]);
        std::printf("C++ ping-pong: %llu verified round trips of %zu B (%zu timed), %llu bad: "
                    "RTT p50 %llu ns, tm99 %.1f ns, p99 %llu ns, max %llu ns\n",
                    static_cast<unsigned long long>(count), size, rtt.size(),
                    static_cast<unsigned long long>(bad),
                    static_cast<unsigned long long>(rtt[rtt.size() / 2]),
                    sum / static_cast<double>(last + 1),
                    static_cast<unsigned long long>(rtt[(rtt.size() - 1) * 99 / 100]),
                    static_cast<unsigned long long>(rtt.back()));
        return bad == 0 ? 0 : 1;
    }
    std::fprintf(stderr, "pingpong_cpp: unknown role %s\n", role.c_str());
    return 2;
}
