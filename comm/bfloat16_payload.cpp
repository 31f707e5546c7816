#include "comm/bfloat16_payload.h"

#include <cstring>

#include "comm/wire_cast.h"

namespace ddp::comm {

std::size_t narrow_values(std::span<float> payload, std::size_t words) {
  auto* bytes = reinterpret_cast<unsigned char*>(payload.data()) + words * sizeof(float);
  for (std::size_t i = words; i < payload.size(); ++i) {
    const uint16_t value = float_to_bfloat16(payload[i]);
    std::memcpy(bytes + (i - words) * sizeof(value), &value, sizeof(value));
  }
  return words * sizeof(float) + (payload.size() - words) * sizeof(uint16_t);
}

std::size_t widen_values(const unsigned char* payload, std::size_t bytes, std::size_t words,
                         std::span<float> out, std::string& error) {
  const std::size_t head = words * sizeof(float);
  if (bytes < head || (bytes - head) % sizeof(uint16_t) != 0 ||
      words + (bytes - head) / sizeof(uint16_t) > out.size()) {
    error = "a bfloat16 payload of " + std::to_string(bytes) + " bytes that fits no shard of " +
            std::to_string(out.size()) + " parameters";
    return 0;
  }
  std::memcpy(out.data(), payload, head);
  const std::size_t values = (bytes - head) / sizeof(uint16_t);
  for (std::size_t i = 0; i < values; ++i) {
    uint16_t value = 0;
    std::memcpy(&value, payload + head + i * sizeof(value), sizeof(value));
    out[words + i] = bfloat16_to_float(value);
  }
  return words + values;
}

std::size_t row_sparse_words(const unsigned char* payload, std::size_t bytes, std::string& error) {
  int32_t rows = -1;
  if (bytes >= sizeof(rows)) std::memcpy(&rows, payload, sizeof(rows));
  if (rows < 0 || (1 + static_cast<std::size_t>(rows)) * sizeof(float) > bytes) {
    error = "a row-sparse bfloat16 payload of " + std::to_string(bytes) + " bytes whose row count (" +
            std::to_string(rows) + ") does not fit it";
    return 0;
  }
  return 1 + static_cast<std::size_t>(rows);
}

}  // namespace ddp::comm
