// Fuzz target: the daemon's wire decoders (loader/remote/protocol.h), which read
// bytes from any peer that can connect. The first input byte picks the
// decoder, the rest is the frame header or payload (HELLO with its decode
// options, reshard and defer_decode, HELLO_OK with its fields and encoded
// batches, a batch's encoded-sample table: protocol version 5). Besides the sanitizers,
// every message that decodes must survive a re-encode: Encode(Decode(x))
// decodes again, to the same bytes when encoded once more.
#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "loader/remote/protocol.h"
#include "tests/fuzz/fuzz_util.h"

namespace gpufeed::daemon {
namespace {

template <typename T, typename Enc, typename Dec>
void CheckStable(const T& m, Enc encode, Dec decode) {
  const std::vector<std::byte> once = encode(m);
  auto again = decode(std::span<const std::byte>(once));
  GPUFEED_FUZZ_CHECK(again.ok());
  GPUFEED_FUZZ_CHECK(encode(*again) == once);
}

}  // namespace
}  // namespace gpufeed::daemon

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using namespace gpufeed::daemon;
  gpufeed::fuzz::Input in(data, size);
  const uint8_t which = in.U8();
  const std::span<const std::byte> p = in.Rest();
  switch (which % 12) {
    case 0: {  // a frame: header checks, then the checksum over the payload
      if (p.size() < kHeaderBytes) break;
      std::span<const std::byte, kHeaderBytes> hb(p.data(), kHeaderBytes);
      auto h = ParseHeader(hb, kMaxControlPayload, kMaxControlPayload, "fuzz");
      if (!h.ok()) break;
      GPUFEED_FUZZ_CHECK(h->payload_bytes <= kMaxControlPayload && h->raw_bytes <= kMaxControlPayload);
      const auto payload = p.subspan(kHeaderBytes);
      if (payload.size() < h->payload_bytes) break;
      (void)VerifyChecksum(*h, hb, payload.first(h->payload_bytes), "fuzz");
      break;
    }
    case 1:
      if (auto m = DecodeHello(p); m.ok()) CheckStable(*m, EncodeHello, DecodeHello);
      break;
    case 2:
      if (auto m = DecodeHelloOk(p); m.ok()) {
        CheckStable(*m, EncodeHelloOk, DecodeHelloOk);
        // Version 3's fields: 1 to kMaxFields, laid end to end over the sample.
        GPUFEED_FUZZ_CHECK(!m->info.fields.empty() && m->info.fields.size() <= kMaxFields);
        uint64_t offset = 0;
        for (const gpufeed::FieldInfo& f : m->info.fields) {
          GPUFEED_FUZZ_CHECK(f.offset == offset && f.sample_bytes > 0);
          offset += f.sample_bytes;
        }
        GPUFEED_FUZZ_CHECK(offset == m->info.sample_bytes);
      }
      break;
    case 3:
      if (auto m = DecodeCredit(p); m.ok()) CheckStable(*m, EncodeCredit, DecodeCredit);
      break;
    case 4:
      if (auto m = DecodeBatchFixed(p); m.ok()) {
        GPUFEED_FUZZ_CHECK(p.size() >= BatchHead::kFixedBytes);
      }
      break;
    case 5:
      if (auto m = DecodeBatchRef(p); m.ok()) {
        GPUFEED_FUZZ_CHECK(m->payload_bytes() == p.size() && m->head.count <= kMaxBatchSize);
      }
      break;
    case 6:
      if (auto m = DecodeSlots(p); m.ok()) {
        GPUFEED_FUZZ_CHECK(!m->empty() && m->size() <= kMaxShmSlots);
        auto encode = [](const std::vector<uint32_t>& v) { return EncodeSlots(v); };
        CheckStable(*m, encode, DecodeSlots);
      }
      break;
    case 7:
      if (auto m = DecodeEnd(p); m.ok()) CheckStable(*m, EncodeEnd, DecodeEnd);
      break;
    case 8:
      if (auto m = DecodeError(p); m.ok()) CheckStable(*m, EncodeError, DecodeError);
      break;
    case 9: {  // a zstd payload of a claimed raw size (bounded as the header bounds it)
      gpufeed::fuzz::Input sz(reinterpret_cast<const uint8_t*>(p.data()), p.size());
      std::vector<std::byte> dst(sz.U16());
      (void)Decompress(p.size() >= 2 ? p.subspan(2) : p.subspan(p.size()), dst, "fuzz");
      break;
    }
    case 11: {  // an encoded table: u16 count, u16 sample_bytes, u16 slot_bytes / 256, then the entries
      gpufeed::fuzz::Input t(reinterpret_cast<const uint8_t*>(p.data()), p.size());
      const uint32_t count = t.U16();
      const uint64_t sample_bytes = t.U16();
      const uint64_t slot_bytes = uint64_t{t.U16()} << 8;
      std::vector<gpufeed::EncodedSample> table;
      auto end = DecodeEncodedTable(t.Rest(), count, sample_bytes, slot_bytes, &table);
      if (!end.ok()) break;
      // Accepted: in slot order, none overlapping, each inside the slot and its image.
      GPUFEED_FUZZ_CHECK(table.size() == count && *end == EncodedTableEnd(table, sample_bytes) && *end <= slot_bytes);
      uint64_t at = 0;
      for (const gpufeed::EncodedSample& e : table) {
        GPUFEED_FUZZ_CHECK(e.offset >= at);
        at = e.offset + (e.bytes > 0 ? e.bytes : sample_bytes);
        GPUFEED_FUZZ_CHECK(at <= slot_bytes);
        if (e.bytes > 0) {
          GPUFEED_FUZZ_CHECK(e.crop.top >= 0 && e.crop.left >= 0 && e.crop.height > 0 && e.crop.width > 0 &&
                             e.crop.top + e.crop.height <= e.height && e.crop.left + e.crop.width <= e.width);
        }
      }
      break;
    }
    case 10: {  // the constant-time compare agrees with ==
      const std::string_view all(reinterpret_cast<const char*>(p.data()), p.size());
      const std::string_view a = all.substr(0, all.size() / 2), b = all.substr(all.size() / 2);
      GPUFEED_FUZZ_CHECK(ConstantTimeEquals(a, b) == (a == b));
      break;
    }
  }
  return 0;
}
