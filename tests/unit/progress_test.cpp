// Progress lines and their sizes (engine/base/progress.h).
#include <gtest/gtest.h>

#include "engine/base/progress.h"

namespace ddp::engine {
namespace {

// Sizes in messages: three digits and a unit, never 6.12e-05 GB.
TEST(Progress, SizesForAPerson) {
  EXPECT_EQ(progress::bytes_text(0), "0 B");
  EXPECT_EQ(progress::bytes_text(812), "812 B");
  EXPECT_EQ(progress::bytes_text(61240), "61.2 kB");
  EXPECT_EQ(progress::bytes_text(999999), "1.00 MB");
  EXPECT_EQ(progress::bytes_text(12.34e6), "12.3 MB");
  EXPECT_EQ(progress::bytes_text(1.5e9), "1.50 GB");
  EXPECT_EQ(progress::bytes_text(3e18), "3000 PB");
}

}  // namespace
}  // namespace ddp::engine
