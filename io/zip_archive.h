// Zip archives as np.savez writes them, every byte parsed here (zlib only inflates and computes CRC-32): the
// end-of-central-directory record (and its ZIP64 form), the central directory and local headers; members
// stored (method 0) or deflated (method 8); ZIP64 extra fields (numpy writes each member with force_zip64,
// and sizes may then live only there); every member's CRC-32 is checked.
// Malformed input of any kind is a UserError "FILE: MEMBER: what is wrong", on one line.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace ddp::io {

// A zip archive held in memory.
class ZipArchive {
 public:
  // Reads `path` whole. UserError when it cannot be read or has no valid central directory.
  static ZipArchive read_file(const std::string& path);
  // The archive in `bytes`; `name` (usually its path) starts every message.
  ZipArchive(std::string name, std::vector<uint8_t> bytes);

  const std::string& name() const { return name_; }
  // Member names in central-directory order.
  std::vector<std::string> member_names() const;
  bool contains(const std::string& member) const;
  // The member's contents, inflated and CRC-checked. UserError when it is missing or malformed.
  std::vector<uint8_t> read(const std::string& member) const;

 private:
  struct Entry {
    std::string name;
    uint16_t flags = 0;
    uint16_t method = 0;
    uint32_t crc32 = 0;
    uint64_t compressed_size = 0;
    uint64_t size = 0;
    uint64_t local_header_offset = 0;
  };
  const Entry* find(const std::string& member) const;

  std::string name_;
  std::vector<uint8_t> bytes_;
  std::vector<Entry> entries_;
};

}  // namespace ddp::io
