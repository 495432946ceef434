// Fuzz target: LoaderState::Deserialize, which reads a resume position from a
// checkpoint or a client. A state that deserializes serializes back to the
// same bytes (the current version, 3, has one encoding per state); an older
// one (1: no shard fields; 2: no order or dataset size) serializes as the
// current version, which reads back to the same state.
#include <cstddef>
#include <cstdint>
#include <string>
#include <string_view>

#include "gpufeed/loader.h"
#include "tests/fuzz/fuzz_util.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string_view bytes(reinterpret_cast<const char*>(data), size);
  auto s = gpufeed::LoaderState::Deserialize(bytes);
  if (!s.ok()) return 0;
  const std::string again = s->Serialize();
  if (static_cast<uint8_t>(bytes[8]) == 3) {
    GPUFEED_FUZZ_CHECK(again == bytes);
    return 0;
  }
  auto t = gpufeed::LoaderState::Deserialize(again);
  GPUFEED_FUZZ_CHECK(t.ok());
  GPUFEED_FUZZ_CHECK(t->seed == s->seed && t->epoch == s->epoch && t->next_batch == s->next_batch);
  GPUFEED_FUZZ_CHECK(t->world_size == s->world_size && t->share == s->share && t->consumed == s->consumed);
  GPUFEED_FUZZ_CHECK(!t->order && t->num_samples == 0 && t->Serialize() == again);
  return 0;
}
