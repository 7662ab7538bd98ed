// spinwire.hpp - header-only C++ RAII wrapper over spinwire.h (libspinwire, link -lspinwire).
// Needs C++14 or later (tested: C++14, C++17, C++20 with gcc and clang).
//
// Move-only owners of the C handles: spinwire::Engine, Listener, Connection, Claim (a zero-copy
// send buffer) and Message (a held received message) close, abort or release what they own in
// their destructors. Calls return the C API's codes (negative SW_* on failure;
// spinwire::errmsg() then has the message, also for failures the wrapper finds itself), and
// every call that returns a code is [[nodiscard]] (C++17; warn_unused_result before).
//
// Optional exceptions: define SPINWIRE_EXCEPTIONS to 1 before including this header and every
// call that fails throws spinwire::Error (the code and sw_errmsg()), except for the two results
// that are flow control, not failure: SW_BACK_PRESSURED (retry later) and SW_TIMEOUT (nothing
// came in time), which stay return values. Destructors never throw. Off by default.
//
// Lifetimes: a Claim or a Message must be committed, aborted, released or destroyed before its
// Connection closes (sw_conn_close aborts and releases them, which leaves the C++ objects
// dangling). With SPINWIRE_CHECK_LIFETIMES (on by default unless NDEBUG is defined) a
// Connection that closes while one is open prints what is open and calls std::abort(), so a
// Claim declared before its Connection in a class (destroyed after it) is caught in debug
// builds.
//
// The C header's rules apply unchanged: an Engine may be used from many threads at once, a
// Listener / Connection (and its Claims and Messages) from one thread at a time; at most one
// ring claim (shm, up to the inline threshold) is open per Connection, and while it is open
// nothing else is claimed or sent on it (SW_CLAIM_OPEN); a poll handler or an offer_in_place
// writer must not throw (their trampolines are noexcept, so an exception terminates instead of
// unwinding through C).
#ifndef SPINWIRE_HPP
#define SPINWIRE_HPP

#if !defined(__cplusplus) || __cplusplus < 201402L
#error "spinwire.hpp needs C++14 or later (spinwire.h alone works from C99 and C++11)"
#endif

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <type_traits>
#include <utility>

#include "spinwire.h"

#ifndef SPINWIRE_EXCEPTIONS
#define SPINWIRE_EXCEPTIONS 0
#endif
#if SPINWIRE_EXCEPTIONS
#include <stdexcept>
#endif

#ifndef SPINWIRE_CHECK_LIFETIMES
#ifdef NDEBUG
#define SPINWIRE_CHECK_LIFETIMES 0
#else
#define SPINWIRE_CHECK_LIFETIMES 1
#endif
#endif

namespace spinwire {

/// The message of the last failed call on this thread, with its cause chain.
inline std::string errmsg() { return sw_errmsg(); }
/// The name of a result code ("SW_CLOSED"; "SW_UNKNOWN" for anything else).
inline const char *code_name(int64_t code) {
    return code < INT32_MIN || code > INT32_MAX ? "SW_UNKNOWN"
                                                : sw_strerror(static_cast<int32_t>(code));
}

/// One turn of a spin-wait (sw_spin_pause): call it in a loop that spins on poll(), hold(),
/// offer() or try_claim(), after each call that found nothing to do.
inline void spin_pause() noexcept { sw_spin_pause(); }

#if SPINWIRE_EXCEPTIONS
/// A failed call (SPINWIRE_EXCEPTIONS): the code and sw_errmsg() at the time of the failure.
class Error : public std::runtime_error {
  public:
    Error(int64_t code, const std::string &what) : std::runtime_error(what), code_(code) {}
    int64_t code() const noexcept { return code_; }

