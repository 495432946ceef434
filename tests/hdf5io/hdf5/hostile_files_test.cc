// Files whose declared sizes would make gpufeed allocate without bound or
// wrap a size product, and files that crash HDF5 itself: each is a clear
// error, never an abort, a crash or a silently wrong sample.
#include <gtest/gtest.h>
#include <hdf5.h>

#include <sys/stat.h>

#include <chrono>
#include <atomic>
#include <cstdlib>
#include <filesystem>
#include <string>
#include <thread>
#include <vector>

#include "gpufeed/dataset.h"
#include "gpufeed/loader.h"
#include "hdf5io/hdf5/probe.h"
#include "tests/testing/test_data.h"

namespace gpufeed {
namespace {

// /images of `dims` (uint8, chunked as `chunk`), with only the first
// `written_rows` rows written: a valid, tiny, sparse file.
void WriteSparse(const std::string& path, const std::vector<hsize_t>& dims, const std::vector<hsize_t>& chunk,
                 hsize_t written_rows) {
  hid_t f = H5Fcreate(path.c_str(), H5F_ACC_TRUNC, H5P_DEFAULT, H5P_DEFAULT);
  ASSERT_GE(f, 0);
  hid_t space = H5Screate_simple(static_cast<int>(dims.size()), dims.data(), nullptr);
  hid_t dcpl = H5Pcreate(H5P_DATASET_CREATE);
  H5Pset_chunk(dcpl, static_cast<int>(chunk.size()), chunk.data());
  hid_t d = H5Dcreate2(f, "images", H5T_STD_U8LE, space, H5P_DEFAULT, dcpl, H5P_DEFAULT);
  ASSERT_GE(d, 0);
  if (written_rows > 0) {
    std::vector<hsize_t> start(dims.size(), 0), count(dims.begin(), dims.end());
    count[0] = written_rows;
    hsize_t n = 1;
    for (hsize_t c : count) n *= c;
    std::vector<uint8_t> bytes(n);
    for (hsize_t i = 0; i < n; ++i) bytes[i] = static_cast<uint8_t>(i);
    hid_t mem = H5Screate_simple(static_cast<int>(count.size()), count.data(), nullptr);
    H5Sselect_hyperslab(space, H5S_SELECT_SET, start.data(), nullptr, count.data(), nullptr);
    ASSERT_GE(H5Dwrite(d, H5T_NATIVE_UINT8, mem, space, H5P_DEFAULT, bytes.data()), 0);
    H5Sclose(mem);
  }
  H5Dclose(d);
  H5Pclose(dcpl);
  H5Sclose(space);
  H5Fclose(f);
}

std::string CorpusData() { return std::string(GPUFEED_SOURCE_DIR) + "/tests/corpus/data"; }

// 2^40 samples declared, 4 stored: the chunk index is not sized by the
// declared shape (it aborted in std::bad_alloc), the file opens on the hdf5
// path, and the loader refuses the epoch plan with the memory it would need.
TEST(HostileFilesTest, HugeDeclaredSampleCountIsAClearError) {
  const std::string dir = testing::MakeTempDir("hostile");
  const std::string path = dir + "/huge_n.h5";
  WriteSparse(path, {hsize_t{1} << 40, 8}, {1, 8}, 4);
  auto ds = Dataset::Open(path);
  ASSERT_TRUE(ds.ok()) << ds.status().ToString();
  EXPECT_EQ(ds->num_samples(), uint64_t{1} << 40);
  EXPECT_EQ(ds->info().read_path, ReadPath::kHdf5);
  EXPECT_NE(ds->info().read_path_reason.find("not allocated"), std::string::npos);
  std::vector<std::byte> sample(8);
  ASSERT_TRUE(ds->ReadSamples(1, 1, sample).ok());
  EXPECT_EQ(static_cast<uint8_t>(sample[0]), 8);  // row 1 of the written rows
  LoaderOptions o;
  o.pin_memory = false;
  Loader loader(*ds, o);
  EpochStream s = loader.Epoch(0);
  auto b = s.Next();
  ASSERT_FALSE(b.ok());
  EXPECT_EQ(b.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(b.status().message().find("epoch plan"), std::string::npos) << b.status().ToString();
}

// [4, 2^32, 2^32] bytes: the per-sample byte count wrapped to 0 and inspect
// wrote a wrong .npy with exit 0.
TEST(HostileFilesTest, SampleSizeThatWrapsIsRefused) {
  const std::string dir = testing::MakeTempDir("hostile");
  for (const auto& dims :
       std::vector<std::vector<hsize_t>>{{4, hsize_t{1} << 32, hsize_t{1} << 32}, {4, (hsize_t{1} << 62) + 1, 4}}) {
    const std::string path = dir + "/wrap.h5";
    WriteSparse(path, dims, {1, 1024, dims[2] == 4 ? hsize_t{4} : hsize_t{1024}}, 0);
    auto ds = Dataset::Open(path);
    ASSERT_FALSE(ds.ok());
    EXPECT_EQ(ds.status().code(), StatusCode::kUnsupported);
    EXPECT_NE(ds.status().message().find("larger than 2^64 bytes"), std::string::npos) << ds.status().ToString();
  }
}

// Damaged dataspaces (current dimension above its maximum) from the
// reproducers: they aborted (bad_alloc, length_error).
TEST(HostileFilesTest, DamagedDataspacesFromTheReproducers) {
  const std::string repro = CorpusData() + "/repro";
  ASSERT_TRUE(std::filesystem::exists(repro)) << "no " << repro << " (tests/corpus/data is in the repository)";
  for (const char* name : {"huge_sample_alloc.h5", "huge_sample_length_error.h5"}) {
    auto ds = Dataset::Open(repro + "/" + name);
    ASSERT_FALSE(ds.ok()) << name;
    EXPECT_EQ(ds.status().code(), StatusCode::kCorrupt);
    EXPECT_NE(ds.status().message().find("damaged dataspace"), std::string::npos) << ds.status().ToString();
  }
}

// Files that crash (signal 11, 6) or hang HDF5 while it reads their
// metadata: the probe process takes the crash, Open returns Corrupt.
TEST(HostileFilesTest, HdfCrashesAndHangsAreContainedByTheProbe) {
  const std::string cve = CorpusData() + "/hdf5-cve";
  ASSERT_TRUE(std::filesystem::exists(cve)) << "no " << cve << " (tests/corpus/data is in the repository)";
  const std::string dir = testing::MakeTempDir("probe");
  const std::string good = dir + "/good.h5";
  WriteSparse(good, {10, 8}, {5, 8}, 10);
  std::vector<std::string> specs = {
      good, cve + "/cve-2018-13867.h5", good, cve + "/cve-2025-6269-1.h5", cve + "/cve-2018-15671.h5", good};
  ProbeOptions po;
  po.timeout_ms = 4000;
  po.processes = 2;
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Status> r = ProbeFiles(specs, po);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(30));
  ASSERT_EQ(r.size(), specs.size());
  EXPECT_TRUE(r[0].ok() && r[2].ok() && r[5].ok()) << r[0].ToString() << r[2].ToString() << r[5].ToString();
  // Contained either way: a crash, or (under a sanitizer's allocator, which
  // may not abort on the heap damage glibc detects) a hang that is killed.
  for (int i : {1, 3, 4}) {
    EXPECT_EQ(r[i].code(), StatusCode::kCorrupt) << i;
    EXPECT_NE(r[i].message().find(specs[i]), std::string::npos) << r[i].ToString();
    EXPECT_TRUE(r[i].message().find("HDF5 crashed reading this file's metadata") != std::string::npos ||
                r[i].message().find("HDF5 did not finish reading this file's metadata") != std::string::npos)
        << r[i].ToString();
  }
  EXPECT_NE(r[4].message().find("did not finish"), std::string::npos) << r[4].ToString();

  OpenOptions o;
  o.probe_timeout_ms = 4000;
  auto crash = Dataset::Open(cve + "/cve-2018-16438.h5", o);
  ASSERT_FALSE(crash.ok());
  EXPECT_EQ(crash.status().code(), StatusCode::kCorrupt) << crash.status().ToString();
  EXPECT_NE(crash.status().message().find("cve-2018-16438.h5"), std::string::npos) << crash.status().ToString();
}

// cve-2018-15671 hangs HDF5 in the probe child's own listing of the file's
// datasets (a "no such dataset" error, listed in a grandchild). The parent's
// limit decides: here the child's options would give the listing less time
// than the parent's limit, as a parent late to wake on a loaded machine did
// (the listing gave up first, the child finished the spec, the probe passed
// the file, and `gpufeed inspect` then hung 10 s more listing it itself).
TEST(HostileFilesTest, AHangInTheProbesListingIsTheProbesVerdict) {
  const std::string file = CorpusData() + "/hdf5-cve/cve-2018-15671.h5";
  ASSERT_TRUE(std::filesystem::exists(file)) << "no " << file << " (tests/corpus/data is in the repository)";
  ProbeOptions po;
  po.timeout_ms = 1000;
  po.open.probe_timeout_ms = 100;
  po.processes = 1;
  const std::vector<Status> r = ProbeFiles({file}, po);
  ASSERT_EQ(r.size(), 1u);
  ASSERT_FALSE(r[0].ok()) << "the probe passed a file whose listing hangs HDF5";
  EXPECT_EQ(r[0].code(), StatusCode::kCorrupt) << r[0].ToString();
  // (Under a sanitizer's allocator HDF5 may crash on it instead: contained too.)
  EXPECT_TRUE(r[0].message().find("did not finish reading this file's metadata") != std::string::npos ||
              r[0].message().find("HDF5 crashed reading this file's metadata") != std::string::npos)
      << r[0].ToString();
}

// The "no such dataset" error lists the file's datasets. That walk reads
// every object header, which the probe's open does not, and HDF5 has
// overflowed its heap on it (CVE-2018-13869, -13870, -13871, -16438: the probe survived, the
// caller's next free aborted). The listing runs in a child process: a good
// file still gets its list, a hostile one a Corrupt error, a hang a time limit.
TEST(HostileFilesTest, ListingDatasetsForAnErrorCannotCrashTheCaller) {
  const std::string dir = testing::MakeTempDir("listing");
  const std::string good = dir + "/good.h5";
  WriteSparse(good, {10, 8}, {5, 8}, 10);
  auto missing = Dataset::Open(good + ":/nope", {});
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("(the file has: /images;"), std::string::npos)
      << missing.status().ToString();
  auto listed = ListDatasetsIsolated(good, 5000);
  ASSERT_TRUE(listed.ok()) << listed.status().ToString();
  EXPECT_EQ(*listed, std::vector<std::string>{"/images"});

