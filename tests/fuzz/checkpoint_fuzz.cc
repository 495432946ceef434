// Fuzz target: the checkpoint reader (trainer/checkpoint.h LoadCheckpoint)
// behind `gpufeed train --resume`, into a small CPU mlp. A checkpoint's
// payload is behind an XXH64 checksum that random bytes never match, so in
// even modes (first input byte) the rest of the input is the payload and the
// target writes a valid header for it; odd modes take the rest as the whole
// file. A load that succeeds must have matched the expected model, and its
// config must fit the expected one (CheckResumeConfig: another batch split
// of the same global batch fits).
#include <xxhash.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <string>

#include "tests/fuzz/checkpoint_fixture.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gpufeed::trainer;
  static gpufeed::fuzz::MemFile file;
  static CheckpointFixture f;
  if (size == 0) return 0;
  std::string bytes;
  if ((data[0] & 1) == 0) {  // the payload, behind a header that matches it
    const uint64_t n = size - 1, hash = XXH64(data + 1, n, 0);
    const uint32_t version = kCheckpointVersion, zero = 0;
    bytes.assign("GPFDCKPT", 8);
    bytes.append(reinterpret_cast<const char*>(&version), 4);
    bytes.append(reinterpret_cast<const char*>(&zero), 4);
    bytes.append(reinterpret_cast<const char*>(&n), 8);
    bytes.append(reinterpret_cast<const char*>(&hash), 8);
  }
  bytes.append(reinterpret_cast<const char*>(data + 1), size - 1);
  file.Set(reinterpret_cast<const uint8_t*>(bytes.data()), bytes.size());
  CheckpointMeta meta;
  if (LoadCheckpoint(file.Path(), f.ops.get(), f.model.get(), f.expect, &meta).ok()) {
    GPUFEED_FUZZ_CHECK(meta.model == f.expect.model &&
                       CheckResumeConfig(file.Path(), meta.config, f.expect.config).ok());
  }
  return 0;
}
