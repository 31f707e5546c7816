// The run-time loading of the GPU path's libraries (engine/base/runtime_library.h): the first candidate that
// loads wins, a missing library is named with the loader's words, and a stand-in returns its "missing" value.
#include "engine/base/runtime_library.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace ddp::base {
namespace {

TEST(RuntimeLibrary, AMissingLibraryIsNamedWithTheLoadersWords) {
  const RuntimeLibrary library({"libddptrain_nowhere.so.7", "/nowhere/libddptrain_nowhere.so.7"});
  EXPECT_FALSE(library.loaded());
  EXPECT_EQ(library.name(), "libddptrain_nowhere.so.7");
  // The first candidate's reason: the fallback's "no such file" would only repeat it.
  EXPECT_EQ(library.why_not_loaded().rfind("libddptrain_nowhere.so.7 could not be loaded (", 0), 0u)
      << library.why_not_loaded();
  EXPECT_NE(library.why_not_loaded().find("cannot open shared object file"), std::string::npos);
  EXPECT_EQ(library.symbol("cos"), nullptr);
}

TEST(RuntimeLibrary, TheFirstCandidateThatLoadsIsUsed) {
  const RuntimeLibrary library({"libddptrain_nowhere.so.7", "libm.so.6"});
  ASSERT_TRUE(library.loaded()) << library.why_not_loaded();
  EXPECT_TRUE(library.why_not_loaded().empty());
  EXPECT_NE(library.symbol("cos"), nullptr);
  EXPECT_EQ(library.symbol("ddptrain_no_such_symbol"), nullptr);
}

// Stand-ins named like the library's functions, as models/cudnn_library.cpp defines them.
double present_cos(double x) {
  static const RuntimeLibrary libm({"libm.so.6"});
  return call_loaded<&present_cos>(libm, "cos", -2.0, x);
}
double absent_cos(double x) {
  static const RuntimeLibrary nowhere({"libddptrain_nowhere.so.7"});
  return call_loaded<&absent_cos>(nowhere, "cos", -2.0, x);
}
double misnamed_cos(double x) {
  static const RuntimeLibrary libm({"libm.so.6"});
  return call_loaded<&misnamed_cos>(libm, "ddptrain_no_such_symbol", -2.0, x);
}

TEST(RuntimeLibrary, AStandInCallsTheLibraryOrReturnsItsMissingValue) {
  EXPECT_DOUBLE_EQ(present_cos(0.5), std::cos(0.5));
  EXPECT_EQ(absent_cos(0.5), -2.0);
  EXPECT_EQ(misnamed_cos(0.5), -2.0);
}

}  // namespace
}  // namespace ddp::base
