#include "engine/app/learning_curves.h"

#include <fmt/format.h>
#include <algorithm>
#include <cerrno>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <optional>
#include <system_error>

#include "engine/base/errors.h"
#include "engine/base/json.h"

namespace ddp::engine {
namespace {

// --- Drawing -------------------------------------------------------------------------------------------

// SVG numbers: fixed-point, never in the locale's format (fmt ignores the locale unless asked).
std::string fixed(double value, int decimals) {
  return fmt::format("{:.{}f}", value, decimals);
}

// The decimals that show every multiple of `step` exactly (0.25 -> 2).
int decimals_for(double step) {
  for (int decimals = 0; decimals < 12; ++decimals) {
    const double scaled = step * std::pow(10.0, decimals);
    if (std::abs(scaled - std::round(scaled)) < 1e-6 * scaled) return decimals;
  }
  return 12;
}

std::string xml_escape(const std::string& text) {
  std::string out;
  for (const char c : text) {
    switch (c) {
      case '&':
        out += "&amp;";
        break;
      case '<':
        out += "&lt;";
        break;
      case '>':
        out += "&gt;";
        break;
      case '"':
        out += "&quot;";
        break;
      default:
        out += c;
    }
  }
  return out;
}

// A linear map from [lo, hi] onto [to_lo, to_hi] (pixels; y runs downwards, so to_lo may exceed to_hi).
struct Scale {
  double lo = 0;
  double hi = 1;
  double to_lo = 0;
  double to_hi = 1;
  double operator()(double v) const { return to_lo + (v - lo) / (hi - lo) * (to_hi - to_lo); }
};

// The data range of the finite values, widened around a single value so that it has a middle.
std::optional<std::pair<double, double>> value_range(const std::vector<double>& values) {
  double lo = std::numeric_limits<double>::infinity();
  double hi = -lo;
  for (const double v : values) {
    if (!std::isfinite(v)) continue;
    lo = std::min(lo, v);
    hi = std::max(hi, v);
  }
  if (lo > hi) return std::nullopt;
  if (hi - lo <= 1e-12 * std::max(1.0, std::abs(hi))) {
    const double pad = std::max(0.05 * std::abs(hi), 0.05);
    return std::make_pair(lo - pad, hi + pad);
  }
  return std::make_pair(lo, hi);
}

constexpr double kWidth = 960;
constexpr double kHeight = 440;
constexpr double kPanelWidth = kWidth / 2;
constexpr double kPlotTop = 84;
constexpr double kPlotBottom = kHeight - 64;
constexpr char kTrainColor[] = "#1f77b4";
constexpr char kValidationColor[] = "#d62728";
constexpr std::size_t kMaxMarkers = 100;  // beyond that the markers hide the line

struct Series {
  std::string name;            // "train" or "validation"
  std::vector<double> values;  // one per epoch, NaN where missing
  const char* color;
  bool dashed;
};

void draw_panel(std::string& svg, int index, const std::string& title, const std::string& css_name,
                const std::vector<EpochCurvePoint>& points, const std::vector<Series>& series) {
  const double left = index * kPanelWidth;
  const double x0 = left + 72;
  const double x1 = left + kPanelWidth - 24;
  svg += "<g class=\"panel " + css_name + "\">\n";
  svg += "<text x=\"" + fixed(x0, 1) + "\" y=\"" + fixed(kPlotTop - 14, 1) +
         "\" font-size=\"15\" font-weight=\"bold\">" + title + "</text>\n";
  // Legend, top right of the panel: a short line of each style and its name.
  double legend_x = x1 - 200;
  for (const Series& s : series) {
    const double y = kPlotTop - 19;
    svg += "<line x1=\"" + fixed(legend_x, 1) + "\" y1=\"" + fixed(y, 1) + "\" x2=\"" +
           fixed(legend_x + 24, 1) + "\" y2=\"" + fixed(y, 1) + "\" stroke=\"" + s.color +
           "\" stroke-width=\"2\"" + (s.dashed ? " stroke-dasharray=\"6 4\"" : "") + "/>\n";
    svg += "<text x=\"" + fixed(legend_x + 30, 1) + "\" y=\"" + fixed(y + 4, 1) + "\" font-size=\"12\">" +
           s.name + "</text>\n";
    legend_x += 100;
  }
  svg += "<rect class=\"plot-area\" x=\"" + fixed(x0, 2) + "\" y=\"" + fixed(kPlotTop, 2) + "\" width=\"" +
         fixed(x1 - x0, 2) + "\" height=\"" + fixed(kPlotBottom - kPlotTop, 2) +
         "\" fill=\"#ffffff\" stroke=\"#888888\"/>\n";

  std::vector<double> all_values;
  for (const Series& s : series) all_values.insert(all_values.end(), s.values.begin(), s.values.end());
  const auto y_range = value_range(all_values);
  if (points.empty() || !y_range) {
    svg += "<text x=\"" + fixed((x0 + x1) / 2, 1) + "\" y=\"" + fixed((kPlotTop + kPlotBottom) / 2, 1) +
           "\" text-anchor=\"middle\" font-size=\"13\" fill=\"#666666\">no epoch yet</text>\n</g>\n";
    return;
  }
  double first_epoch = static_cast<double>(points.front().epoch);
  double last_epoch = static_cast<double>(points.back().epoch);
  if (first_epoch == last_epoch) {  // one epoch: put it in the middle
    first_epoch -= 1;
    last_epoch += 1;
  }
  const Scale x{first_epoch, last_epoch, x0, x1};
  const Scale y{y_range->first, y_range->second, kPlotBottom, kPlotTop};

  // Grid lines and labels.
  const std::vector<double> y_ticks = nice_ticks(y.lo, y.hi, false);
  const int y_decimals = y_ticks.size() >= 2 ? decimals_for(y_ticks[1] - y_ticks[0]) : 2;
  for (const double tick : y_ticks) {
    const std::string ty = fixed(y(tick), 2);
    svg += "<line x1=\"" + fixed(x0, 2) + "\" y1=\"" + ty + "\" x2=\"" + fixed(x1, 2) + "\" y2=\"" + ty +
           "\" stroke=\"#e6e6e6\"/>\n";
    svg += "<text class=\"y-tick\" x=\"" + fixed(x0 - 6, 2) + "\" y=\"" + fixed(y(tick) + 4, 2) +
           "\" text-anchor=\"end\" font-size=\"11\">" + fixed(tick, y_decimals) + "</text>\n";
  }
  for (const double tick : nice_ticks(x.lo, x.hi, true)) {
    if (tick < static_cast<double>(points.front().epoch) || tick > static_cast<double>(points.back().epoch))
      continue;
    const std::string tx = fixed(x(tick), 2);
    svg += "<line x1=\"" + tx + "\" y1=\"" + fixed(kPlotBottom, 2) + "\" x2=\"" + tx + "\" y2=\"" +
           fixed(kPlotBottom + 5, 2) + "\" stroke=\"#888888\"/>\n";
    svg += "<text class=\"x-tick\" x=\"" + tx + "\" y=\"" + fixed(kPlotBottom + 18, 2) +
           "\" text-anchor=\"middle\" font-size=\"11\">" + fixed(tick, 0) + "</text>\n";
  }
  svg += "<text x=\"" + fixed((x0 + x1) / 2, 1) + "\" y=\"" + fixed(kPlotBottom + 40, 1) +
         "\" text-anchor=\"middle\" font-size=\"12\">epoch</text>\n";
  const double label_x = left + 18;
  const double label_y = (kPlotTop + kPlotBottom) / 2;
  svg += "<text x=\"" + fixed(label_x, 1) + "\" y=\"" + fixed(label_y, 1) + "\" transform=\"rotate(-90 " +
         fixed(label_x, 1) + " " + fixed(label_y, 1) + ")\" text-anchor=\"middle\" font-size=\"12\">" +
         css_name + "</text>\n";

  // The curves: a polyline through the finite values, and a marker on each.
  for (const Series& s : series) {
    std::string coordinates;
    std::string markers;
    std::size_t count = 0;
    for (std::size_t i = 0; i < points.size(); ++i) {
      if (!std::isfinite(s.values[i])) continue;
      const std::string px = fixed(x(static_cast<double>(points[i].epoch)), 2);
      const std::string py = fixed(y(s.values[i]), 2);
      coordinates += (count > 0 ? " " : "") + px + "," + py;
      markers += "<circle cx=\"" + px + "\" cy=\"" + py + "\" r=\"3\"/>";
      ++count;
    }
    const std::string css_class = css_name + " " + s.name;
    if (count >= 2) {
      svg += "<polyline class=\"" + css_class + "\" points=\"" + coordinates + "\" fill=\"none\" stroke=\"" +
             s.color + "\" stroke-width=\"2\"" + (s.dashed ? " stroke-dasharray=\"6 4\"" : "") + "/>\n";
    }
    if (count <= kMaxMarkers) {
      svg += "<g class=\"markers " + css_class + "\" fill=\"" + s.color + "\">" + markers + "</g>\n";
    }
  }
  svg += "</g>\n";
}

std::string last_values_line(const std::vector<EpochCurvePoint>& points) {
  if (points.empty()) return "no epoch finished yet";
  const EpochCurvePoint& last = points.back();
  const auto value = [](double v) { return std::isfinite(v) ? fixed(v, 4) : std::string("-"); };
  return std::to_string(points.size()) + (points.size() == 1 ? " epoch" : " epochs") + "; epoch " +
         std::to_string(last.epoch) + ": loss " + value(last.loss) + ", acc " + value(last.acc) +
         ", val_loss " + value(last.val_loss) + ", val_acc " + value(last.val_acc);
}

std::string run_name(const std::string& metrics_jsonl) {
  std::error_code ec;
  std::filesystem::path dir = std::filesystem::absolute(metrics_jsonl, ec).lexically_normal().parent_path();
  if (ec) dir = std::filesystem::path(metrics_jsonl).parent_path();
  const std::string name = dir.filename().string();
  return name.empty() ? dir.string() : name;
}

}  // namespace

std::vector<EpochCurvePoint> read_learning_curves(const std::string& metrics_jsonl) {
  std::ifstream in(metrics_jsonl);
  if (!in) throw UserError(metrics_jsonl + ": cannot read this file");
  // The file belongs to one run (run_directory.h); should lines of an earlier run precede it (a file from
  // before run ids, or copied together), only the last run's are drawn.
  std::map<int64_t, EpochCurvePoint> by_epoch;
  std::string run_id;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json members = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!members.is_object()) continue;  // a half-written last line, say
    // A resume: this run's epochs after the checkpoint's were written by a job that stopped before their
    // checkpoint, and are trained again.
    if (members.value("event", "") == "resume" && members.value("run_id", "") == run_id) {
      const auto done = members.find("epochs_done");
      if (done != members.end() && done->is_number_integer())
        by_epoch.erase(by_epoch.upper_bound(done->get<int64_t>()), by_epoch.end());
      continue;
    }
    const auto epoch = members.find("epoch");
    if (epoch == members.end() || !epoch->is_number_integer()) continue;  // the test line, or not ours
    const auto id = members.find("run_id");
    const std::string line_run = id != members.end() && id->is_string() ? id->get<std::string>() : "";
    if (line_run != run_id) by_epoch.clear();
    run_id = line_run;
    EpochCurvePoint point;
    point.epoch = epoch->get<int64_t>();
    point.loss = json::number_at(members, "loss");
    point.acc = json::number_at(members, "acc");
    // data.validation = test names the held-out numbers test_*.
    const bool on_test = !members.contains("val_loss") && members.contains("test_loss");
    point.val_loss = json::number_at(members, on_test ? "test_loss" : "val_loss");
    point.val_acc = json::number_at(members, on_test ? "test_acc" : "val_acc");
    by_epoch[point.epoch] = point;
  }
  if (in.bad()) throw UserError(metrics_jsonl + ": read error");
  std::vector<EpochCurvePoint> points;
  points.reserve(by_epoch.size());
  for (const auto& [epoch, point] : by_epoch) points.push_back(point);
  return points;
}

