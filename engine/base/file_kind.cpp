#include "engine/base/file_kind.h"

#include <filesystem>
#include <system_error>

namespace ddp {
namespace {

std::string kind_name(const std::filesystem::file_status& status) {
  switch (status.type()) {
    case std::filesystem::file_type::directory:
      return "a directory";
    case std::filesystem::file_type::fifo:
      return "a named pipe";
    case std::filesystem::file_type::block:
    case std::filesystem::file_type::character:
      return "a device";
    case std::filesystem::file_type::socket:
      return "a socket";
    case std::filesystem::file_type::unknown:
      return "a file of unknown kind";
    default:  // regular, a symbolic link (not followed), absent
      return "";
  }
}

}  // namespace

std::string special_file_kind(const std::string& path, bool follow_links) {
  std::error_code error;
  const std::filesystem::file_status status =
      follow_links ? std::filesystem::status(path, error) : std::filesystem::symlink_status(path, error);
  return error ? "" : kind_name(status);
}

}  // namespace ddp
