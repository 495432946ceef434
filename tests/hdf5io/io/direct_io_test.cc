// Direct I/O (O_DIRECT through aligned bounce buffers) delivers exactly the
// bytes of the buffered path, for unaligned chunks, ranges that end at end of
// file, and every filter; where O_DIRECT is refused it falls back to pread
// and says so; in direct mode the page cache is not filled with the data.
#include "hdf5io/io/direct_io.h"

#include <fcntl.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <thread>

#include "gpufeed/dataset.h"
#include "gpufeed/writer.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

using testing::H5Layout;
using testing::IndexSamples;
using testing::WriteH5;

// Unsets an environment variable when the test ends.
struct EnvGuard {
  explicit EnvGuard(const char* name, const char* value) : name_(name) { ::setenv(name, value, 1); }
  ~EnvGuard() { ::unsetenv(name_); }
  const char* name_;
};

OpenOptions Opts(IoMode io) {
  OpenOptions o;
  o.trust_files = true;
  o.io = io;
  return o;
}

std::vector<std::byte> ReadAll(const Dataset& ds) {
  std::vector<std::byte> got(ds.num_samples() * ds.sample_bytes(), std::byte{0xEE});
  for (uint64_t i = 0; i < ds.num_chunks(); ++i) {
    Status s = ds.ReadChunk(i, std::span(got.data() + i * ds.chunk_samples() * ds.sample_bytes(),
                                         ds.samples_in_chunk(i) * ds.sample_bytes()));
    EXPECT_TRUE(s.ok()) << s.ToString();
  }
  return got;
}

TEST(DirectIoTest, PreadDirectReadsAnyRangeUpToEndOfFile) {
  const std::string path = testing::MakeTempDir("direct_io") + "/bytes.bin";
  const size_t size = 3 * io::kDirectAlign + 123;  // ends mid-block
  std::vector<std::byte> data(size);
  for (size_t i = 0; i < size; ++i) data[i] = static_cast<std::byte>((i * 131) >> 3 ^ i);
  std::ofstream(path, std::ios::binary).write(reinterpret_cast<const char*>(data.data()), size);
  std::string why;
  const int fd = io::OpenDirect(path, &why);
  ASSERT_GE(fd, 0) << why;  // the test temp dir is on a file system that takes O_DIRECT
  for (uint64_t off : {uint64_t{0}, uint64_t{1}, uint64_t{4095}, uint64_t{4096}, uint64_t{5000}, uint64_t{size - 7}}) {
    for (size_t n : {size_t{1}, size_t{100}, size_t{4096}, size_t{9000}}) {
      std::vector<std::byte> got(n);
      const int64_t r = io::PreadDirect(fd, got.data(), n, off);
      const size_t want = std::min<size_t>(n, size - off);
      ASSERT_EQ(r, static_cast<int64_t>(want)) << off << "+" << n;
      EXPECT_TRUE(std::equal(got.begin(), got.begin() + want, data.begin() + off)) << off << "+" << n;
    }
  }
  ::close(fd);
}

struct Layout {
  const char* name;
  H5Layout layout;
  hid_t type = H5T_NATIVE_UINT8;
};

TEST(DirectIoTest, DirectAndBufferedDeliverIdenticalBytes) {
  const std::string dir = testing::MakeTempDir("direct_io");
  // Chunks of 7 samples of 60 bytes: 420-byte chunks, none block-aligned.
  const std::vector<Layout> layouts = {
      {"contiguous", {}},
      {"raw", {.chunk = {7, 3, 5, 4}}},
      {"gzip", {.chunk = {7, 3, 5, 4}, .deflate = 4}},
      {"shuffle_zstd_u16", {.chunk = {7, 3, 5, 4}, .shuffle = true, .zstd = 3}, H5T_NATIVE_UINT16},
      {"userblock_gzip", {.chunk = {7, 3, 5, 4}, .deflate = 4, .userblock = 512}},
  };
  constexpr hsize_t kN = 53;
  for (const Layout& l : layouts) {
    SCOPED_TRACE(l.name);
    const uint64_t sb = 60 * H5Tget_size(l.type);
    const std::vector<std::byte> want = IndexSamples(kN, sb);
    const std::string path = dir + "/" + l.name + ".h5";
    ASSERT_TRUE(WriteH5(path, {kN, 3, 5, 4}, l.type, want, l.layout));
    auto direct = Dataset::Open(path, Opts(IoMode::kDirect));
    auto buffered = Dataset::Open(path, Opts(IoMode::kBuffered));
    ASSERT_TRUE(direct.ok() && buffered.ok());
    EXPECT_EQ(direct->info().io, "direct") << direct->info().io_note;
    EXPECT_EQ(buffered->info().io, "buffered");
    EXPECT_TRUE(ReadAll(*direct) == want);
    EXPECT_TRUE(ReadAll(*buffered) == want);
    // Sample ranges that start and end inside chunks.
    std::vector<std::byte> part(9 * sb);
    ASSERT_TRUE(direct->ReadSamples(40, 9, part).ok());
    EXPECT_TRUE(std::equal(part.begin(), part.end(), want.begin() + 40 * sb));
  }
}

