// DecodeOptions: what an encoded image becomes (size, layout, the crop of
// training or evaluation, what to do with one that does not decode). The
// image decoders (gpufeed/sample_decoder.h, image/) and the encoded sources
// (gpufeed/encoded.h) take it.
#ifndef GPUFEED_DECODE_OPTIONS_H_
#define GPUFEED_DECODE_OPTIONS_H_

#include <cstdint>
#include <string>
#include <string_view>

#include "gpufeed/names.h"
#include "gpufeed/status.h"

namespace gpufeed {

// ImageTransform and its names: gpufeed/names.h.

struct DecodeOptions {
  uint32_t height = 224, width = 224;             // output size, 1..32768
  std::string layout{LayoutName(Layout::kNCHW)};  // a Layout's name (LayoutFromName); 3 channels (RGB) always
  ImageTransform transform = ImageTransform::kRandomResizedCrop;
  double scale_min = 0.08, scale_max = 1.0;             // torchvision's defaults
  double ratio_min = 3.0 / 4.0, ratio_max = 4.0 / 3.0;  // torchvision's defaults
  double center_fraction = 0.875;                       // 224 of 256, the ImageNet eval convention
  // false: a corrupt image fails the batch with an error naming the sample.
  // true: it is replaced by the next sample of its chunk that decodes (the
  // batch keeps its size; its index and label are the replacement's), counted
  // in LoaderStats::skipped_samples and logged to stderr each time (so once
  // per epoch for a corrupt file).
  bool skip_corrupt = false;
};
// Checks ranges; InvalidArgument names the option and the valid range.
Status ValidateDecodeOptions(const DecodeOptions& options);

}  // namespace gpufeed

#endif  // GPUFEED_DECODE_OPTIONS_H_
