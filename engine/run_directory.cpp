#include "engine/run_directory.h"

#include <fcntl.h>
#include <fmt/format.h>
#include <sys/file.h>
#include <unistd.h>
#include <nlohmann/json.hpp>

#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <ctime>
#include <fstream>
#include <map>
#include <mutex>
#include <random>
#include <system_error>

#include "engine/base/errors.h"
#include "engine/base/file_kind.h"

namespace fs = std::filesystem;

namespace ddp::engine {
namespace {

std::string format_utc(const char* format) {
  const std::time_t now = std::chrono::system_clock::to_time_t(std::chrono::system_clock::now());
  std::tm utc{};
  gmtime_r(&now, &utc);
  char text[32];
  std::strftime(text, sizeof(text), format, &utc);
  return text;
}

// The results present in the directory, by file name: "last.h5, metrics.jsonl".
std::string present_results(const RunFiles& files) {
  std::string names;
  for (const std::string& path : files.results()) {
    std::error_code ec;
    if (!fs::exists(path, ec)) continue;
    names += (names.empty() ? "" : ", ") + fs::path(path).filename().string();
  }
  return names;
}

// What the run will write, checked before it trains rather than met after its first epoch: no file it
// replaces may be anything but a plain file or a link (a rename over a named pipe or a device would replace
// the node), metrics.jsonl must take appends (a named pipe to a live reader does, a directory does not), and
// the directory must take new files (each checkpoint goes through PATH.tmp, renamed).
void check_run_outputs(const RunFiles& files) {
  std::error_code ec;
  std::vector<std::string> written = files.results();
  written.push_back(files.config());  // rewritten at every start
  for (const std::string& path : written) {
    for (const std::string& file : {path, path + ".tmp"}) {
      const std::string kind = special_file_kind(file, /*follow_links=*/false);
      const bool appended = file == files.metrics();  // appended to, never replaced
      if (kind.empty() || (appended && !fs::is_directory(fs::symlink_status(file, ec)))) continue;
      throw UserError(file + ": not a plain file (" + kind +
                      "), where the run writes one: move it out of checkpoint.dir");
    }
  }
  if (fs::exists(files.metrics(), ec) && access(files.metrics().c_str(), W_OK) != 0) {
    throw UserError(files.metrics() + ": cannot append to it (" + std::strerror(errno) + ")");
  }
  if (access(files.dir.c_str(), W_OK | X_OK) != 0) {
    throw UserError("checkpoint.dir = " + files.dir.string() + ": cannot write files in it (" +
                    std::strerror(errno) + ")");
  }
}

}  // namespace

RunDirectoryLock::RunDirectoryLock(const RunFiles& files) {
  const std::string path = (files.dir / ".lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (fd_ < 0) {
    throw UserError(
        fmt::format("checkpoint.dir = {}: cannot open {} to claim the directory for this run ({})",
                    files.dir.string(), path, std::strerror(errno)));
  }
  if (::flock(fd_, LOCK_EX | LOCK_NB) != 0) {
    const int error = errno;
    if (error == EWOULDBLOCK) {
      char holder[256] = {};
      const ssize_t got = ::pread(fd_, holder, sizeof(holder) - 1, 0);
      std::string who = got > 0 ? std::string(holder, static_cast<std::size_t>(got)) : "";
      while (!who.empty() && (who.back() == '\n' || who.back() == '\0')) who.pop_back();
      ::close(fd_);
      fd_ = -1;
      throw UserError(fmt::format(
          "checkpoint.dir = {}: another run is using this directory{}; wait for it to end (then --resume "
          "continues it) or give this run another checkpoint.dir",
          files.dir.string(), who.empty() ? "" : " (" + who + ")"));
    }
    std::printf(
        "note: checkpoint.dir = %s: cannot lock %s (%s), so nothing stops another run from using the "
        "directory at the same time\n",
        files.dir.string().c_str(), path.c_str(), std::strerror(error));
    return;
  }
  // Who holds it, for the message of a run that finds it held (the lock holds without the words too).
  const std::string who = fmt::format("pid {} on host {}", ::getpid(), host_name());
  if (::ftruncate(fd_, 0) == 0) {
    [[maybe_unused]] const ssize_t written = ::pwrite(fd_, who.data(), who.size(), 0);
  }
}

std::shared_ptr<RunDirectoryLock> RunDirectoryLock::hold(const RunFiles& files) {
  static std::mutex mutex;
  static std::map<std::string, std::weak_ptr<RunDirectoryLock>> held;  // by the directory's canonical path
  std::error_code ec;
  fs::create_directories(files.dir, ec);
  if (ec) {
    throw UserError("checkpoint.dir = " + files.dir.string() + ": cannot create it (" + ec.message() + ")");
  }
  const fs::path canonical = fs::weakly_canonical(files.dir, ec);
  const std::string key = ec ? files.dir.string() : canonical.string();
  std::lock_guard<std::mutex> lock(mutex);
  if (std::shared_ptr<RunDirectoryLock> existing = held[key].lock()) return existing;
  auto taken = std::make_shared<RunDirectoryLock>(files);
  held[key] = taken;
  return taken;
}

RunDirectoryLock::~RunDirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // releases the lock
}