TEST(DirectIoTest, RefusedODirectFallsBackToPreadAndSaysSo) {
  const std::string path = testing::MakeTempDir("direct_io") + "/f.h5";
  const std::vector<std::byte> want = IndexSamples(53, 60);
  ASSERT_TRUE(WriteH5(path, {53, 3, 5, 4}, H5T_NATIVE_UINT8, want, {.chunk = {7, 3, 5, 4}, .deflate = 4}));
  EnvGuard refuse("GPUFEED_IO_REFUSE_DIRECT", "1");
  auto ds = Dataset::Open(path, Opts(IoMode::kDirect));
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->info().io, "buffered");
  EXPECT_NE(ds->info().io_note.find("O_DIRECT refused"), std::string::npos) << ds->info().io_note;
  EXPECT_NE(ds->info().io_note.find("pread"), std::string::npos) << ds->info().io_note;
  EXPECT_TRUE(ReadAll(*ds) == want);
}

TEST(DirectIoTest, TmpfsFileReadsTheSameWhicheverPathItTakes) {
  // tmpfs takes O_DIRECT since Linux 6.6 and refuses it before: either way
  // the bytes are right and the mode says what happened.
  if (!std::filesystem::is_directory("/dev/shm")) GTEST_SKIP() << "no /dev/shm";
  const std::string path = "/dev/shm/gpufeed_direct_io_test_" + std::to_string(::getpid()) + ".h5";
  const std::vector<std::byte> want = IndexSamples(53, 60);
  ASSERT_TRUE(WriteH5(path, {53, 3, 5, 4}, H5T_NATIVE_UINT8, want, {.chunk = {7, 3, 5, 4}}));
  auto ds = Dataset::Open(path, Opts(IoMode::kDirect));
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  if (ds->info().io == "buffered") {
    EXPECT_NE(ds->info().io_note.find("O_DIRECT refused"), std::string::npos);
  } else {
    EXPECT_EQ(ds->info().io, "direct");
  }
  EXPECT_TRUE(ReadAll(*ds) == want);
  std::filesystem::remove(path);
}

TEST(DirectIoTest, EnvironmentChoosesTheModeAndAutoExplainsItself) {
  const std::string path = testing::MakeTempDir("direct_io") + "/f.h5";
  ASSERT_TRUE(WriteH5(path, {20, 60}, H5T_NATIVE_UINT8, IndexSamples(20, 60), {.chunk = {7, 60}}));
  {
    auto ds = Dataset::Open(path, Opts(IoMode::kAuto));
    ASSERT_TRUE(ds.ok());
    EXPECT_EQ(ds->info().io, "buffered");  // a small file fits in memory
    EXPECT_NE(ds->info().io_note.find("fits in"), std::string::npos) << ds->info().io_note;
  }
  {
    EnvGuard env("GPUFEED_IO", "direct");
    auto ds = Dataset::Open(path, Opts(IoMode::kAuto));
    ASSERT_TRUE(ds.ok());
    EXPECT_EQ(ds->info().io, "direct");
    // An explicit option wins over the environment.
    auto b = Dataset::Open(path, Opts(IoMode::kBuffered));
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->info().io, "buffered");
  }
  {
    EnvGuard env("GPUFEED_IO", "fast");
    auto ds = Dataset::Open(path, Opts(IoMode::kAuto));
    ASSERT_FALSE(ds.ok());
    EXPECT_NE(ds.status().message().find("GPUFEED_IO"), std::string::npos);
    EXPECT_NE(ds.status().message().find("auto, direct, buffered"), std::string::npos);
  }
  // The read-ahead's depth: GPUFEED_IO_DEPTH, checked.
  {
    EnvGuard env("GPUFEED_IO_DEPTH", "5");
    auto ds = Dataset::Open(path, Opts(IoMode::kDirect));
    ASSERT_TRUE(ds.ok());
    if (ds->info().io_note.find("io_uring read-ahead") != std::string::npos) {
      EXPECT_EQ(ds->read_ahead_chunks(), 5u) << ds->info().io_note;
    }
    auto b = Dataset::Open(path, Opts(IoMode::kBuffered));
    ASSERT_TRUE(b.ok());
    EXPECT_EQ(b->read_ahead_chunks(), 0u);  // the kernel reads ahead through the page cache
  }
  for (const char* bad : {"0", "257", "-3", "8x"}) {
    EnvGuard env("GPUFEED_IO_DEPTH", bad);
    auto ds = Dataset::Open(path, Opts(IoMode::kDirect));
    ASSERT_FALSE(ds.ok()) << bad;
    EXPECT_NE(ds.status().message().find("GPUFEED_IO_DEPTH='" + std::string(bad) + "'"), std::string::npos)
        << ds.status().message();
  }
}

