// MakeImageDecoder: the host's image decoder behind the loader's decode stage.
#include <string>

#include "gpufeed/decode_options.h"
#include "gpufeed/sample_decoder.h"
#include "hdf5io/image/image_decode.h"

namespace gpufeed {
namespace {

class ImageDecoder final : public SampleDecoder {
 public:
  explicit ImageDecoder(const DecodeOptions& decode) : decode_(decode) {}

  std::string name() const override {
    return "image decoder " + std::to_string(decode_.height) + "x" + std::to_string(decode_.width) + " " +
           decode_.layout + " " + std::string(ImageTransformName(decode_.transform));
  }
  uint64_t sample_bytes() const override { return uint64_t(3) * decode_.height * decode_.width; }
  bool replaces_corrupt() const override { return decode_.skip_corrupt; }

  Status Decode(std::span<const std::byte> encoded, uint64_t sample, const DecodeContext& context,
                std::span<std::byte> dst) const override {
    if (dst.size() != sample_bytes()) {
      return Status::Internal(name() + ": a destination of " + std::to_string(dst.size()) + " bytes, expected " +
                              std::to_string(sample_bytes()));
    }
    return image::DecodeTransform(std::span(reinterpret_cast<const uint8_t*>(encoded.data()), encoded.size()), decode_,
                                  image::RandomKey(context.seed, context.epoch, sample),
                                  reinterpret_cast<uint8_t*>(dst.data()));
  }

  Status PlanDevice(std::span<const std::byte> encoded, uint64_t sample, const DecodeContext& context,
                    DevicePlan* plan) const override {
    *plan = DevicePlan{};
    image::JpegInfo info;
    if (!image::ReadJpegInfo(std::span(reinterpret_cast<const uint8_t*>(encoded.data()), encoded.size()), &info).ok()) {
      plan->why_not = "not a JPEG the header reader takes";  // a PNG, or corrupt: Decode says which
      return Status::Ok();
    }
    const char* why = image::DeviceUndecodableReason(info);
    plan->device_decodable = why == nullptr;
    if (why != nullptr) plan->why_not = why;
    plan->height = info.height;
    plan->width = info.width;
    plan->crop =
        image::PlanCrop(info.height, info.width, decode_, image::RandomKey(context.seed, context.epoch, sample));
    return Status::Ok();
  }

 private:
  const DecodeOptions decode_;
};

}  // namespace

Result<std::shared_ptr<const SampleDecoder>> MakeImageDecoder(const DecodeOptions& decode) {
  GPUFEED_RETURN_IF_ERROR(ValidateDecodeOptions(decode));
  return std::shared_ptr<const SampleDecoder>(std::make_shared<ImageDecoder>(decode));
}

}  // namespace gpufeed
