// Writes a dataset whose bytes encode their sample index, reads it back through
// the installed C++ library (Dataset + Loader), and checks every sample.
#include <cstdio>
#include <cstring>
#include <string>
#include <vector>

#include "gpufeed/dataset.h"
#include "gpufeed/loader.h"
#include "gpufeed/version.h"
#include "gpufeed/writer.h"

int main(int argc, char** argv) {
  if (argc != 2) return 2;
  const std::string path = argv[1];
  const uint64_t n = 100, sample = 16;
  auto w = gpufeed::DatasetWriter::Create(path, {sample}, gpufeed::DType::kUInt8, n, {.chunk_samples = 10});
  if (!w.ok()) {
    std::fprintf(stderr, "%s\n", w.status().ToString().c_str());
    return 1;
  }
  std::vector<std::byte> bytes(n * sample);
  std::vector<int64_t> labels(n);
  for (uint64_t i = 0; i < n; ++i) {
    std::memset(bytes.data() + i * sample, static_cast<int>(i), sample);
    labels[i] = static_cast<int64_t>(i % 7);
  }
  for (uint64_t c = 0; c < w->num_chunks(); ++c) {
    gpufeed::DatasetWriter::EncodedChunk chunk;
    std::span<const std::byte> part(bytes.data() + c * 10 * sample, 10 * sample);
    if (!w->EncodeChunk(c, part, &chunk).ok() || !w->WriteChunk(c, chunk).ok()) return 1;
  }
  if (!w->WriteLabels(labels).ok() || !w->Commit().ok()) return 1;

  auto ds = gpufeed::Dataset::Open(path);
  if (!ds.ok()) {
    std::fprintf(stderr, "%s\n", ds.status().ToString().c_str());
    return 1;
  }
  gpufeed::Loader loader(*ds, {.batch_size = 32, .order = gpufeed::Order::kRandom, .seed = 3, .threads = 2});
  std::vector<int> seen(n, 0);
  for (const gpufeed::Batch& b : loader.Epoch(0)) {
    for (uint64_t k = 0; k < b.size(); ++k) {
      const uint64_t i = b.indices()[k];
      const auto* p = reinterpret_cast<const unsigned char*>(b.images().data()) + k * sample;
      if (i >= n || p[0] != i || p[sample - 1] != i || b.labels()[k] != static_cast<int64_t>(i % 7)) {
        std::fprintf(stderr, "sample %llu wrong\n", static_cast<unsigned long long>(i));
        return 1;
      }
      ++seen[i];
    }
  }
  for (uint64_t i = 0; i < n; ++i) {
    if (seen[i] != 1) {
      std::fprintf(stderr, "sample %llu seen %d times\n", (unsigned long long)i, seen[i]);
      return 1;
    }
  }
  std::printf("cpp_app: gpufeed %s, %llu samples read back, each once\n", GPUFEED_VERSION,
              static_cast<unsigned long long>(n));
  return 0;
}