std::vector<double> nice_ticks(double lo, double hi, bool integers) {
  if (!(hi > lo) || !std::isfinite(lo) || !std::isfinite(hi)) return {};
  // Mantissas in order of preference; the first step (over a few powers of ten) that gives 4 to 6 ticks
  // wins, else the step whose count is nearest 5.
  constexpr double kMantissas[] = {1, 2, 5, 2.5, 4, 3, 1.5, 6, 8};
  const double base = std::pow(10.0, std::floor(std::log10(hi - lo)));
  double best_step = 0;
  int64_t best_miss = std::numeric_limits<int64_t>::max();
  for (const double mantissa : kMantissas) {
    for (int exponent = -2; exponent <= 1; ++exponent) {
      const double step = mantissa * base * std::pow(10.0, exponent);
      if (integers && (step < 1 || std::abs(step - std::round(step)) > 1e-9)) continue;
      const double first = std::ceil(lo / step - 1e-9);
      const double last = std::floor(hi / step + 1e-9);
      const auto count = static_cast<int64_t>(last - first) + 1;
      const int64_t miss = count < 4 ? 4 - count : (count > 6 ? count - 6 : 0);
      if (miss < best_miss) {
        best_miss = miss;
        best_step = step;
      }
    }
  }
  if (best_step == 0) best_step = 1;  // integers over a range below 1
  std::vector<double> ticks;
  const double first = std::ceil(lo / best_step - 1e-9);
  const double last = std::floor(hi / best_step + 1e-9);
  for (double k = first; k <= last; k += 1) {
    const double tick = k * best_step;
    ticks.push_back(std::abs(tick) < 1e-12 * best_step ? 0.0 : tick);  // no "-0.00" label
  }
  return ticks;
}