  private:
    int64_t code_;
};
#endif

namespace detail {
/// Uses a result without a warning (gcc ignores a (void) cast on warn_unused_result).
template <class T> inline void discard(T) noexcept {}

/// Passes a result through; with SPINWIRE_EXCEPTIONS a failure other than SW_BACK_PRESSURED
/// and SW_TIMEOUT throws.
template <class T> inline T check(T r) {
#if SPINWIRE_EXCEPTIONS
    if (r < 0 && r != SW_BACK_PRESSURED && r != SW_TIMEOUT) {
        throw Error(r, std::string(code_name(r)) + ": " + sw_errmsg());
    }
#endif
    return r;
}

/// A failure found by the wrapper itself: records `msg` for errmsg(), then as check().
inline int fail(int code, const char *msg) { return check(sw_set_errmsg(code, msg)); }
} // namespace detail

/// The engine defaults (sw_config_init), to change before Engine::open.
inline sw_config default_config() {
    sw_config c;
    detail::discard(sw_config_init(&c));
    return c;
}

class Connection;

/// A zero-copy claim: write data()[0 .. size()), then commit(); abort() or the destructor gives
/// the buffer back. Must not outlive its Connection (checked in debug builds, see the top). On
/// shm a message up to the inline threshold is claimed in the ring record (its bytes staged
/// until the commit copies them in with the header): one such
/// claim is open per Connection at a time, so commit or drop a Claim before taking the next
/// (Connection::try_claim into the same Claim aborts what it held first).
class Claim {
  public:
    Claim() = default;
    Claim(const Claim &) = delete;
    Claim &operator=(const Claim &) = delete;
    Claim(Claim &&o) noexcept : c_(o.c_), live_(std::exchange(o.live_, false)) {}
    Claim &operator=(Claim &&o) noexcept {
        if (this != &o) {
            drop();
            c_ = o.c_;
            live_ = std::exchange(o.live_, false);
        }
        return *this;
    }
    ~Claim() { drop(); }

    explicit operator bool() const { return live_; }
    uint8_t *data() const { return live_ ? c_.data : nullptr; }
    size_t size() const { return live_ ? c_.len : 0; }

    /// Sends it: messages sent so far (>= 1) or a negative code. SW_BACK_PRESSURED and
    /// SW_CLAIM_OPEN (a ring claim of the connection is open) keep the claim (poll or commit
    /// the other claim, then retry or abort); any other result spends it.
    SW_NODISCARD int64_t commit() {
        if (!live_) return detail::fail(SW_BAD_ARG, "spinwire::Claim::commit: no claim held");
        int64_t r = sw_claim_commit(&c_);
        if (r != SW_BACK_PRESSURED && r != SW_CLAIM_OPEN) live_ = false;
        return detail::check(r);
    }
    /// Gives the buffer back unsent (SW_OK when none is held).
    SW_NODISCARD int abort() {
        if (!live_) return SW_OK;
        live_ = false;
        return detail::check(sw_claim_abort(&c_));
    }

  private:
    friend class Connection;
    void drop() noexcept {
        if (live_) {
            live_ = false;
            detail::discard(sw_claim_abort(&c_));
        }
    }
    sw_claim c_{};
    bool live_ = false;
};

/// A received message held in place (sw_hold): data()[0 .. size()) stays valid until release()
/// or the destructor. Must not outlive its Connection (checked in debug builds, see the top).
class Message {
  public:
    Message() = default;
    Message(const Message &) = delete;
    Message &operator=(const Message &) = delete;
    Message(Message &&o) noexcept : m_(o.m_), live_(std::exchange(o.live_, false)) {}
    Message &operator=(Message &&o) noexcept {
        if (this != &o) {
            drop();
            m_ = o.m_;
            live_ = std::exchange(o.live_, false);
        }
        return *this;
    }
    ~Message() { drop(); }

    explicit operator bool() const { return live_; }
    const uint8_t *data() const { return live_ ? m_.data : nullptr; }
    size_t size() const { return live_ ? m_.len : 0; }

    /// Gives the message's buffer back (SW_OK when none is held).
    SW_NODISCARD int release() {
        if (!live_) return SW_OK;
        live_ = false;
        return detail::check(sw_release(&m_));
    }

