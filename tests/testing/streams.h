// Helpers for tests that play a consumer of an EpochStream.
#ifndef GPUFEED_TESTS_TESTING_STREAMS_H_
#define GPUFEED_TESTS_TESTING_STREAMS_H_

#include <gtest/gtest.h>

#include <vector>

#include "gpufeed/loader.h"

namespace gpufeed::testing {

// Takes the next `n` batches of `s` and keeps them, as a consumer holding
// them would; a failure or an early end is a test failure.
inline std::vector<Batch> HoldBatches(EpochStream& s, int n) {
  std::vector<Batch> held;
  for (int i = 0; i < n; ++i) {
    auto b = s.Next();
    if (!b.ok() || !b->has_value()) {
      ADD_FAILURE() << "batch " << i << ": " << (b.ok() ? std::string("end of epoch") : b.status().ToString());
      break;
    }
    held.push_back(std::move(**b));
  }
  return held;
}

}  // namespace gpufeed::testing

#endif  // GPUFEED_TESTS_TESTING_STREAMS_H_
