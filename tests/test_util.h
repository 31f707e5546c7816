// Helpers shared by the test binaries.
#pragma once

#include <gtest/gtest.h>

#include <filesystem>
#include <functional>
#include <string>
#include <vector>

#include "engine/errors.h"

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

}  // namespace ddp::testing
