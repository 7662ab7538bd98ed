// spinwire.hpp - header-only C++ RAII wrapper over spinwire.h (libspinwire, link -lspinwire).
//
// Move-only owners of the C handles: spinwire::Engine, Listener, Connection and Claim close
// (or abort) what they own in their destructors. No exceptions: calls return the C API's codes
// (negative SW_* on failure; spinwire::errmsg() then has the message). The C header's rules
// apply unchanged: an Engine may be used from many threads at once, a Listener / Connection
// (and its Claims) from one thread at a time; a Claim must be committed, aborted or destroyed
// before its Connection; at most one ring claim (shm, up to the inline threshold) is open per
// Connection, and while it is open nothing else is claimed or sent on it (SW_CLAIM_OPEN); a poll handler must not throw (the trampoline is noexcept, so an
// exception terminates instead of unwinding through C).
#ifndef SPINWIRE_HPP
#define SPINWIRE_HPP

#include <cstddef>
#include <cstdint>
#include <string>
#include <type_traits>
#include <utility>

#include "spinwire.h"

namespace spinwire {

/// The message of the last failed call on this thread, with its cause chain.
inline std::string errmsg() { return sw_errmsg(); }
/// The name of a code ("SW_CLOSED").
inline const char *strerror(int64_t code) { return sw_strerror(static_cast<int32_t>(code)); }

/// The engine defaults (sw_config_init), to change before Engine::open.
inline sw_config default_config() {
    sw_config c;
    sw_config_init(&c);
    return c;
}

class Connection;

/// A zero-copy claim: write data()[0 .. size()), then commit(); abort() or the destructor gives
/// the buffer back. Must not outlive its Connection. On shm a message up to the inline
/// threshold is claimed in the ring record itself: one such claim is open per Connection at a
/// time, so commit or drop a Claim before taking the next (Connection::try_claim into the same
/// Claim aborts what it held first).
class Claim {
  public:
    Claim() = default;
    Claim(const Claim &) = delete;
    Claim &operator=(const Claim &) = delete;
    Claim(Claim &&o) noexcept : c_(o.c_), live_(std::exchange(o.live_, false)) {}
    Claim &operator=(Claim &&o) noexcept {
        if (this != &o) {
            abort();
            c_ = o.c_;
            live_ = std::exchange(o.live_, false);
        }
        return *this;
    }
    ~Claim() { abort(); }

    explicit operator bool() const { return live_; }
    uint8_t *data() const { return live_ ? c_.data : nullptr; }
    size_t size() const { return live_ ? c_.len : 0; }

    /// Sends it: messages sent so far (>= 1) or a negative code. SW_BACK_PRESSURED and
    /// SW_CLAIM_OPEN (a ring claim of the connection is open) keep the claim (poll or commit
    /// the other claim, then retry or abort); any other result spends it.
    int64_t commit() {
        if (!live_) return SW_BAD_ARG;
        int64_t r = sw_claim_commit(&c_);
        if (r != SW_BACK_PRESSURED && r != SW_CLAIM_OPEN) live_ = false;
        return r;
    }
    /// Gives the buffer back unsent.
    int abort() {
        if (!live_) return SW_OK;
        live_ = false;
        return sw_claim_abort(&c_);
    }

