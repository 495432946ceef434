// What read pattern a disk gives most (docs/benchmarks.md, cold data): reads
// a file, evicted from the page cache first, with O_DIRECT in CHUNK_MB pieces,
// in file or shuffled order, by THREADS synchronous preads or one io_uring
// ring DEPTH pieces deep (each piece optionally as SPLIT_MB requests), and
// prints GB/s. A probe of the disk, not of gpufeed: it reads bytes and checks
// only their count. Not part of the build; on a GPU host:
//   g++ -O2 -std=c++20 bench/peer/io_patterns.cc -o /tmp/io_patterns -l:liburing.a -pthread
//   /tmp/io_patterns FILE 10 uring 16 rand     (or: FILE 8 pread 2 seq)
#include <fcntl.h>
#include <liburing.h>
#include <sys/stat.h>
#include <unistd.h>
#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <numeric>
#include <random>
#include <string>
#include <thread>
#include <vector>
static double Now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}
static void Evict(const char* p) {
  int fd = open(p, O_RDONLY);
  posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
  close(fd);
}
int main(int argc, char** argv) {
  if (argc < 6) {
    std::fprintf(stderr, "io_patterns FILE CHUNK_MB pread|uring THREADS_OR_DEPTH seq|rand [SPLIT_MB]\n");
    return 2;
  }
  const char* path = argv[1];
  const size_t chunk = size_t(std::atof(argv[2]) * 1048576) / 4096 * 4096;
  std::string mode = argv[3];
  int par = std::atoi(argv[4]);
  bool rnd = std::string(argv[5]) == "rand";
  size_t split = argc > 6 ? size_t(std::atof(argv[6]) * 1048576) / 4096 * 4096 : chunk;
  if (chunk == 0 || split == 0 || chunk % split != 0 || par < 1) {
    std::fprintf(stderr,
                 "io_patterns: CHUNK_MB and SPLIT_MB: multiples of 4 KiB, SPLIT dividing CHUNK; THREADS >= 1\n");
    return 2;
  }
  struct stat st;
  if (stat(path, &st) != 0) {
    std::fprintf(stderr, "io_patterns: cannot stat %s\n", path);
    return 1;
  }
  size_t nchunks = st.st_size / chunk;
  std::vector<size_t> order(nchunks);
  std::iota(order.begin(), order.end(), 0);
  if (rnd) std::shuffle(order.begin(), order.end(), std::mt19937(7));
  Evict(path);
  int fd = open(path, O_RDONLY | O_DIRECT);
  if (fd < 0) {
    std::fprintf(stderr, "io_patterns: cannot open %s with O_DIRECT\n", path);
    return 1;
  }
  double t0 = Now();
  std::atomic<size_t> next{0}, bytes{0};
  if (mode == "pread") {
    std::vector<std::thread> th;
    for (int t = 0; t < par; ++t)
      th.emplace_back([&] {
        void* buf;
        posix_memalign(&buf, 4096, chunk);
        for (size_t i; (i = next++) < nchunks;) {
          size_t done = 0;
          while (done < chunk) {
            ssize_t r = pread(fd, (char*)buf + done, chunk - done, order[i] * chunk + done);
            if (r <= 0) break;
            done += r;
          }
          bytes += done;
        }
        free(buf);
      });
    for (auto& t : th) t.join();
  } else {
    const size_t per = chunk / split;  // SQEs a chunk
    io_uring ring;
    if (io_uring_queue_init(static_cast<unsigned>(std::max<size_t>(per * par, 2)), &ring, 0) < 0) {
      std::fprintf(stderr, "io_patterns: io_uring refused %zu entries\n", per * par);
      return 1;
    }
    std::vector<void*> bufs(par);
    for (auto& b : bufs) posix_memalign(&b, 4096, chunk);
    std::vector<int> pending(par, 0);
    std::vector<int> free_slots;
    for (int s = 0; s < par; ++s) free_slots.push_back(s);
    size_t issued = 0, completed = 0;
    while (completed < nchunks) {
      while (!free_slots.empty() && issued < nchunks) {
        int s = free_slots.back();
        free_slots.pop_back();
        for (size_t k = 0; k < per; ++k) {
          io_uring_sqe* sqe = io_uring_get_sqe(&ring);
          io_uring_prep_read(sqe, fd, (char*)bufs[s] + k * split, split, order[issued] * chunk + k * split);
          io_uring_sqe_set_data64(sqe, s);
        }
        pending[s] = per;
        ++issued;
        io_uring_submit(&ring);
      }
      io_uring_cqe* cqe;
      io_uring_wait_cqe(&ring, &cqe);
      do {
        int s = io_uring_cqe_get_data64(cqe);
        if (cqe->res > 0)
          bytes += cqe->res;
        else
          std::fprintf(stderr, "err %d\n", cqe->res);
        io_uring_cqe_seen(&ring, cqe);
        if (--pending[s] == 0) {
          free_slots.push_back(s);
          ++completed;
        }
      } while (io_uring_peek_cqe(&ring, &cqe) == 0);
    }
  }
  double dt = Now() - t0;
  std::printf("%-6s %-5s chunk %5.1f MB split %5.1f MB par %3d: %.2f GB/s (%.2f GB in %.2f s)\n", mode.c_str(), argv[5],
              chunk / 1048576.0, split / 1048576.0, par, bytes / dt / 1e9, bytes / 1e9, dt);
}