void write_learning_curves(const std::string& metrics_jsonl, const std::string& svg_path) {
  const std::vector<EpochCurvePoint> points = read_learning_curves(metrics_jsonl);
  const auto column = [&](double EpochCurvePoint::*field) {
    std::vector<double> values;
    values.reserve(points.size());
    for (const EpochCurvePoint& p : points) values.push_back(p.*field);
    return values;
  };
  const std::string title = "Learning curves: " + xml_escape(run_name(metrics_jsonl));

  std::string svg;
  svg += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + fixed(kWidth, 0) + "\" height=\"" +
         fixed(kHeight, 0) + "\" viewBox=\"0 0 " + fixed(kWidth, 0) + " " + fixed(kHeight, 0) +
         "\" font-family=\"sans-serif\">\n";
  svg += "<title>" + title + "</title>\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"#fafafa\"/>\n";
  svg += "<text x=\"" + fixed(kWidth / 2, 1) + "\" y=\"26\" text-anchor=\"middle\" font-size=\"18\">" +
         title + "</text>\n";
  svg += "<text x=\"" + fixed(kWidth / 2, 1) + "\" y=\"46\" text-anchor=\"middle\" font-size=\"12\" " +
         "fill=\"#555555\">" + last_values_line(points) + "</text>\n";
  draw_panel(svg, 0, "Loss", "loss", points,
             {{"train", column(&EpochCurvePoint::loss), kTrainColor, false},
              {"validation", column(&EpochCurvePoint::val_loss), kValidationColor, true}});
  draw_panel(svg, 1, "Accuracy", "accuracy", points,
             {{"train", column(&EpochCurvePoint::acc), kTrainColor, false},
              {"validation", column(&EpochCurvePoint::val_acc), kValidationColor, true}});
  svg += "</svg>\n";

  const std::string tmp_path = svg_path + ".tmp";
  {
    errno = 0;
    std::ofstream out(tmp_path, std::ios::binary | std::ios::trunc);
    out << svg;
    out.flush();
    if (!out) {
      const std::string why = write_error_reason();
      std::error_code ignored;
      std::filesystem::remove(tmp_path, ignored);
      throw UserError(tmp_path + ": cannot write this file (" + why + ")");
    }
  }
  std::error_code ec;
  std::filesystem::rename(tmp_path, svg_path, ec);
  if (ec) {
    std::error_code ignored;
    std::filesystem::remove(tmp_path, ignored);
    throw UserError(svg_path + ": cannot replace this file (" + ec.message() + ")");
  }
}

}  // namespace ddp::engine
