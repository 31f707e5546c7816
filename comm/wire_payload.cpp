#include "comm/wire_payload.h"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "comm/wire_cast.h"

namespace ddp::comm {

WireFormat wire_format(const std::string& compression) {
  if (compression == "bf16") return WireFormat::kBfloat16;
  if (compression == "fp16") return WireFormat::kHalf;
  return WireFormat::kFloat;
}

int16_t half_wire_exponent(std::span<const float> values) {
  float largest = 0.0f;
  for (const float x : values) {
    if (!std::isfinite(x)) return 0;
    largest = std::max(largest, std::fabs(x));
  }
  return static_cast<int16_t>(std::ilogb(half_wire_scale(largest, 1)));
}

std::size_t encode_values(std::span<const float> values, unsigned char* out, WireFormat format) {
  const std::size_t n = values.size();
  if (format == WireFormat::kBfloat16) {
    // Front to back: value i goes to 2i, at or before where value i is read from (4i).
    for (std::size_t i = 0; i < n; ++i) {
      const uint16_t value = float_to_bfloat16(values[i]);
      std::memcpy(out + i * sizeof(value), &value, sizeof(value));
    }
  } else if (n > 0) {
    // Value i goes to 2 + 2i, at or before where value i + 1 is read from; the exponent last, over value 0.
    const int16_t exponent = half_wire_exponent(values);
    const float scale = std::ldexp(1.0f, exponent);
    for (std::size_t i = 0; i < n; ++i) {
      const uint16_t value = float_to_half(values[i] * scale);
      std::memcpy(out + (1 + i) * sizeof(value), &value, sizeof(value));
    }
    std::memcpy(out, &exponent, sizeof(exponent));
  }
  return wire_payload_bytes(n, 0, format);
}

void decode_values(const unsigned char* in, std::size_t n, WireFormat format, float* out) {
  if (format == WireFormat::kBfloat16) {
    for (std::size_t i = 0; i < n; ++i) {
      uint16_t value = 0;
      std::memcpy(&value, in + i * sizeof(value), sizeof(value));
      out[i] = bfloat16_to_float(value);
    }
    return;
  }
  if (n == 0) return;
  int16_t exponent = 0;
  std::memcpy(&exponent, in, sizeof(exponent));
  const float unscale = std::ldexp(1.0f, -exponent);  // a power of two: exact
  for (std::size_t i = 0; i < n; ++i) {
    uint16_t value = 0;
    std::memcpy(&value, in + (1 + i) * sizeof(value), sizeof(value));
    out[i] = half_to_float(value) * unscale;
  }
}

std::size_t narrow_values(std::span<float> payload, std::size_t words, WireFormat format) {
  auto* values = reinterpret_cast<unsigned char*>(payload.data()) + words * sizeof(float);
  return words * sizeof(float) +
         encode_values(std::span<const float>(payload).subspan(words), values, format);
}

std::size_t widen_values(const unsigned char* payload, std::size_t bytes, std::size_t words,
                         std::span<float> out, WireFormat format, std::string& error) {
  const std::size_t head = words * sizeof(float);
  const std::size_t header = format == WireFormat::kHalf && bytes > head ? sizeof(int16_t) : 0;
  if (bytes < head + header || (bytes - head - header) % sizeof(uint16_t) != 0 ||
      words + (bytes - head - header) / sizeof(uint16_t) > out.size()) {
    error = "a 16-bit payload of " + std::to_string(bytes) + " bytes that fits no shard of " +
            std::to_string(out.size()) + " parameters";
    return 0;
  }
  std::memcpy(out.data(), payload, head);
  const std::size_t values = (bytes - head - header) / sizeof(uint16_t);
  decode_values(payload + head, values, format, out.data() + words);
  return words + values;
}

std::size_t row_sparse_words(const unsigned char* payload, std::size_t bytes, std::string& error) {
  int32_t rows = -1;
  if (bytes >= sizeof(rows)) std::memcpy(&rows, payload, sizeof(rows));
  if (rows < 0 || (1 + static_cast<std::size_t>(rows)) * sizeof(float) > bytes) {
    error = "a row-sparse 16-bit payload of " + std::to_string(bytes) + " bytes whose row count (" +
            std::to_string(rows) + ") does not fit it";
    return 0;
  }
  return 1 + static_cast<std::size_t>(rows);
}

}  // namespace ddp::comm