TEST(DirectIoTest, DirectModeLeavesThePageCacheAlone) {
  const std::string path = testing::MakeTempDir("direct_io") + "/big.h5";
  constexpr hsize_t kN = 400;
  const std::vector<std::byte> want = IndexSamples(kN, 8192);
  ASSERT_TRUE(WriteH5(path, {kN, 8192}, H5T_NATIVE_UINT8, want, {.chunk = {7, 8192}}));
  for (IoMode mode : {IoMode::kDirect, IoMode::kBuffered}) {
    ASSERT_TRUE(io::EvictFromPageCache(path).ok());
    auto ds = Dataset::Open(path, Opts(mode));
    ASSERT_TRUE(ds.ok());
    ASSERT_TRUE(ReadAll(*ds) == want);
    auto resident = io::ResidentFraction(path);
    ASSERT_TRUE(resident.ok()) << resident.status().ToString();
    if (mode == IoMode::kDirect) {
      EXPECT_LT(*resident, 0.05) << "direct reads filled the page cache";  // HDF5's metadata reads only
    } else {
      EXPECT_GT(*resident, 0.9) << "the buffered read should be cached (checks the measurement)";
    }
  }
}

// The io_uring read-ahead: hints in any order (repeated, more than its depth,
// some never read) never change what ReadChunk returns, from many threads.
TEST(DirectIoTest, ReadAheadDeliversTheSameBytesInAnyOrder) {
  const std::string dir = testing::MakeTempDir("direct_io");
  constexpr hsize_t kN = 300;
  const std::vector<std::byte> want = IndexSamples(kN, 1000);
  struct L {
    const char* name;
    H5Layout layout;
  };
  for (const L& l :
       {L{"raw", {.chunk = {7, 1000}}}, L{"gzip", {.chunk = {7, 1000}, .deflate = 4}}, L{"contiguous", {}}}) {
    SCOPED_TRACE(l.name);
    const std::string path = dir + "/" + l.name + ".h5";
    ASSERT_TRUE(WriteH5(path, {kN, 1000}, H5T_NATIVE_UINT8, want, l.layout));
    auto ds = Dataset::Open(path, Opts(IoMode::kDirect));
    ASSERT_TRUE(ds.ok());
    ASSERT_EQ(ds->info().io, "direct");
    if (ds->info().io_note.find("io_uring read-ahead") == std::string::npos) {
      GTEST_SKIP() << "io_uring unavailable here: " << ds->info().io_note;
    }
    const uint64_t nc = ds->num_chunks();
    std::vector<std::byte> got(want.size(), std::byte{0xEE});
    // Hint ahead of reading, in a scrambled order, with repeats and chunks
    // hinted but read much later (their buffers get reused).
    std::vector<uint64_t> order;
    for (uint64_t k = 0; k < nc; ++k) order.push_back((k * 7) % nc);
    std::vector<std::thread> threads;
    for (int t = 0; t < 3; ++t) {
      threads.emplace_back([&, t] {
        for (size_t k = t; k < order.size(); k += 3) {
          const uint64_t c = order[k];
          ds->WillRead(c);
          ds->WillRead(c);
          if (k + 6 < order.size()) ds->WillRead(order[k + 6]);
          Status s =
              ds->ReadChunk(c, std::span(got.data() + c * ds->chunk_samples() * 1000, ds->samples_in_chunk(c) * 1000));
          EXPECT_TRUE(s.ok()) << s.ToString();
        }
      });
    }
    for (std::thread& t : threads) t.join();
    EXPECT_TRUE(got == want);
    ds->WillRead(nc - 1);  // left in flight or unclaimed at destruction: waited for, no leak
  }
}

