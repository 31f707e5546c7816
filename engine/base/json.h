// JSON for the files ddptrain writes and reads back (metrics.jsonl, the timeline, check-env's facts) through
// nlohmann::json, which escapes strings and writes numbers that read back to the same double. JSON has no
// NaN or infinity (a diverged loss): put_number() writes them as null and says in the object's "not_finite"
// member which key held what ({"loss": null, ..., "not_finite": {"loss": "nan"}}), and number_at() reads
// them back.
#pragma once

#include <cmath>
#include <limits>
#include <nlohmann/json.hpp>
#include <string>

namespace ddp::json {

// Members in the order they were put, as a person reading a line expects them.
using Object = nlohmann::ordered_json;

template <typename Json>
void put_number(Json& object, const std::string& key, double value) {
  object[key] = value;  // nlohmann writes a non-finite double as null
  if (std::isfinite(value)) return;
  object["not_finite"][key] = std::isnan(value) ? "nan" : value > 0 ? "inf" : "-inf";
}

// The number at `key`: NaN where it is absent or not a number, and NaN or an infinity where put_number()
// wrote a non-finite value.
template <typename Json>
double number_at(const Json& object, const std::string& key) {
  constexpr double kNaN = std::numeric_limits<double>::quiet_NaN();
  const auto it = object.find(key);
  if (it == object.end()) return kNaN;
  if (it->is_number()) return it->template get<double>();
  const auto not_finite = object.find("not_finite");
  if (!it->is_null() || not_finite == object.end() || !not_finite->is_object()) return kNaN;
  const auto what = not_finite->find(key);
  if (what == not_finite->end() || !what->is_string()) return kNaN;
  const std::string text = what->template get<std::string>();
  if (text == "inf") return std::numeric_limits<double>::infinity();
  if (text == "-inf") return -std::numeric_limits<double>::infinity();
  return kNaN;
}

}  // namespace ddp::json
