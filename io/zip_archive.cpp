#include "io/zip_archive.h"

#include <zlib.h>

#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <cstring>
#include <fstream>
#include <memory>
#include <new>
#include <stdexcept>
#include <string_view>
#include <utility>

#include "engine/base/file_kind.h"
#include "engine/base/memory_limit.h"
#include "io/binary_fields.h"

namespace ddp::io {
namespace {

using binary::fail;
using binary::fits;
using binary::le16;
using binary::le32;
using binary::le64;
using binary::printable;

std::string hex32(uint32_t value) {
  return fmt::format("0x{:08x}", value);
}
constexpr uint32_t kLocalHeaderSignature = 0x04034b50;
constexpr uint32_t kCentralHeaderSignature = 0x02014b50;
constexpr uint32_t kEndSignature = 0x06054b50;
constexpr uint32_t kZip64EndSignature = 0x06064b50;
constexpr uint32_t kZip64LocatorSignature = 0x07064b50;
constexpr size_t kEndSize = 22;
constexpr size_t kZip64EndSize = 56;
constexpr size_t kZip64LocatorSize = 20;
constexpr size_t kCentralHeaderSize = 46;
constexpr size_t kLocalHeaderSize = 30;
constexpr uint16_t kZip64ExtraId = 0x0001;
constexpr uint16_t kMethodStored = 0;
constexpr uint16_t kMethodDeflate = 8;
// Deflate cannot compress better than about 1032:1; a larger recorded size is a lie (or a zip bomb).
constexpr uint64_t kMaxDeflateRatio = 1032;
// zlib counts in 32-bit uInt: feed it at most this much at a time.
constexpr size_t kZlibChunk = size_t{1} << 30;

uint32_t crc32_of(const std::vector<uint8_t>& data) {
  uLong crc = crc32(0L, Z_NULL, 0);
  for (size_t done = 0; done < data.size();) {
    const size_t chunk = std::min(data.size() - done, kZlibChunk);
    crc = crc32(crc, data.data() + done, static_cast<uInt>(chunk));
    done += chunk;
  }
  return static_cast<uint32_t>(crc);
}

std::vector<uint8_t> inflate_raw(const uint8_t* input, uint64_t input_size, uint64_t size,
                                 const std::string& where) {
  if (size > input_size * kMaxDeflateRatio + 1024) {
    fail(where, "records " + std::to_string(size) + " bytes, impossible for " + std::to_string(input_size) +
                    " deflated bytes (corrupt archive)");
  }
  require_node_memory(static_cast<double>(size), where + ", as recorded in the archive,");
  z_stream stream{};
  if (inflateInit2(&stream, -MAX_WBITS) != Z_OK) throw std::runtime_error("inflateInit2 failed");
  const std::unique_ptr<z_stream, int (*)(z_stream*)> end(&stream, inflateEnd);
  // Room for one byte more than recorded, to notice data that inflates to more. The buffer grows as data
  // arrives, so a recorded size that lies costs no memory.
  const uint64_t limit = size + 1;
  std::vector<uint8_t> out(static_cast<size_t>(std::min<uint64_t>(limit, input_size * 4 + 65536)));
  const uint8_t* next_in = input;
  uint64_t in_left = input_size;
  size_t produced = 0;
  for (;;) {
    if (stream.avail_in == 0 && in_left > 0) {
      const auto chunk = static_cast<uInt>(std::min<uint64_t>(in_left, kZlibChunk));
      stream.next_in = const_cast<Bytef*>(next_in);
      stream.avail_in = chunk;
      next_in += chunk;
      in_left -= chunk;
    }
    if (produced == out.size()) {
      if (out.size() == limit) {
        fail(where, "inflates to more than the recorded " + std::to_string(size) + " bytes");
      }
      out.resize(static_cast<size_t>(std::min<uint64_t>(limit, uint64_t{2} * out.size())));
    }
    const auto room = static_cast<uInt>(std::min(out.size() - produced, kZlibChunk));
    stream.next_out = out.data() + produced;
    stream.avail_out = room;
    const int rc = inflate(&stream, Z_NO_FLUSH);
    produced += room - stream.avail_out;
    if (rc == Z_STREAM_END) break;
    if (rc == Z_MEM_ERROR) throw std::bad_alloc();
    if (rc == Z_DATA_ERROR || rc == Z_NEED_DICT) {
      fail(where, std::string("corrupt deflate data (") + (stream.msg ? stream.msg : "no detail") + ")");
    }
    if (rc != Z_OK && rc != Z_BUF_ERROR) fail(where, "inflate failed (zlib code " + std::to_string(rc) + ")");
    if (stream.avail_in == 0 && in_left == 0 && stream.avail_out > 0) {
      fail(where, "truncated: the deflate stream ends before its last block");
    }
  }
  if (produced != size) {
    fail(where,
         "inflates to " + std::to_string(produced) + " bytes, the archive records " + std::to_string(size));
  }
  out.resize(size);
  return out;
}

}  // namespace

ZipArchive ZipArchive::read_file(const std::string& path) {
  if (const std::string kind = special_file_kind(path, /*follow_links=*/true); !kind.empty())
    fail(path, "is " + kind + ", not an .npz file");
  std::ifstream in(path, std::ios::binary);
  if (!in) fail(path, std::string("cannot open (") + std::strerror(errno) + ")");
  std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (in.bad()) fail(path, "read error");
  return ZipArchive(path, std::move(bytes));
}

ZipArchive::ZipArchive(std::string name, std::vector<uint8_t> bytes)
    : name_(std::move(name)), bytes_(std::move(bytes)) {
  const uint8_t* data = bytes_.data();
  const size_t total = bytes_.size();
  // The end record is the last thing in the file, followed only by its comment (at most 64 KiB).
  size_t end = SIZE_MAX;
  if (total >= kEndSize) {
    const size_t lowest = total >= kEndSize + 0xFFFF ? total - kEndSize - 0xFFFF : 0;
    for (size_t pos = total - kEndSize + 1; pos-- > lowest;) {
      if (le32(data + pos) == kEndSignature && pos + kEndSize + le16(data + pos + 20) <= total) {
        end = pos;
        break;
      }
    }
  }
  if (end == SIZE_MAX) {
    fail(name_, "not a zip archive (no end-of-central-directory record: not an .npz file, or truncated)");
  }
  uint32_t disk = le16(data + end + 4);
  uint32_t directory_disk = le16(data + end + 6);
  uint64_t entry_count = le16(data + end + 10);
  uint64_t directory_size = le32(data + end + 12);
  uint64_t directory_offset = le32(data + end + 16);
  if (end >= kZip64LocatorSize && le32(data + end - kZip64LocatorSize) == kZip64LocatorSignature) {
    const uint64_t zip64_end = le64(data + end - kZip64LocatorSize + 8);
    if (!fits(0, zip64_end, end) || !fits(zip64_end, kZip64EndSize, total) ||
        le32(data + zip64_end) != kZip64EndSignature) {
      fail(name_, "corrupt ZIP64 end-of-central-directory record");
    }
    const uint8_t* record = data + zip64_end;
    disk = le32(record + 16);
    directory_disk = le32(record + 20);
    entry_count = le64(record + 32);
    directory_size = le64(record + 40);
    directory_offset = le64(record + 48);
  }
  if (disk != 0 || directory_disk != 0) fail(name_, "multi-part zip archives are not supported");
  if (!fits(directory_offset, directory_size, total)) {
    fail(name_, "the central directory lies outside the file (truncated?)");
  }
  size_t pos = directory_offset;
  const size_t directory_end = directory_offset + directory_size;
  for (uint64_t i = 0; i < entry_count; ++i) {
    const std::string entry_where = name_ + ": central directory entry " + std::to_string(i);
    if (!fits(pos, kCentralHeaderSize, directory_end) || le32(data + pos) != kCentralHeaderSignature) {
      fail(entry_where, "is corrupt or missing");
    }
    const uint8_t* header = data + pos;
    Entry entry;
    entry.flags = le16(header + 8);
    entry.method = le16(header + 10);
    entry.crc32 = le32(header + 16);
    entry.compressed_size = le32(header + 20);
    entry.size = le32(header + 24);
    const size_t name_length = le16(header + 28);
    const size_t extra_length = le16(header + 30);
    const size_t comment_length = le16(header + 32);
    const uint16_t start_disk = le16(header + 34);
    entry.local_header_offset = le32(header + 42);
    if (!fits(pos + kCentralHeaderSize, name_length + extra_length + comment_length, directory_end)) {
      fail(entry_where, "runs past the end of the central directory");
    }
    entry.name.assign(reinterpret_cast<const char*>(header + kCentralHeaderSize), name_length);
    const std::string where = name_ + ": " + printable(entry.name);
    // ZIP64: each 32-bit field that reads 0xFFFFFFFF has its 64-bit value in the extra field, in this order.
    const bool need_size = entry.size == 0xFFFFFFFF;
    const bool need_compressed = entry.compressed_size == 0xFFFFFFFF;
    const bool need_offset = entry.local_header_offset == 0xFFFFFFFF;
    bool found_zip64 = false;
    const uint8_t* extra = header + kCentralHeaderSize + name_length;
    for (size_t e = 0; e + 4 <= extra_length;) {
      const uint16_t id = le16(extra + e);
      const size_t length = le16(extra + e + 2);
      if (e + 4 + length > extra_length) fail(where, "extra field runs past its end");
      if (id == kZip64ExtraId) {
        found_zip64 = true;
        const uint8_t* field = extra + e + 4;
        size_t used = 0;
        const auto take = [&](uint64_t& value) {
          if (used + 8 > length) fail(where, "ZIP64 extra field is too short");
          value = le64(field + used);
          used += 8;
        };
        if (need_size) take(entry.size);
        if (need_compressed) take(entry.compressed_size);
        if (need_offset) take(entry.local_header_offset);
      }
      e += 4 + length;
    }
    if ((need_size || need_compressed || need_offset) && !found_zip64) {
      fail(where, "sizes read 0xFFFFFFFF but there is no ZIP64 extra field");
    }
    if (start_disk != 0 && start_disk != 0xFFFF) fail(where, "lies on another disk of a multi-part archive");
    entries_.push_back(std::move(entry));
    pos += kCentralHeaderSize + name_length + extra_length + comment_length;
  }
}

std::vector<std::string> ZipArchive::member_names() const {
  std::vector<std::string> names;
  for (const Entry& entry : entries_) names.push_back(entry.name);
  return names;
}

const ZipArchive::Entry* ZipArchive::find(const std::string& member) const {
  // The last entry of a name wins, as in Python's zipfile.
  for (auto it = entries_.rbegin(); it != entries_.rend(); ++it) {
    if (it->name == member) return &*it;
  }
  return nullptr;
}

bool ZipArchive::contains(const std::string& member) const {
  return find(member) != nullptr;
}

std::vector<uint8_t> ZipArchive::read(const std::string& member) const {
  const Entry* entry = find(member);
  if (entry == nullptr) fail(name_, "no member '" + printable(member) + "'");
  const std::string where = name_ + ": " + printable(member);
  if (entry->flags & 1) fail(where, "encrypted members are not supported");
  const uint8_t* data = bytes_.data();
  const size_t total = bytes_.size();
  const uint64_t offset = entry->local_header_offset;
  if (!fits(offset, kLocalHeaderSize, total))
    fail(where, "the local header lies outside the file (truncated?)");
  if (le32(data + offset) != kLocalHeaderSignature) fail(where, "bad local header signature");
  const size_t name_length = le16(data + offset + 26);
  const size_t extra_length = le16(data + offset + 28);
  const size_t name_start = offset + kLocalHeaderSize;
  if (!fits(name_start, name_length + extra_length, total)) fail(where, "truncated local header");
  const std::string_view local_name(reinterpret_cast<const char*>(data + name_start), name_length);
  if (local_name != entry->name) {
    fail(where, "the local header names '" + printable(local_name) + "' (corrupt archive)");
  }
  const size_t data_start = name_start + name_length + extra_length;
  if (!fits(data_start, entry->compressed_size, total)) {
    fail(where, "truncated: " + std::to_string(entry->compressed_size) + " bytes at offset " +
                    std::to_string(data_start) + ", but the file has " + std::to_string(total));
  }
  std::vector<uint8_t> contents;
  try {
    if (entry->method == kMethodStored) {
      if (entry->compressed_size != entry->size) {
        fail(where, "stored member whose compressed size " + std::to_string(entry->compressed_size) +
                        " differs from its size " + std::to_string(entry->size));
      }
      contents.assign(data + data_start, data + data_start + entry->size);
    } else if (entry->method == kMethodDeflate) {
      contents = inflate_raw(data + data_start, entry->compressed_size, entry->size, where);
    } else {
      fail(where, "compression method " + std::to_string(entry->method) +
                      " is not supported (only stored and deflate)");
    }
  } catch (const std::bad_alloc&) {
    fail(where, "its " + std::to_string(entry->size) +
                    " bytes, as the archive records them, are more than this process may allocate");
  }
  const uint32_t crc = crc32_of(contents);
  if (crc != entry->crc32) {
    fail(where, "CRC-32 mismatch: the archive records " + hex32(entry->crc32) + ", the data gives " +
                    hex32(crc) + " (corrupt file)");
  }
  return contents;
}

}  // namespace ddp::io