// With every buffer holding a read, a new hint waits for a buffer (a reader
// wanting it first reads it itself): a read hinted in order is never given
// up for a later one, so it is never made twice. (The 2 s abandonment is not
// tested here: when a completion is reaped depends on the readers' timing.)
TEST(DirectIoTest, ReadAheadKeepsCompletedReadsUntilTaken) {
  const std::string dir = testing::MakeTempDir("direct_io_slots");
  const std::string path = dir + "/f.bin";
  std::vector<std::byte> bytes(4 * io::kDirectAlign);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte(i * 7 / 4096 + i);
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  std::string why;
  const int fd = io::OpenDirect(path, &why);
  if (fd < 0) GTEST_SKIP() << "O_DIRECT refused here: " << why;
  std::string ring_why;
  auto ring = io::UringReadAhead::Create(fd, 2, &ring_why);
  if (!ring) {
    ::close(fd);
    GTEST_SKIP() << ring_why;
  }
  const size_t b = io::kDirectAlign;
  std::vector<std::byte> got(b);
  auto block = [&](uint64_t k) { return std::vector<std::byte>(bytes.begin() + k * b, bytes.begin() + (k + 1) * b); };
  ring->Start(0, 0, b);
  ring->Start(1, b, b);
  ring->Start(2, 2 * b, b);                                       // both buffers hold reads: queued
  EXPECT_FALSE(ring->Take(2, got.data(), b, 2 * b).has_value());  // wanted before a buffer freed: forgotten
  auto r0 = ring->Take(0, got.data(), b, 0);                      // not given up for block 2
  ASSERT_TRUE(r0.has_value());
  EXPECT_EQ(*r0, int64_t(b));
  EXPECT_TRUE(got == block(0));
  ring->Start(3, 3 * b, b);    // block 0's buffer is free again
  for (uint64_t k : {1, 3}) {  // block 1 was kept for its reader
    auto r = ring->Take(k, got.data(), b, k * b);
    ASSERT_TRUE(r.has_value()) << k;
    EXPECT_TRUE(got == block(k)) << k;
  }
  EXPECT_EQ(ring->stats().started, 3u) << "block 2, read by its reader, was started later too";
  ring.reset();
  ::close(fd);
}

// Hints past the buffers wait in order and start as Takes free buffers, so
// every read the plan announced goes through the ring, however few buffers
// it has (they used to be dropped, and their chunks read synchronously by the
// decoding threads: about 470 of 770 chunk reads in two cold epochs of a
// 4.7 GB file on the developer machine, the ring 4 deep). Past 4 x depth
// queued, a hint is dropped. Each block's bytes encode its index.
TEST(DirectIoTest, ReadAheadQueuesHintsUntilABufferIsFree) {
  const std::string dir = testing::MakeTempDir("direct_io_queue");
  const std::string path = dir + "/f.bin";
  constexpr uint64_t kBlocks = 12;
  const size_t b = io::kDirectAlign;
  std::vector<std::byte> bytes(kBlocks * b);
  for (size_t i = 0; i < bytes.size(); ++i) bytes[i] = std::byte((i / b) * 16 + i % 13);
  {
    std::ofstream f(path, std::ios::binary);
    f.write(reinterpret_cast<const char*>(bytes.data()), static_cast<std::streamsize>(bytes.size()));
  }
  std::string why;
  const int fd = io::OpenDirect(path, &why);
  if (fd < 0) GTEST_SKIP() << "O_DIRECT refused here: " << why;
  std::string ring_why;
  auto ring = io::UringReadAhead::Create(fd, 2, &ring_why);  // 2 buffers, 8 hints queued at most
  if (!ring) {
    ::close(fd);
    GTEST_SKIP() << ring_why;
  }
  auto block = [&](uint64_t k) { return std::vector<std::byte>(bytes.begin() + k * b, bytes.begin() + (k + 1) * b); };
  for (uint64_t k = 0; k < 11; ++k) ring->Start(k, k * b, b);  // 2 in buffers, 8 queued, block 10 dropped
  ring->Start(3, 3 * b, b);                                    // queued already: no second read
  EXPECT_EQ(ring->stats().started, 2u);
  EXPECT_EQ(ring->stats().dropped, 1u);
  std::vector<std::byte> got(b);
  for (uint64_t k = 0; k < 10; ++k) {
    auto r = ring->Take(k, got.data(), b, k * b);
    ASSERT_TRUE(r.has_value()) << "block " << k << " was not read ahead";
    EXPECT_EQ(*r, int64_t(b)) << k;
    EXPECT_TRUE(got == block(k)) << k;
  }
  EXPECT_FALSE(ring->Take(10, got.data(), b, 10 * b).has_value());  // the dropped hint: read by its reader
  const io::UringReadAhead::Stats s = ring->stats();
  EXPECT_EQ(s.started, 10u);
  EXPECT_EQ(s.taken, 10u);
  EXPECT_EQ(s.not_started, 1u);
  EXPECT_EQ(s.not_started_bytes, b);
  EXPECT_GT(s.seconds, 0.0);
  EXPECT_GT(s.in_flight_slot_s + s.done_untaken_slot_s, 0.0);
  EXPECT_LE(s.in_flight_slot_s + s.done_untaken_slot_s + s.claimed_slot_s, 2 * s.seconds * 1.0001);  // 2 buffers
  ring.reset();
  ::close(fd);
}