  // A FIFO with no writer: HDF5's open blocks, the time limit ends it.
  const std::string fifo = dir + "/fifo.h5";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  const auto t0 = std::chrono::steady_clock::now();
  auto hung = ListDatasetsIsolated(fifo, 300);
  EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(10));
  ASSERT_FALSE(hung.ok());
  EXPECT_EQ(hung.status().code(), StatusCode::kCorrupt);
  EXPECT_NE(hung.status().message().find("did not finish listing"), std::string::npos) << hung.status().ToString();

  const std::string cve = CorpusData() + "/hdf5-cve";
  ASSERT_TRUE(std::filesystem::exists(cve)) << "no " << cve << " (tests/corpus/data is in the repository)";
  OpenOptions o;
  o.probe_timeout_ms = 4000;
  // Whether HDF5 crashes on a damaged heap depends on the process's memory
  // layout: cve-2018-13869 and -13870 crashed the listing in earlier builds
  // and list no dataset in this one (as in a small C program against
  // Debian's HDF5 1.10.8). Either way the caller gets an error
  // naming the file; a crash or hang stays in the child, and at least one of
  // the four still takes that path (cve-2018-13871 corrupts malloc's heap).
  int contained = 0;
  for (const char* name : {"cve-2018-13869.h5", "cve-2018-13870.h5", "cve-2018-13871.h5", "cve-2018-16438.h5"}) {
    auto ds = Dataset::Open(cve + "/" + name, o);
    ASSERT_FALSE(ds.ok()) << name;
    const std::string& m = ds.status().message();
    EXPECT_NE(m.find(name), std::string::npos) << ds.status().ToString();
    if (ds.status().code() == StatusCode::kNotFound) {
      EXPECT_NE(m.find("no such dataset (the file has: no datasets"), std::string::npos) << ds.status().ToString();
      continue;
    }
    EXPECT_EQ(ds.status().code(), StatusCode::kCorrupt) << ds.status().ToString();
    // The listing's child takes it (crash or hang); under a sanitizer's
    // allocator the probe's child may hang on the same file first.
    EXPECT_TRUE(m.find("HDF5 crashed listing") != std::string::npos ||
                m.find("did not finish listing") != std::string::npos ||
                m.find("HDF5 crashed reading this file's metadata") != std::string::npos ||
                m.find("did not finish reading this file's metadata") != std::string::npos)
        << ds.status().ToString();
    ++contained;
  }
  EXPECT_GE(contained, 1);
}

