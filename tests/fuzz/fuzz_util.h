// Helpers shared by the libFuzzer targets: reading fields off the front of a
// fuzz input, and an in-memory file (memfd) for the parsers whose public entry
// point takes a path, so the target exercises the real entry point.
#ifndef GPUFEED_TESTS_FUZZ_FUZZ_UTIL_H_
#define GPUFEED_TESTS_FUZZ_FUZZ_UTIL_H_

#include <sys/mman.h>
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <span>
#include <string>

namespace gpufeed::fuzz {

// A finding that is not a sanitizer report (a property the code promises
// does not hold): print it and abort, which libFuzzer records as a crash.
[[noreturn]] inline void Fail(const char* what) {
  std::fprintf(stderr, "fuzz property violated: %s\n", what);
  std::abort();
}
#define GPUFEED_FUZZ_CHECK(cond)               \
  do {                                         \
    if (!(cond)) ::gpufeed::fuzz::Fail(#cond); \
  } while (0)

// Consumes fixed-size fields from the front of the input; past the end it
// yields zeros, so every input decodes to some parameters.
class Input {
 public:
  Input(const uint8_t* data, size_t size) : p_(data), n_(size) {}
  uint8_t U8() {
    if (at_ >= n_) return 0;
    return p_[at_++];
  }
  uint16_t U16() { return static_cast<uint16_t>(U8() | (U8() << 8)); }
  std::span<const std::byte> Rest() const {
    return {reinterpret_cast<const std::byte*>(p_) + at_, at_ < n_ ? n_ - at_ : 0};
  }

 private:
  const uint8_t* p_;
  size_t n_;
  size_t at_ = 0;
};

// One memfd per process, rewritten for every input; Path() opens it anew
// (/proc/self/fd/N), as a user's file would be opened.
class MemFile {
 public:
  MemFile() : fd_(::memfd_create("gpufeed-fuzz", MFD_CLOEXEC)) {
    if (fd_ < 0) Fail("memfd_create");
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  void Set(const uint8_t* data, size_t size) {
    if (::ftruncate(fd_, 0) != 0) Fail("ftruncate");
    size_t done = 0;
    while (done < size) {
      const ssize_t w = ::pwrite(fd_, data + done, size - done, static_cast<off_t>(done));
      if (w <= 0) Fail("pwrite");
      done += static_cast<size_t>(w);
    }
  }
  std::string Path() const { return "/proc/self/fd/" + std::to_string(fd_); }

 private:
  int fd_;
};

}  // namespace gpufeed::fuzz

#endif  // GPUFEED_TESTS_FUZZ_FUZZ_UTIL_H_