TEST(DirectIoTest, IoUringCanBeTurnedOffAndSaysSo) {
  const std::string path = testing::MakeTempDir("direct_io") + "/f.h5";
  const std::vector<std::byte> want = IndexSamples(53, 60);
  ASSERT_TRUE(WriteH5(path, {53, 3, 5, 4}, H5T_NATIVE_UINT8, want, {.chunk = {7, 3, 5, 4}}));
  EnvGuard off("GPUFEED_IO_URING", "0");
  auto ds = Dataset::Open(path, Opts(IoMode::kDirect));
  ASSERT_TRUE(ds.ok());
  EXPECT_EQ(ds->info().io, "direct");
  EXPECT_NE(ds->info().io_note.find("synchronous O_DIRECT preads"), std::string::npos) << ds->info().io_note;
  for (uint64_t c = 0; c < ds->num_chunks(); ++c) ds->WillRead(c);
  EXPECT_TRUE(ReadAll(*ds) == want);
}

// gpufeed's writer puts every chunk on a 4 KiB boundary (H5Pset_alignment),
// so direct reads of its files read no bytes around a chunk.
TEST(DirectIoTest, WriterAlignsChunksTo4KiB) {
  const std::string path = testing::MakeTempDir("direct_io") + "/w.h5";
  const std::vector<uint64_t> shape = {3, 50, 50};
  WriteOptions w;
  w.codec = Codec::kNone;  // chunks of 22,500 bytes: every one is checked below
  w.chunk_samples = 3;
  constexpr uint64_t kN = 40;
  auto wr = DatasetWriter::Create(path, shape, DType::kUInt8, kN, w);
  ASSERT_TRUE(wr.ok()) << wr.status().ToString();
  const std::vector<std::byte> data = IndexSamples(kN, 7500);
  for (uint64_t c = 0; c * 3 < kN; ++c) {
    const uint64_t n = std::min<uint64_t>(3, kN - c * 3);
    DatasetWriter::EncodedChunk e;
    ASSERT_TRUE(wr->EncodeChunk(c, std::span(data).subspan(c * 3 * 7500, n * 7500), &e).ok());
    ASSERT_TRUE(wr->WriteChunk(c, e).ok());
  }
  ASSERT_TRUE(wr->Commit().ok());
  hid_t f = H5Fopen(path.c_str(), H5F_ACC_RDONLY, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t d = H5Dopen2(f, "/images", H5P_DEFAULT);
  ASSERT_GE(d, 0);
  for (hsize_t c = 0; c * 3 < kN; ++c) {
    hsize_t off[4] = {c * 3, 0, 0, 0};
    unsigned mask = 0;
    haddr_t addr = 0;
    hsize_t size = 0;
    ASSERT_GE(H5Dget_chunk_info_by_coord(d, off, &mask, &addr, &size), 0);
    ASSERT_GE(size, 4096u);
    EXPECT_EQ(addr % 4096, 0u) << "chunk " << c << " at " << addr << ", " << size << " bytes";
  }
  H5Dclose(d);
  H5Fclose(f);
  auto ds = Dataset::Open(path, Opts(IoMode::kDirect));
  ASSERT_TRUE(ds.ok());
  EXPECT_TRUE(ReadAll(*ds) == data);
}

TEST(DirectIoTest, FileTruncatedAfterOpenIsAnErrorNamingTheChunk) {
  const std::string path = testing::MakeTempDir("direct_io") + "/t.h5";
  ASSERT_TRUE(WriteH5(path, {200, 4096}, H5T_NATIVE_UINT8, IndexSamples(200, 4096), {.chunk = {10, 4096}}));
  auto ds = Dataset::Open(path, Opts(IoMode::kDirect));
  ASSERT_TRUE(ds.ok());
  ASSERT_EQ(::truncate(path.c_str(), 8192), 0);
  std::vector<std::byte> got(10 * 4096);
  Status s = ds->ReadChunk(19, got);
  ASSERT_FALSE(s.ok());
  EXPECT_NE(s.message().find("chunk 19"), std::string::npos) << s.message();
  EXPECT_NE(s.message().find("t.h5"), std::string::npos) << s.message();
}

}  // namespace
}  // namespace gpufeed
