#include "engine/metrics.h"

#include <unistd.h>

#include <fmt/format.h>
#include <cerrno>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <optional>

#include "engine/base/errors.h"
#include "engine/base/json.h"
#include "engine/base/progress.h"

namespace ddp::engine {
namespace {

using progress::seconds_text;

constexpr std::chrono::seconds kAutoLineInterval{10};

}  // namespace

std::string format_epoch_line(const EpochMetrics& m) {
  const std::string resumed =
      m.steps_run > 0 && m.steps_run < m.steps ? fmt::format(" ({} after resuming)", m.steps_run) : "";
  return fmt::format(
             "Epoch {}/{} - {} step{}{} - {} - {:.2f}ms/step - loss: {:.4f} - acc: {:.4f} - {}_loss: {:.4f} "
             "- "
             "{}_acc: {:.4f}",
             m.epoch, m.epochs, m.steps, m.steps == 1 ? "" : "s", resumed, seconds_text(m.epoch_time_s),
             m.step_time_ms, nan_unsigned(m.loss), m.acc, m.held_out, nan_unsigned(m.val_loss), m.held_out,
             m.val_acc) +
         (m.val_macro_f1 >= 0 ? fmt::format(" - {}_macro_f1: {:.4f}", m.held_out, m.val_macro_f1) : "");
}

std::string to_json(const EpochMetrics& m) {
  json::Object line{{"run_id", m.run_id}, {"time", m.time},   {"epoch", m.epoch},
                    {"epochs", m.epochs}, {"steps", m.steps}, {"steps_run", m.steps_run}};
  json::put_number(line, "loss", m.loss);
  json::put_number(line, "acc", m.acc);
  json::put_number(line, m.held_out + "_loss", m.val_loss);
  json::put_number(line, m.held_out + "_acc", m.val_acc);
  if (m.val_macro_f1 >= 0) json::put_number(line, m.held_out + "_macro_f1", m.val_macro_f1);
  json::put_number(line, "epoch_time_s", m.epoch_time_s);
  json::put_number(line, "train_time_s", m.train_time_s);
  json::put_number(line, "eval_time_s", m.eval_time_s);
  json::put_number(line, "step_time_ms", m.step_time_ms);
  json::put_number(line, "samples_per_s", m.samples_per_s);
  json::put_number(line, "data_wait_s", m.data_wait_s);
  if (m.start_to_first_step_s >= 0) json::put_number(line, "start_to_first_step_s", m.start_to_first_step_s);
  line["world_size"] = m.world_size;
  line["workers"] = m.workers;
  line["backend"] = m.backend;
  line["device"] = m.device;
  if (m.gpu_util >= 0) {
    json::put_number(line, "gpu_util", m.gpu_util);
    json::put_number(line, "gpu_mem_mib", m.gpu_mem_mib);
  }
  if (m.loss_scale >= 0) {
    json::put_number(line, "loss_scale", m.loss_scale);
    line["skipped_steps"] = m.skipped_steps;
  }
  if (!m.parameters_checksum.empty()) line["parameters_checksum"] = m.parameters_checksum;
  return line.dump();
}

std::string parameters_checksum(std::span<const float> params) {
  uint64_t hash = 0xcbf29ce484222325ULL;
  const auto* bytes = reinterpret_cast<const unsigned char*>(params.data());
  for (std::size_t i = 0; i < params.size_bytes(); ++i) {
    hash ^= bytes[i];
    hash *= 0x100000001b3ULL;
  }
  return fmt::format("{:016x}", hash);
}

std::optional<std::size_t> first_other_checksum(const std::vector<std::string>& checksums) {
  for (std::size_t rank = 1; rank < checksums.size(); ++rank) {
    if (checksums[rank] != checksums[0]) return rank;
  }
  return std::nullopt;
}

std::string format_test_line(const TestMetrics& m) {
  const std::string f1 = m.test_macro_f1 >= 0 ? fmt::format(" - test_macro_f1: {:.4f}", m.test_macro_f1) : "";
  return fmt::format("Test (best.h5, epoch {}) - test_loss: {:.4f} - test_acc: {:.4f}{} ({} samples)",
                     m.best_epoch, nan_unsigned(m.test_loss), m.test_acc, f1, m.samples);
}

std::string to_json(const TestMetrics& m) {
  json::Object line{{"run_id", m.run_id},
                    {"time", m.time},
                    {"event", "test"},
                    {"checkpoint", "best.h5"},
                    {"best_epoch", m.best_epoch}};
  json::put_number(line, "test_loss", m.test_loss);
  json::put_number(line, "test_acc", m.test_acc);
  if (m.test_macro_f1 >= 0) json::put_number(line, "test_macro_f1", m.test_macro_f1);
  line["samples"] = m.samples;
  return line.dump();
}

std::string to_json(const ResumeEvent& e) {
  const json::Object line{{"run_id", e.run_id},
                          {"time", e.time},
                          {"event", "resume"},
                          {"epochs_done", e.epochs_done},
                          {"steps_done", e.steps_done}};
  return line.dump();
}

void append_line(const std::string& path, const std::string& line) {
  errno = 0;
  std::ofstream out(path, std::ios::app);
  out << line << '\n';
  out.flush();
  if (!out) {
    throw UserError(path + ": cannot append to this file (" + write_error_reason() + ")");
  }
}

namespace {

// The first line of the metrics.jsonl at `path` that parses to an object and meets `wanted`, or nothing. Only
// a plain file is read: a named pipe in its place would block (the run's first write says what is wrong with
// it, under the watchdog's phase for writes). Lines that do not parse are passed over.
template <typename Wanted>
std::optional<nlohmann::json> first_metrics_line(const std::string& path, Wanted&& wanted) {
  std::error_code ec;
  if (!std::filesystem::is_regular_file(path, ec)) return std::nullopt;
  std::ifstream in(path);
  for (std::string line; std::getline(in, line);) {
    nlohmann::json object = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (object.is_object() && wanted(object)) return object;
  }
  return std::nullopt;
}

}  // namespace

bool holds_test_score(const std::string& path, const std::string& run_id) {
  return first_metrics_line(path,
                            [&](const nlohmann::json& line) {
                              return line.value("event", "") == "test" && line.value("run_id", "") == run_id;
                            })
      .has_value();
}

std::string other_run_in_metrics(const std::string& path, const std::string& run_id) {
  const std::optional<nlohmann::json> other = first_metrics_line(path, [&](const nlohmann::json& line) {
    const std::string id = line.value("run_id", "");
    return !id.empty() && id != run_id;
  });
  return other ? other->value("run_id", "") : "";
}

bool live_progress(const std::string& log_progress) {
  if (log_progress == "bar") return true;
  if (log_progress == "lines") return false;
  return stdout_is_terminal();
}

double nan_unsigned(double value) {
  return std::isnan(value) ? std::fabs(value) : value;
}

bool stdout_is_terminal() {
  if (isatty(STDOUT_FILENO) == 0) return false;
  if (std::getenv("OMPI_COMM_WORLD_SIZE") == nullptr) return true;
  std::error_code ec;
  const std::string target =
      std::filesystem::read_symlink("/proc/" + std::to_string(getppid()) + "/fd/1", ec).string();
  return !ec && (target.rfind("/dev/pts/", 0) == 0 || target.rfind("/dev/tty", 0) == 0);
}

Progress::Progress(bool live, int64_t interval, int64_t epoch, int64_t epochs, int64_t total_steps)
    : live_(live),
      interval_(interval),
      epoch_(epoch),
      epochs_(epochs),
      total_(total_steps),
      start_(std::chrono::steady_clock::now()),
      last_draw_(start_) {}

bool Progress::due(int64_t step) const {
  if (live_)
    return step >= total_ || std::chrono::steady_clock::now() - last_draw_ >= std::chrono::milliseconds(100);
  if (interval_ > 0) return step % interval_ == 0;
  // No interval: a line now and then, so a long epoch never looks stuck.
  return step < total_ && std::chrono::steady_clock::now() - last_draw_ >= kAutoLineInterval;
}

void Progress::update(int64_t step, double loss, double acc) {
  if (!due(step)) return;
  const auto now = std::chrono::steady_clock::now();
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  if (live_) {
    last_draw_ = now;
    const double done = total_ > 0 ? static_cast<double>(step) / static_cast<double>(total_) : 1.0;
    const double eta =
        step > 0 ? elapsed * static_cast<double>(total_ - step) / static_cast<double>(step) : 0;
    std::fputs(
        fmt::format("\rEpoch {}/{} {}/{} {} - ETA: {} - loss: {:.4f} - acc: {:.4f}\033[K", epoch_, epochs_,
                    step, total_, progress::bar(done), seconds_text(eta), nan_unsigned(loss), acc)
            .c_str(),
        stdout);
    std::fflush(stdout);
    drawn_ = true;
  } else {
    last_draw_ = now;
    std::fputs(fmt::format("Epoch {}/{} - step {}/{} - {} - loss: {:.4f} - acc: {:.4f}\n", epoch_, epochs_,
                           step, total_, seconds_text(elapsed), nan_unsigned(loss), acc)
                   .c_str(),
               stdout);
    std::fflush(stdout);
  }
}

void Progress::finish() {
  if (drawn_) {
    std::printf("\r\033[K");
    std::fflush(stdout);
  }
}

}  // namespace ddp::engine