namespace {

// Whether metrics.jsonl (absent, or the only result there besides curves.svg) is the log of a run that never
// had a checkpoint: no test line, and at most the first epoch's line of its last run (written just before
// that epoch's checkpoint; a second epoch's line means the first checkpoint had landed).
bool log_of_a_run_without_checkpoint(const RunFiles& files) {
  std::ifstream in(files.metrics());
  std::string run_id;
  int epochs = 0;
  for (std::string line; std::getline(in, line);) {
    const nlohmann::json object = nlohmann::json::parse(line, nullptr, /*allow_exceptions=*/false);
    if (!object.is_object()) continue;
    if (object.value("event", "") == "test") return false;
    if (!object.contains("epoch")) continue;
    const std::string id = object.value("run_id", "");
    if (id != run_id) epochs = 0;
    run_id = id;
    ++epochs;
  }
  return epochs <= 1;
}

}  // namespace

[[noreturn]] void throw_nothing_to_resume(const RunFiles& files, const std::string& why) {
  throw UserError(files.last() + ": --resume was given but there is no checkpoint to resume from" + why);
}

void refuse_resume_of_missing_directory(const RunFiles& files, const std::string& resume) {
  std::error_code ec;
  if (resume == "last" && !fs::exists(files.dir, ec)) {
    throw_nothing_to_resume(files, " (no folder " + files.dir.string() + ")");
  }
}

bool claim_run_directory(const RunFiles& files, const std::string& resume, bool overwrite) {
  check_run_outputs(files);
  std::error_code ec;
  const bool has_last = fs::exists(files.last(), ec);
  if (resume == "last" && !has_last) throw_nothing_to_resume(files, "");
  if (resume == "last" || (resume == "auto" && has_last)) {
    if (overwrite) {
      std::printf("note: %s is resumed; checkpoint.overwrite = true is for starting afresh and has no say\n",
                  files.last().c_str());
    }
    return true;
  }

  const std::string present = present_results(files);
  if (present.empty()) return false;
  // A run killed before its first checkpoint landed leaves its log alone: nothing to continue, and a batch
  // job requeued with --resume auto must not be stuck on it. The new run's lines follow under its own run id
  // (the curves draw the last run's).
  if (resume == "auto" && !overwrite && !fs::exists(files.best(), ec) &&
      log_of_a_run_without_checkpoint(files)) {
    std::printf(
        "note: checkpoint.dir = %s holds the log of a run that ended before its first checkpoint (%s): "
        "nothing to resume, so this run starts afresh and appends its own lines\n",
        files.dir.string().c_str(), present.c_str());
    return false;
  }
  if (!overwrite) {
    throw UserError(
        "checkpoint.dir = " + files.dir.string() + " holds another run (" + present +
        "): " + (has_last ? "continue it with --resume, " : "") +
        "give this run its own checkpoint.dir, or replace the old one with --checkpoint.overwrite "
        "true");
  }
  for (const std::string& path : files.results()) {
    fs::remove(path, ec);
    if (ec) throw UserError(path + ": cannot remove the old run's file (" + ec.message() + ")");
  }
  std::printf("checkpoint.overwrite: removed the previous run's %s from %s\n", present.c_str(),
              files.dir.string().c_str());
  return false;
}

std::string new_run_id() {
  std::random_device entropy;
  return format_utc("%Y%m%dT%H%M%SZ") + "-" +
         fmt::format("{:04x}", static_cast<unsigned>(entropy() & 0xFFFFu));
}

std::string utc_timestamp() {
  return format_utc("%Y-%m-%dT%H:%M:%SZ");
}

std::string inside_run_directory(const std::string& dir, const std::string& path) {
  if (path.empty() || fs::path(path).is_absolute()) return path;
  return (fs::path(dir) / path).string();
}

}  // namespace ddp::engine
