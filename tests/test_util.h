// Helpers shared by the test binaries.
#pragma once

#include <gtest/gtest.h>

#include <cstdint>
#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "engine/base/errors.h"
#include "models/param_layout.h"

namespace ddp::testing {

// A fresh directory under the system temp dir, removed when the object dies.
class TempDir {
 public:
  TempDir();
  ~TempDir();
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::filesystem::path& path() const { return path_; }
  std::string file(const std::string& name) const { return (path_ / name).string(); }

 private:
  std::filesystem::path path_;
};

// Writes `text` to the file `name` in `dir`; returns its path.
std::string write_text(const TempDir& dir, const std::string& name, const std::string& text);

// Runs `action`, expects a UserError whose one-line message contains every one of `parts`.
inline void expect_user_error(const std::function<void()>& action, const std::vector<std::string>& parts) {
  try {
    action();
    ADD_FAILURE() << "no UserError thrown";
  } catch (const UserError& e) {
    const std::string message = e.what();
    EXPECT_EQ(message.find('\n'), std::string::npos) << message;
    for (const std::string& part : parts) EXPECT_NE(message.find(part), std::string::npos) << message;
  }
}

// Whether AddressSanitizer is built in: its allocator ends the process on a request larger than any memory
// instead of throwing std::bad_alloc, so a test of that path skips there.
#if defined(__SANITIZE_ADDRESS__)
inline constexpr bool kAddressSanitizer = true;
#elif defined(__has_feature)
inline constexpr bool kAddressSanitizer = __has_feature(address_sanitizer);
#else
inline constexpr bool kAddressSanitizer = false;
#endif

// Keras's initialization with random biases on top, so that every gate's bias differs (a bias mapped to the
// wrong gate shows) and bias gradients are not a special case.
std::vector<float> test_params(const models::ParamLayout& layout, uint64_t seed);

}  // namespace ddp::testing