// One answer to "is the probe skipped?" for every kind of source (encoded
// images ignored the environment, and `gpufeed --trust-files`, which sets it).
TEST(HostileFilesTest, TrustComesFromTheOptionOrTheEnvironment) {
  ::unsetenv("GPUFEED_TRUST_FILES");
  OpenOptions o;
  EXPECT_FALSE(TrustFiles(o));
  o.trust_files = true;
  EXPECT_TRUE(TrustFiles(o));
  o.trust_files = false;
  ::setenv("GPUFEED_TRUST_FILES", "1", 1);
  EXPECT_TRUE(TrustFiles(o));
  ::setenv("GPUFEED_TRUST_FILES", "0", 1);
  EXPECT_FALSE(TrustFiles(o));
  ::unsetenv("GPUFEED_TRUST_FILES");
  // Trusted: a FIFO nobody writes is not probed (the probe would hang on it
  // for the time limit); untrusted, the probe's limit ends the wait.
  const std::string fifo = testing::MakeTempDir("trust") + "/fifo.h5";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  o.trust_files = true;
  auto trusted = Probe(fifo, o);
  ASSERT_TRUE(trusted.ok()) << trusted.status().ToString();
  EXPECT_EQ(trusted->text(), fifo + ":/images");  // issued in the form FieldSource keys by
  o.trust_files = false;
  o.probe_timeout_ms = 300;
  auto probed = Probe(fifo, o);
  ASSERT_FALSE(probed.ok());
  EXPECT_EQ(probed.status().code(), StatusCode::kCorrupt) << probed.status().ToString();
}

