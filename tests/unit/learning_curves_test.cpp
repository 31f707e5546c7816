// Learning curves: metrics.jsonl (as metrics.cpp writes it) drawn as SVG. The SVG is parsed back: the
// polylines' points, the plot areas, the tags.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <string>
#include <vector>

#include "engine/app/learning_curves.h"
#include "engine/base/errors.h"
#include "engine/metrics.h"
#include "tests/test_util.h"

namespace ddp::engine {
namespace {

using ddp::testing::TempDir;

struct Point {
  double x = 0;
  double y = 0;
};

struct Rect {
  double x = 0, y = 0, width = 0, height = 0;
};

std::string metrics_line(int64_t epoch, double loss, double acc, double val_loss, double val_acc) {
  EpochMetrics m;
  m.epoch = epoch;
  m.epochs = 10;
  m.steps = 100;
  m.loss = loss;
  m.acc = acc;
  m.val_loss = val_loss;
  m.val_acc = val_acc;
  m.backend = "mpi";
  m.device = "cpu";
  return to_json(m);
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path);
  out << text;
}

std::string read_text(const std::string& path) {
  std::stringstream s;
  s << std::ifstream(path).rdbuf();
  return s.str();
}

// The value of attribute `name` in the first tag at or after `from` that starts with `tag_start`.
std::string attribute(const std::string& svg, const std::string& tag_start, const std::string& name,
                      std::size_t from = 0) {
  const std::size_t tag = svg.find(tag_start, from);
  if (tag == std::string::npos) return "";
  const std::size_t end = svg.find('>', tag);
  const std::string key = " " + name + "=\"";
  const std::size_t at = svg.find(key, tag);
  if (at == std::string::npos || at > end) return "";
  const std::size_t value = at + key.size();
  return svg.substr(value, svg.find('"', value) - value);
}

// The points of the polyline of class "<panel> <series>", empty if there is none.
std::vector<Point> polyline(const std::string& svg, const std::string& panel, const std::string& series) {
  const std::string text = attribute(svg, "<polyline class=\"" + panel + " " + series + "\"", "points");
  std::vector<Point> points;
  std::istringstream in(text);
  for (std::string pair; in >> pair;) {
    const std::size_t comma = pair.find(',');
    points.push_back({std::stod(pair.substr(0, comma)), std::stod(pair.substr(comma + 1))});
  }
  return points;
}

Rect plot_area(const std::string& svg, const std::string& panel) {
  const std::size_t group = svg.find("<g class=\"panel " + panel + "\"");
  EXPECT_NE(group, std::string::npos) << panel;
  const std::string tag = "<rect class=\"plot-area\"";
  return {std::stod(attribute(svg, tag, "x", group)), std::stod(attribute(svg, tag, "y", group)),
          std::stod(attribute(svg, tag, "width", group)), std::stod(attribute(svg, tag, "height", group))};
}

std::size_t count(const std::string& text, const std::string& what) {
  std::size_t n = 0;
  for (std::size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++n;
  return n;
}

// Every opened tag is closed in order: enough to catch a broken writer (not a full XML parser).
::testing::AssertionResult balanced_tags(const std::string& svg) {
  std::vector<std::string> open;
  for (std::size_t at = svg.find('<'); at != std::string::npos; at = svg.find('<', at + 1)) {
    const std::size_t end = svg.find('>', at);
    if (end == std::string::npos) return ::testing::AssertionFailure() << "unterminated tag at " << at;
    const std::string tag = svg.substr(at + 1, end - at - 1);
    if (tag.empty()) return ::testing::AssertionFailure() << "empty tag at " << at;
    if (tag[0] == '?' || tag[0] == '!') continue;
    if (tag.find('<') != std::string::npos)
      return ::testing::AssertionFailure() << "'<' inside a tag at " << at;
    if (tag[0] == '/') {
      const std::string name = tag.substr(1);
      if (open.empty() || open.back() != name)
        return ::testing::AssertionFailure()
               << "</" << name << "> closes " << (open.empty() ? "nothing" : open.back());
      open.pop_back();
    } else if (tag.back() != '/') {
      open.push_back(tag.substr(0, tag.find_first_of(" \t\n")));
    }
  }
  if (!open.empty()) return ::testing::AssertionFailure() << "<" << open.back() << "> never closed";
  return ::testing::AssertionSuccess();
}

// Seven epochs of a plausible run; the highest validation loss is above the highest training loss.
std::string seven_epochs() {
  std::string text;
  const double loss[] = {0.69, 0.55, 0.41, 0.33, 0.29, 0.27, 0.26};
  const double val_loss[] = {0.72, 0.60, 0.45, 0.40, 0.38, 0.39, 0.41};
  for (int e = 0; e < 7; ++e) {
    text += metrics_line(e + 1, loss[e], 0.5 + 0.06 * e, val_loss[e], 0.48 + 0.05 * e) + "\n";
  }
  return text;
}

TEST(LearningCurves, OnePointPerEpochOnEveryCurve) {
  TempDir dir;
  write_text(dir.file("metrics.jsonl"), seven_epochs());
  write_learning_curves(dir.file("metrics.jsonl"), dir.file("curves.svg"));
  const std::string svg = read_text(dir.file("curves.svg"));
  for (const std::string panel : {"loss", "accuracy"}) {
    for (const std::string series : {"train", "validation"}) {
      const std::vector<Point> points = polyline(svg, panel, series);
      ASSERT_EQ(points.size(), 7u) << panel << " " << series;
      for (std::size_t i = 1; i < points.size(); ++i) EXPECT_GT(points[i].x, points[i - 1].x);
    }
  }
  EXPECT_EQ(count(svg, "stroke-dasharray"), 4u);  // the two validation curves and their legend lines
  EXPECT_TRUE(balanced_tags(svg));
  EXPECT_EQ(svg.find("<script"), std::string::npos);
  EXPECT_NE(svg.find("xmlns=\"http://www.w3.org/2000/svg\""), std::string::npos);
  EXPECT_FALSE(std::filesystem::exists(dir.file("curves.svg.tmp")));
}

TEST(LearningCurves, ExtremesSpanThePanelsDataArea) {
  TempDir dir;
  write_text(dir.file("metrics.jsonl"), seven_epochs());
  write_learning_curves(dir.file("metrics.jsonl"), dir.file("curves.svg"));
  const std::string svg = read_text(dir.file("curves.svg"));

  const Rect loss_area = plot_area(svg, "loss");
  const std::vector<Point> train = polyline(svg, "loss", "train");
  const std::vector<Point> validation = polyline(svg, "loss", "validation");
  EXPECT_NEAR(validation[0].y, loss_area.y, 0.01);                // 0.72, the highest loss
  EXPECT_NEAR(train[6].y, loss_area.y + loss_area.height, 0.01);  // 0.26, the lowest
  EXPECT_NEAR(train[0].x, loss_area.x, 0.01);                     // first epoch at the left edge
  EXPECT_NEAR(train[6].x, loss_area.x + loss_area.width, 0.01);   // last at the right
  for (const Point& p : validation) {
    EXPECT_GE(p.y, loss_area.y - 0.01);
    EXPECT_LE(p.y, loss_area.y + loss_area.height + 0.01);
  }

  const Rect acc_area = plot_area(svg, "accuracy");
  EXPECT_GT(acc_area.x, loss_area.x + loss_area.width);  // side by side
  const std::vector<Point> acc = polyline(svg, "accuracy", "train");
  const std::vector<Point> val_acc = polyline(svg, "accuracy", "validation");
  EXPECT_NEAR(acc[6].y, acc_area.y, 0.01);                        // 0.86, the highest accuracy
  EXPECT_NEAR(val_acc[0].y, acc_area.y + acc_area.height, 0.01);  // 0.48, the lowest
}

TEST(LearningCurves, RepeatedEpochTakesTheLastLine) {
  TempDir dir;
  // A run interrupted after epoch 3 and resumed from the checkpoint of epoch 1.
  write_text(dir.file("metrics.jsonl"),
             metrics_line(1, 0.7, 0.5, 0.7, 0.5) + "\n" + metrics_line(2, 0.6, 0.6, 0.6, 0.6) + "\n" +
                 metrics_line(3, 0.5, 0.7, 0.5, 0.7) + "\n" + metrics_line(2, 0.9, 0.61, 0.6, 0.6) + "\n" +
                 metrics_line(3, 0.4, 0.7, 0.5, 0.7) + "\n" + metrics_line(4, 0.3, 0.8, 0.4, 0.8) + "\n");
  const std::vector<EpochCurvePoint> points = read_learning_curves(dir.file("metrics.jsonl"));
  ASSERT_EQ(points.size(), 4u);
  for (std::size_t i = 0; i < points.size(); ++i) EXPECT_EQ(points[i].epoch, static_cast<int64_t>(i + 1));
  EXPECT_DOUBLE_EQ(points[1].loss, 0.9);
  EXPECT_DOUBLE_EQ(points[1].acc, 0.61);
  EXPECT_DOUBLE_EQ(points[2].loss, 0.4);

  write_learning_curves(dir.file("metrics.jsonl"), dir.file("curves.svg"));
  const std::string svg = read_text(dir.file("curves.svg"));
  const std::vector<Point> train = polyline(svg, "loss", "train");
  ASSERT_EQ(train.size(), 4u);
  EXPECT_NEAR(train[1].y, plot_area(svg, "loss").y, 0.01);  // epoch 2's 0.9 is now the highest loss
}

// A job stopped after writing epoch 3's line but before its checkpoint: the resume line from epoch 2's
// checkpoint drops epoch 3 until it is trained again, even where the new run stops before it.
TEST(LearningCurves, AResumeDropsTheEpochsItTrainsAgain) {
  TempDir dir;
  write_text(dir.file("metrics.jsonl"),
             metrics_line(1, 0.7, 0.5, 0.7, 0.5) + "\n" + metrics_line(2, 0.6, 0.6, 0.6, 0.6) + "\n" +
                 metrics_line(3, 0.5, 0.7, 0.5, 0.7) + "\n" + to_json(ResumeEvent{"", "t", 2, 0}) + "\n");
  std::vector<EpochCurvePoint> points = read_learning_curves(dir.file("metrics.jsonl"));
  ASSERT_EQ(points.size(), 2u);
  EXPECT_EQ(points[1].epoch, 2);
  // Another run's resume line says nothing of this run's epochs.
  write_text(dir.file("metrics.jsonl"), metrics_line(1, 0.7, 0.5, 0.7, 0.5) + "\n" +
                                            metrics_line(2, 0.6, 0.6, 0.6, 0.6) + "\n" +
                                            to_json(ResumeEvent{"other", "t", 1, 0}) + "\n");
  EXPECT_EQ(read_learning_curves(dir.file("metrics.jsonl")).size(), 2u);
}

std::string run_line(const std::string& run_id, int64_t epoch, double loss, const std::string& held_out) {
  EpochMetrics m;
  m.run_id = run_id;
  m.epoch = epoch;
  m.loss = loss;
  m.val_loss = loss + 0.1;
  m.held_out = held_out;
  return to_json(m);
}

TEST(LearningCurves, OnlyTheLastRunsLinesCount) {
  TempDir dir;
  // Lines of run a (3 epochs), then of run b (2 epochs): the file describes b.
  write_text(dir.file("metrics.jsonl"), run_line("a", 1, 0.9, "val") + "\n" + run_line("a", 2, 0.8, "val") +
                                            "\n" + run_line("a", 3, 0.7, "val") + "\n" +
                                            run_line("b", 1, 0.5, "test") + "\n" +
                                            run_line("b", 2, 0.4, "test") + "\n");
  const std::vector<EpochCurvePoint> points = read_learning_curves(dir.file("metrics.jsonl"));
  ASSERT_EQ(points.size(), 2u);
  EXPECT_DOUBLE_EQ(points[0].loss, 0.5);
  EXPECT_DOUBLE_EQ(points[1].loss, 0.4);
  EXPECT_DOUBLE_EQ(points[1].val_loss, 0.5);  // run b validated on /test: its test_loss is the held-out curve
}

TEST(LearningCurves, UnparsableLinesAreSkipped) {
  TempDir dir;
  std::string text = metrics_line(1, 0.7, 0.5, 0.7, 0.5) + "\n";
  text += "not json at all\n\n";
  text += "{\"epoch\": \"two\", \"loss\": 0.1}\n";               // no integer epoch
  text += "{\"epoch\": 2, \"loss\": 0.6, \"extra\": [1, 2]}\n";  // not flat
  text += metrics_line(2, 0.6, 0.6, 0.6, 0.6) + "\n";
  text += metrics_line(3, 0.5, 0.7, 0.5, 0.7) + "\n";
  text += metrics_line(4, 0.4, 0.8, 0.4, 0.8).substr(0, 60);  // half-written by a killed run
  write_text(dir.file("metrics.jsonl"), text);
  const std::vector<EpochCurvePoint> points = read_learning_curves(dir.file("metrics.jsonl"));
  ASSERT_EQ(points.size(), 3u);
  EXPECT_EQ(points.back().epoch, 3);
  EXPECT_DOUBLE_EQ(points[1].loss, 0.6);

  write_learning_curves(dir.file("metrics.jsonl"), dir.file("curves.svg"));
  const std::string svg = read_text(dir.file("curves.svg"));
  EXPECT_EQ(polyline(svg, "loss", "train").size(), 3u);
  EXPECT_TRUE(balanced_tags(svg));
}

TEST(LearningCurves, DivergedLossIsLeftOutOfItsCurveOnly) {
  TempDir dir;
  const double nan = std::numeric_limits<double>::quiet_NaN();
  write_text(dir.file("metrics.jsonl"), metrics_line(1, 0.7, 0.5, 0.7, 0.5) + "\n" +
                                            metrics_line(2, 0.6, 0.6, 0.6, 0.6) + "\n" +
                                            metrics_line(3, nan, 0.5, nan, 0.5) + "\n");
  write_learning_curves(dir.file("metrics.jsonl"), dir.file("curves.svg"));
  const std::string svg = read_text(dir.file("curves.svg"));
  EXPECT_EQ(polyline(svg, "loss", "train").size(), 2u);
  EXPECT_EQ(polyline(svg, "accuracy", "train").size(), 3u);
  EXPECT_EQ(svg.find("nan"), std::string::npos);
}

TEST(LearningCurves, OneEpochDrawsMarkersOnly) {
  TempDir dir;
  write_text(dir.file("metrics.jsonl"), metrics_line(1, 0.69, 0.52, 0.68, 0.55) + "\n");
  write_learning_curves(dir.file("metrics.jsonl"), dir.file("curves.svg"));
  const std::string svg = read_text(dir.file("curves.svg"));
  EXPECT_EQ(count(svg, "<polyline"), 0u);
  EXPECT_EQ(count(svg, "<circle"), 4u);  // train and validation, in both panels
  EXPECT_TRUE(balanced_tags(svg));
}

TEST(LearningCurves, NoEpochYetStillWritesAPlot) {
  TempDir dir;
  write_text(dir.file("metrics.jsonl"), "");
  write_learning_curves(dir.file("metrics.jsonl"), dir.file("curves.svg"));
  const std::string svg = read_text(dir.file("curves.svg"));
  EXPECT_EQ(count(svg, "<polyline"), 0u);
  EXPECT_TRUE(balanced_tags(svg));
}

TEST(LearningCurves, TitleNamesTheRunDirectoryEscaped) {
  TempDir dir;
  const std::filesystem::path run = dir.path() / "imdb&lstm<2>";
  std::filesystem::create_directories(run);
  write_text((run / "metrics.jsonl").string(), seven_epochs());
  write_text((run / "curves.svg").string(), "old plot");
  write_learning_curves((run / "metrics.jsonl").string(), (run / "curves.svg").string());
  const std::string svg = read_text((run / "curves.svg").string());
  EXPECT_NE(svg.find("<title>Learning curves: imdb&amp;lstm&lt;2&gt;</title>"), std::string::npos);
  EXPECT_EQ(svg.find("old plot"), std::string::npos);  // replaced
  EXPECT_TRUE(balanced_tags(svg));
}

TEST(LearningCurves, MissingFileIsAUserErrorNamingIt) {
  TempDir dir;
  try {
    write_learning_curves(dir.file("absent.jsonl"), dir.file("curves.svg"));
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("absent.jsonl"), std::string::npos) << e.what();
  }
  EXPECT_FALSE(std::filesystem::exists(dir.file("curves.svg")));
}

TEST(LearningCurves, UnwritablePlotIsAUserErrorNamingIt) {
  TempDir dir;
  write_text(dir.file("metrics.jsonl"), seven_epochs());
  const std::string target = dir.file("no-such-dir/curves.svg");
  try {
    write_learning_curves(dir.file("metrics.jsonl"), target);
    FAIL() << "no error";
  } catch (const UserError& e) {
    EXPECT_NE(std::string(e.what()).find("no-such-dir/curves.svg"), std::string::npos) << e.what();
  }
}

TEST(NiceTicks, FourToSixEvenlySpacedNiceValuesInsideTheRange) {
  const std::pair<double, double> ranges[] = {{0.26, 0.72},   {0.48, 0.86},  {0.9871, 0.9912},
                                              {0, 1},         {-3.5, 12.25}, {1234, 98765.5},
                                              {1e-6, 3.3e-6}, {0.69, 0.6931}};
  for (const auto& [lo, hi] : ranges) {
    const std::vector<double> ticks = nice_ticks(lo, hi, false);
    ASSERT_GE(ticks.size(), 4u) << lo << " " << hi;
    ASSERT_LE(ticks.size(), 6u) << lo << " " << hi;
    const double step = ticks[1] - ticks[0];
    const double mantissa = step / std::pow(10.0, std::floor(std::log10(step) + 1e-9));
    const double nice[] = {1, 1.5, 2, 2.5, 3, 4, 5, 6, 8};
    EXPECT_TRUE(std::any_of(std::begin(nice), std::end(nice),
                            [&](double m) { return std::abs(m - mantissa) < 1e-6; }))
        << "step " << step;
    for (std::size_t i = 0; i < ticks.size(); ++i) {
      EXPECT_GE(ticks[i], lo - 1e-9 * std::abs(hi - lo));
      EXPECT_LE(ticks[i], hi + 1e-9 * std::abs(hi - lo));
      if (i > 0) {
        EXPECT_NEAR(ticks[i] - ticks[i - 1], step, 1e-9 * step);
      }
    }
  }
}

TEST(NiceTicks, IntegerTicksForEpochs) {
  EXPECT_EQ(nice_ticks(1, 2, true), (std::vector<double>{1, 2}));
  EXPECT_EQ(nice_ticks(1, 10, true), (std::vector<double>{2, 4, 6, 8, 10}));
  for (const double last : {5.0, 7.0, 13.0, 40.0, 150.0, 1000.0}) {
    const std::vector<double> ticks = nice_ticks(1, last, true);
    ASSERT_FALSE(ticks.empty());
    for (const double t : ticks) EXPECT_EQ(t, std::round(t)) << last;
    EXPECT_LE(ticks.size(), 7u) << last;
  }
  EXPECT_TRUE(nice_ticks(1, 1, true).empty());  // no range, no ticks
}

}  // namespace
}  // namespace ddp::engine
