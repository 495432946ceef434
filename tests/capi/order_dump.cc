// gpufeed_order_dump: prints the batches a C++ Loader delivers for given
// options, one line per batch: "index;sample indices;labels;FNV-1a 64 of the
// images bytes". The Python tests compare the C API + Python path with it:
// the same options must give the same batches, byte for byte.
//
// Usage: gpufeed_order_dump DATA EPOCH START_BATCH BATCH_SIZE ORDER SEED THREADS PREFETCH WINDOW RANK WORLD DROP_LAST
#include <cstdio>
#include <cstdlib>
#include <string>

#include "gpufeed/open_source.h"

int main(int argc, char** argv) {
  if (argc != 13) {
    std::fprintf(stderr,
                 "usage: %s DATA EPOCH START_BATCH BATCH_SIZE ORDER SEED THREADS PREFETCH WINDOW RANK WORLD "
                 "DROP_LAST\n",
                 argv[0]);
    return 2;
  }
  gpufeed::SourceOptions so;
  so.data = argv[1];
  const uint64_t epoch = std::strtoull(argv[2], nullptr, 10), start = std::strtoull(argv[3], nullptr, 10);
  so.loader.batch_size = std::strtoull(argv[4], nullptr, 10);
  auto order = gpufeed::OrderFromName(argv[5]);
  if (!order.ok()) {
    std::fprintf(stderr, "%s\n", order.status().ToString().c_str());
    return 2;
  }
  so.loader.order = *order;
  so.loader.seed = std::strtoull(argv[6], nullptr, 10);
  so.loader.threads = std::atoi(argv[7]);
  so.loader.prefetch = std::atoi(argv[8]);
  so.loader.shuffle_window = std::strtoull(argv[9], nullptr, 10);
  so.loader.rank = std::atoi(argv[10]);
  so.loader.world_size = std::atoi(argv[11]);
  so.loader.drop_last = std::atoi(argv[12]) != 0;
  auto src = gpufeed::OpenBatchSource(so);
  if (!src.ok()) {
    std::fprintf(stderr, "%s\n", src.status().ToString().c_str());
    return 1;
  }
  gpufeed::EpochStream stream = (*src)->source().Epoch(epoch, start);
  for (;;) {
    auto b = stream.Next();
    if (!b.ok()) {
      std::fprintf(stderr, "%s\n", b.status().ToString().c_str());
      return 1;
    }
    if (!b->has_value()) break;
    const gpufeed::Batch& batch = **b;
    std::string line = std::to_string(batch.index()) + ";";
    for (size_t i = 0; i < batch.indices().size(); ++i) line += (i ? "," : "") + std::to_string(batch.indices()[i]);
    line += ";";
    for (size_t i = 0; i < batch.labels().size(); ++i) line += (i ? "," : "") + std::to_string(batch.labels()[i]);
    uint64_t h = 0xcbf29ce484222325ull;
    for (std::byte x : batch.images()) h = (h ^ static_cast<uint8_t>(x)) * 0x100000001b3ull;
    std::printf("%s;%016llx\n", line.c_str(), static_cast<unsigned long long>(h));
  }
  return 0;
}