// A probe forked while another thread reads through HDF5 (the hdf5 path):
// HDF5's threadsafe build has one global lock, and a child forked while a
// reader holds it waits for it forever. Good files must not read as hanging.
TEST(HostileFilesTest, ProbesForkedBesideHdf5ReadersDoNotHang) {
#if defined(__has_feature)
#if __has_feature(address_sanitizer)
#define GPUFEED_TEST_UNDER_ASAN 1
#endif
#endif
#if defined(__SANITIZE_ADDRESS__) || defined(GPUFEED_TEST_UNDER_ASAN)
  // clang 14's ASan allocator is not fork-safe: a child forked while a
  // reader thread allocates waits on the allocator's lock (1 of 12 probes,
  // at any time limit, also before this round's changes, 6 of 6 runs alone);
  // glibc's malloc, which gpufeed ships with, locks around fork.
  // docs/reliability.md names it; the normal and TSan passes run this test.
  GTEST_SKIP() << "ASan's allocator is not fork-safe beside allocating threads (clang 14)";
#endif
  const std::string dir = testing::MakeTempDir("forkgate");
  const uint64_t n = 512, sb = 16384;
  const auto bytes = testing::IndexSamples(n, sb);
  testing::H5Layout layout;
  layout.chunk = {8, sb};
  layout.deflate = 1;
  ASSERT_TRUE(testing::WriteH5(dir + "/busy.h5", {n, sb}, H5T_NATIVE_UINT8, bytes, layout));
  const std::string good = dir + "/good.h5";
  WriteSparse(good, {10, 8}, {5, 8}, 10);
  OpenOptions ro;
  ro.trust_files = true;
  ro.force_hdf5_path = true;
  auto busy = Dataset::Open(dir + "/busy.h5", ro);
  ASSERT_TRUE(busy.ok()) << busy.status().ToString();
  std::atomic<bool> stop{false};
  std::vector<std::thread> readers;
  for (int t = 0; t < 2; ++t) {
    readers.emplace_back([&] {
      std::vector<std::byte> buf(64 * sb);
      for (uint64_t i = 0; !stop.load(); i = (i + 64) % n) (void)busy->ReadSamples(i, 64, buf);
    });
  }
  ProbeOptions po;
  po.timeout_ms = 1500;
  po.processes = 1;
  int hung = 0;
  for (int k = 0; k < 12; ++k) {
    const Status s = ProbeFiles({good}, po)[0];
    if (!s.ok()) ++hung;
  }
  stop = true;
  for (auto& t : readers) t.join();
  EXPECT_EQ(hung, 0) << "of 12 probes of a good file, " << hung << " hung";
}

}  // namespace
}  // namespace gpufeed
