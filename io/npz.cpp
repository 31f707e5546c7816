#include "io/npz.h"

#include <utility>

#include "io/binary_fields.h"

namespace ddp::io {

using binary::fail;

NpzFile::NpzFile(const std::string& path) : zip_(ZipArchive::read_file(path)) {}

std::vector<std::string> NpzFile::array_names() const {
  std::vector<std::string> names;
  for (const std::string& member : zip_.member_names()) {
    if (member.size() > 4 && member.ends_with(".npy")) names.push_back(member.substr(0, member.size() - 4));
  }
  return names;
}

NpyArray NpzFile::array(const std::string& name) const {
  const std::string member = name + ".npy";
  if (!zip_.contains(member)) {
    std::string present;
    for (const std::string& other : array_names()) present += (present.empty() ? "" : ", ") + other;
    fail(path(), "missing array '" + name + "' (the file has: " + (present.empty() ? "none" : present) + ")");
  }
  const std::vector<uint8_t> bytes = zip_.read(member);
  return parse_npy(bytes, path() + ": " + member);
}

}  // namespace ddp::io
