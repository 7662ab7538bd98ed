// consumer.cpp - one held message over shm through an installed libspinwire.a and
// spinwire.hpp (CMake consumer, C++14).
#include <cstdio>
#include <cstring>
#include <string>
#include <unistd.h>

#include <spinwire.hpp>

int main() {
    spinwire::Engine e;
    spinwire::Listener l;
    spinwire::Connection a, b;
    std::string ep = "shm://ffi-cmake-cpp-" + std::to_string(getpid());
    if (spinwire::Engine::open(e) != SW_OK || e.listen(ep.c_str(), l) != SW_OK ||
        e.connect(ep.c_str(), 5000000000ull, a) != SW_OK ||
        l.accept(5000000000ull, b) != SW_OK) {
        std::fprintf(stderr, "consumer_cpp: %s\n", spinwire::errmsg().c_str());
        return 1;
    }
    const char hello[] = "hello, cmake (C++)";
    if (a.offer(hello, sizeof hello) < 1) return 1;
    spinwire::Message m;
    for (long i = 0; i < 100000000 && !m; i++)
        if (b.hold(m) < 0) return 1;
    bool ok = m && std::strcmp(reinterpret_cast<const char *>(m.data()), hello) == 0;
    std::printf("consumer_cpp: %s\n", ok ? reinterpret_cast<const char *>(m.data()) : "FAILED");
    return ok && m.release() == SW_OK ? 0 : 1;
}
