// CropRect: a crop in an image's pixels. The host decoder plans it
// (hdf5io/image, PlanCrop), a DevicePlan and an EncodedSample carry it, and
// the device decoder's resample takes it (gpu/resize_crop.h): one type, copied
// whole, from the plan to the kernel.
#ifndef GPUFEED_CROP_RECT_H_
#define GPUFEED_CROP_RECT_H_

#include <cstdint>

namespace gpufeed {

// Rows [top, top + height), columns [left, left + width).
struct CropRect {
  int32_t top = 0, left = 0, height = 0, width = 0;
};
constexpr bool operator==(const CropRect& a, const CropRect& b) {
  return a.top == b.top && a.left == b.left && a.height == b.height && a.width == b.width;
}

}  // namespace gpufeed

#endif  // GPUFEED_CROP_RECT_H_