  private:
    friend class Connection;
    void drop() noexcept {
        if (live_) {
            live_ = false;
            detail::discard(sw_release(&m_));
        }
    }
    sw_msg m_{};
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
            drop();
            h_ = std::exchange(o.h_, nullptr);
        }
        return *this;
    }
    ~Connection() { drop(); }

    explicit operator bool() const { return h_ != nullptr; }
    sw_conn *get() const { return h_; }
    /// Closes it (SW_OK when none is held).
    SW_NODISCARD int close() {
        if (!h_) return SW_OK;
        check_lifetimes();
        return detail::check(sw_conn_close(std::exchange(h_, nullptr)));
    }

    /// sw_offer: copies; messages sent so far (>= 1) or a negative code.
    SW_NODISCARD int64_t offer(const void *data, size_t len) {
        return detail::check(sw_offer(h_, data, len));
    }
    /// sw_offer_batched: sw_offer for streams (published by flush() or the batch-th offer).
    SW_NODISCARD int64_t offer_batched(const void *data, size_t len) {
        return detail::check(sw_offer_batched(h_, data, len));
    }
    /// sw_try_claim into `claim` (aborting what it held before).
    SW_NODISCARD int try_claim(size_t len, Claim &claim) {
        claim.drop();
        int r = sw_try_claim(h_, len, &claim.c_);
        claim.live_ = r == SW_OK;
        return detail::check(r);
    }
    /// sw_offer_in_place with any callable `write(uint8_t *data, size_t len)` (must not throw):
    /// zero-copy like try_claim() + commit(), in one call. Messages sent so far (>= 1) or a
    /// negative code; on SW_BACK_PRESSURED nothing was sent (a retry may call `write` again).
    template <class W> SW_NODISCARD int64_t offer_in_place(size_t len, W &&write) {
        using Fn = typename std::remove_reference<W>::type;
        void *clientd = const_cast<void *>(static_cast<const void *>(&write));
        return detail::check(sw_offer_in_place(h_, len, &writer<Fn>, clientd));
    }
    /// sw_poll with any callable `f(const uint8_t *data, size_t len)` (must not throw).
    template <class F> SW_NODISCARD int64_t poll(F &&f, size_t limit) {
        using Fn = typename std::remove_reference<F>::type;
        void *clientd = const_cast<void *>(static_cast<const void *>(&f));
        return detail::check(sw_poll(h_, &trampoline<Fn>, clientd, limit));
    }
    /// sw_hold into `msg` (releasing what it held before): 1 with `msg` set, 0 when none is
    /// waiting, SW_BACK_PRESSURED when max_held() messages are held already.
    SW_NODISCARD int hold(Message &msg) {
        msg.drop();
        int r = sw_hold(h_, &msg.m_);
        msg.live_ = r == 1;
        return detail::check(r);
    }
    /// sw_wait: SW_OK once a message is ready for poll() / hold(), or SW_TIMEOUT.
    SW_NODISCARD int wait(uint64_t timeout_ns) { return detail::check(sw_wait(h_, timeout_ns)); }
    SW_NODISCARD int flush() { return detail::check(sw_flush(h_)); }
    SW_NODISCARD int64_t max_message_size() const {
        return detail::check(sw_conn_max_message_size(h_));
    }
    SW_NODISCARD int64_t max_held() const { return detail::check(sw_conn_max_held(h_)); }
    /// Claims open plus messages held on it.
    SW_NODISCARD int64_t outstanding() const { return detail::check(sw_conn_outstanding(h_)); }
    /// Whether it is open; false for a closed or empty Connection.
    bool is_open() const { return sw_conn_is_open(h_) == 1; }
    /// sw_conn_get_stats into `out`: SW_OK or SW_BAD_ARG (no connection).
    SW_NODISCARD int stats(sw_conn_stats &out) const {
        return detail::check(sw_conn_get_stats(h_, &out));
    }

  private:
    template <class Fn> static void trampoline(void *d, const uint8_t *p, size_t n) noexcept {
        (*static_cast<Fn *>(d))(p, n);
    }
    template <class Fn> static void writer(void *d, uint8_t *p, size_t n) noexcept {
        (*static_cast<Fn *>(d))(p, n);
    }
    void check_lifetimes() const noexcept {
#if SPINWIRE_CHECK_LIFETIMES
        int64_t open = sw_conn_outstanding(h_);
        if (open > 0) {
            std::fprintf(stderr,
                         "spinwire: a Connection closes with %lld Claim(s) / Message(s) still "
                         "open: they must not outlive it (commit, abort or release them first, "
                         "or declare them after the Connection)\n",
                         static_cast<long long>(open));
            std::abort();
        }
#endif
    }
    void drop() noexcept {
        if (h_) {
            check_lifetimes();
            detail::discard(sw_conn_close(std::exchange(h_, nullptr)));
        }
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
            drop();
            h_ = std::exchange(o.h_, nullptr);
        }
        return *this;
    }
    ~Listener() { drop(); }

    explicit operator bool() const { return h_ != nullptr; }
    SW_NODISCARD int close() {
        return h_ ? detail::check(sw_listener_close(std::exchange(h_, nullptr))) : SW_OK;
    }

    /// sw_accept: SW_OK with `out` set, SW_TIMEOUT, ...
    SW_NODISCARD int accept(uint64_t timeout_ns, Connection &out) {
        sw_conn *c = nullptr;
        int r = sw_accept(h_, timeout_ns, &c);
        if (r == SW_OK) out = Connection(c);
        return detail::check(r);
    }

  private:
    void drop() noexcept {
        if (h_) detail::discard(sw_listener_close(std::exchange(h_, nullptr)));
    }
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
            drop();
            h_ = std::exchange(o.h_, nullptr);
        }
        return *this;
    }
    ~Engine() { drop(); }

    /// sw_engine_new (cfg NULL: defaults).
    SW_NODISCARD static int open(Engine &out, const sw_config *cfg = nullptr) {
        sw_engine *h = nullptr;
        int r = sw_engine_new(cfg, &h);
        if (r == SW_OK) {
            out.drop();
            out.h_ = h;
        }
        return detail::check(r);
    }

    explicit operator bool() const { return h_ != nullptr; }
    SW_NODISCARD int close() {
        return h_ ? detail::check(sw_engine_close(std::exchange(h_, nullptr))) : SW_OK;
    }

    SW_NODISCARD int listen(const char *endpoint, Listener &out) {
        sw_listener *l = nullptr;
        int r = sw_listen(h_, endpoint, &l);
        if (r == SW_OK) out = Listener(l);
        return detail::check(r);
    }
    SW_NODISCARD int connect(const char *endpoint, uint64_t timeout_ns, Connection &out) {
        sw_conn *c = nullptr;
        int r = sw_connect(h_, endpoint, timeout_ns, &c);
        if (r == SW_OK) out = Connection(c);
        return detail::check(r);
    }
    SW_NODISCARD int64_t poll() { return detail::check(sw_engine_poll(h_)); }
    /// 1 with `ev` filled, 0 when none came within timeout_ns.
    SW_NODISCARD int next_event(uint64_t timeout_ns, sw_event &ev) {
        return detail::check(sw_next_event(h_, timeout_ns, &ev));
    }
    /// sw_engine_get_stats into `out`: SW_OK or SW_BAD_ARG (no engine).
    SW_NODISCARD int stats(sw_engine_stats &out) const {
        return detail::check(sw_engine_get_stats(h_, &out));
    }

  private:
    void drop() noexcept {
        if (h_) detail::discard(sw_engine_close(std::exchange(h_, nullptr)));
    }
    sw_engine *h_ = nullptr;
};

} // namespace spinwire

#endif // SPINWIRE_HPP
