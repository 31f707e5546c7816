#include "engine/metrics.h"

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "engine/base/errors.h"

namespace ddp::engine {
namespace {

std::string printf_string(const char* format, auto... args) {
  char buffer[512];
  std::snprintf(buffer, sizeof(buffer), format, args...);
  return buffer;
}

constexpr std::chrono::seconds kAutoLineInterval{10};

std::string seconds_text(double s) {
  return s < 100 ? printf_string("%.1fs", s) : printf_string("%.0fs", s);
}

}  // namespace

std::string format_epoch_line(const EpochMetrics& m) {
  const std::string resumed =
      m.steps_run > 0 && m.steps_run < m.steps
          ? printf_string(" (%lld after resuming)", static_cast<long long>(m.steps_run))
          : "";
  const char* held_out = m.held_out.c_str();
  return printf_string(
      "Epoch %lld/%lld - %lld steps%s - %s - %.2fms/step - loss: %.4f - acc: %.4f - %s_loss: %.4f - "
      "%s_acc: %.4f",
      static_cast<long long>(m.epoch), static_cast<long long>(m.epochs), static_cast<long long>(m.steps),
      resumed.c_str(), seconds_text(m.epoch_time_s).c_str(), m.step_time_ms, m.loss, m.acc, held_out,
      m.val_loss, held_out, m.val_acc);
}

std::string to_json(const EpochMetrics& m) {
  const std::string gpu = m.gpu_util < 0 ? std::string()
                                         : printf_string(", \"gpu_util\": %.1f, \"gpu_mem_mib\": %.0f",
                                                         m.gpu_util, m.gpu_mem_mib);
  const char* held_out = m.held_out.c_str();
  return printf_string(
      "{\"run_id\": \"%s\", \"time\": \"%s\", \"epoch\": %lld, \"epochs\": %lld, \"steps\": %lld, "
      "\"steps_run\": %lld, \"loss\": %.6f, \"acc\": %.6f, \"%s_loss\": %.6f, \"%s_acc\": %.6f, "
      "\"epoch_time_s\": %.4f, \"train_time_s\": %.4f, \"eval_time_s\": %.4f, \"step_time_ms\": %.4f, "
      "\"samples_per_s\": %.1f, \"data_wait_s\": %.4f, \"world_size\": %d, \"workers\": %d, "
      "\"backend\": \"%s\", \"device\": \"%s\"%s}",
      m.run_id.c_str(), m.time.c_str(), static_cast<long long>(m.epoch), static_cast<long long>(m.epochs),
      static_cast<long long>(m.steps), static_cast<long long>(m.steps_run), m.loss, m.acc, held_out,
      m.val_loss, held_out, m.val_acc, m.epoch_time_s, m.train_time_s, m.eval_time_s, m.step_time_ms,
      m.samples_per_s, m.data_wait_s, m.world_size, m.workers, m.backend.c_str(), m.device.c_str(),
      gpu.c_str());
}

std::string format_test_line(const TestMetrics& m) {
  return printf_string("Test (best.h5, epoch %lld) - test_loss: %.4f - test_acc: %.4f (%lld samples)",
                       static_cast<long long>(m.best_epoch), m.test_loss, m.test_acc,
                       static_cast<long long>(m.samples));
}

std::string to_json(const TestMetrics& m) {
  return printf_string(
      "{\"run_id\": \"%s\", \"time\": \"%s\", \"event\": \"test\", \"checkpoint\": \"best.h5\", "
      "\"best_epoch\": %lld, \"test_loss\": %.6f, \"test_acc\": %.6f, \"samples\": %lld}",
      m.run_id.c_str(), m.time.c_str(), static_cast<long long>(m.best_epoch), m.test_loss, m.test_acc,
      static_cast<long long>(m.samples));
}

void append_line(const std::string& path, const std::string& line) {
  std::ofstream out(path, std::ios::app);
  out << line << '\n';
  out.flush();
  if (!out) throw UserError(path + ": cannot append to this file");
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
    constexpr int kWidth = 30;
    const int filled = total_ > 0 ? static_cast<int>(kWidth * step / total_) : kWidth;
    std::string bar(static_cast<std::size_t>(filled), '=');
    if (filled < kWidth) bar += '>' + std::string(static_cast<std::size_t>(kWidth - filled - 1), '.');
    const double eta =
        step > 0 ? elapsed * static_cast<double>(total_ - step) / static_cast<double>(step) : 0;
    std::printf("\rEpoch %lld/%lld %lld/%lld [%s] - ETA: %s - loss: %.4f - acc: %.4f\033[K",
                static_cast<long long>(epoch_), static_cast<long long>(epochs_), static_cast<long long>(step),
                static_cast<long long>(total_), bar.c_str(), seconds_text(eta).c_str(), loss, acc);
    std::fflush(stdout);
    drawn_ = true;
  } else {
    last_draw_ = now;
    std::printf("Epoch %lld/%lld - step %lld/%lld - %s - loss: %.4f - acc: %.4f\n",
                static_cast<long long>(epoch_), static_cast<long long>(epochs_), static_cast<long long>(step),
                static_cast<long long>(total_), seconds_text(elapsed).c_str(), loss, acc);
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
