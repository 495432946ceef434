// Class values of any integer dtype as int64 labels: one conversion for the
// feed's class fields and the trainer's labels field (OpenClassifierSource).
#ifndef GPUFEED_COMMON_CLASSES_H_
#define GPUFEED_COMMON_CLASSES_H_

#include <cstddef>
#include <cstdint>
#include <span>

#include "gpufeed/dtype.h"
#include "gpufeed/status.h"

namespace gpufeed {

// The first n values of `column` (elements of integer dtype t) into out[0..n);
// a uint64 past int64's range is an error, not a wrap.
Status ClassesToInt64(std::span<const std::byte> column, DType t, uint64_t n, int64_t* out);

}  // namespace gpufeed

#endif  // GPUFEED_COMMON_CLASSES_H_