  private:
    friend class Connection;
    sw_claim c_{};
    bool live_ = false;
};

/// A connection (sw_conn). One thread at a time.
class Connection {
  public:
    Connection() = default;
    explicit Connection(sw_conn *h) : h_(h) {}
    Connection(const Connection &) = delete;
    Connection &operator=(const Connection &) = delete;
    Connection(Connection &&o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
    Connection &operator=(Connection &&o) noexcept {
        if (this != &o) {
            close();
            h_ = std::exchange(o.h_, nullptr);
        }
        return *this;
    }
    ~Connection() { close(); }

    explicit operator bool() const { return h_ != nullptr; }
    sw_conn *get() const { return h_; }
    int close() { return h_ ? sw_conn_close(std::exchange(h_, nullptr)) : SW_OK; }

    /// sw_offer: copies; messages sent so far (>= 1) or a negative code.
    int64_t offer(const void *data, size_t len) {
        return sw_offer(h_, static_cast<const uint8_t *>(data), len);
    }
    /// sw_try_claim into `claim` (aborting what it held before).
    int try_claim(size_t len, Claim &claim) {
        claim.abort();
        int r = sw_try_claim(h_, len, &claim.c_);
        claim.live_ = r == SW_OK;
        return r;
    }
    /// sw_poll with any callable `f(const uint8_t *data, size_t len)` (must not throw).
    template <class F> int64_t poll(F &&f, size_t limit) {
        using Fn = typename std::remove_reference<F>::type;
        void *clientd = const_cast<void *>(static_cast<const void *>(&f));
        return sw_poll(h_, &trampoline<Fn>, clientd, limit);
    }
    int flush() { return sw_flush(h_); }
    int64_t max_message_size() const { return sw_conn_max_message_size(h_); }
    bool is_open() const { return sw_conn_is_open(h_) == 1; }
    sw_conn_stats stats() const {
        sw_conn_stats s{};
        sw_conn_get_stats(h_, &s);
        return s;
    }

  private:
    template <class Fn> static void trampoline(void *d, const uint8_t *p, size_t n) noexcept {
        (*static_cast<Fn *>(d))(p, n);
    }
    sw_conn *h_ = nullptr;
};

/// A listener (sw_listener). One thread at a time.
class Listener {
  public:
    Listener() = default;
    explicit Listener(sw_listener *h) : h_(h) {}
    Listener(const Listener &) = delete;
    Listener &operator=(const Listener &) = delete;
    Listener(Listener &&o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
    Listener &operator=(Listener &&o) noexcept {
        if (this != &o) {
            close();
            h_ = std::exchange(o.h_, nullptr);
        }
        return *this;
    }
    ~Listener() { close(); }

    explicit operator bool() const { return h_ != nullptr; }
    int close() { return h_ ? sw_listener_close(std::exchange(h_, nullptr)) : SW_OK; }

    /// sw_accept: SW_OK with `out` set, SW_TIMEOUT, ...
    int accept(uint64_t timeout_ns, Connection &out) {
        sw_conn *c = nullptr;
        int r = sw_accept(h_, timeout_ns, &c);
        if (r == SW_OK) out = Connection(c);
        return r;
    }

  private:
    sw_listener *h_ = nullptr;
};

/// An engine (sw_engine). Thread-safe.
class Engine {
  public:
    Engine() = default;
    Engine(const Engine &) = delete;
    Engine &operator=(const Engine &) = delete;
    Engine(Engine &&o) noexcept : h_(std::exchange(o.h_, nullptr)) {}
    Engine &operator=(Engine &&o) noexcept {
        if (this != &o) {
            close();
            h_ = std::exchange(o.h_, nullptr);
        }
        return *this;
    }
    ~Engine() { close(); }

    /// sw_engine_new (cfg NULL: defaults).
    static int open(Engine &out, const sw_config *cfg = nullptr) {
        sw_engine *h = nullptr;
        int r = sw_engine_new(cfg, &h);
        if (r == SW_OK) {
            out.close();
            out.h_ = h;
        }
        return r;
    }

    explicit operator bool() const { return h_ != nullptr; }
    int close() { return h_ ? sw_engine_close(std::exchange(h_, nullptr)) : SW_OK; }

    int listen(const char *endpoint, Listener &out) {
        sw_listener *l = nullptr;
        int r = sw_listen(h_, endpoint, &l);
        if (r == SW_OK) out = Listener(l);
        return r;
    }
    int connect(const char *endpoint, uint64_t timeout_ns, Connection &out) {
        sw_conn *c = nullptr;
        int r = sw_connect(h_, endpoint, timeout_ns, &c);
        if (r == SW_OK) out = Connection(c);
        return r;
    }
    int64_t poll() { return sw_engine_poll(h_); }
    /// 1 with `ev` filled, 0 when none came within timeout_ns.
    int next_event(uint64_t timeout_ns, sw_event &ev) { return sw_next_event(h_, timeout_ns, &ev); }
    sw_engine_stats stats() const {
        sw_engine_stats s{};
        sw_engine_get_stats(h_, &s);
        return s;
    }

  private:
    sw_engine *h_ = nullptr;
};

} // namespace spinwire

#endif // SPINWIRE_HPP
