// Fuzz target: LoaderState::Deserialize, which reads a resume position from a
// checkpoint or a client. A state that deserializes serializes back to the
// same bytes (the format has one encoding per state).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "gpufeed/loader.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto s = gpufeed::LoaderState::Deserialize(bytes);
  if (s.ok()) GPUFEED_FUZZ_CHECK(s->Serialize() == bytes);
  return 0;
}
