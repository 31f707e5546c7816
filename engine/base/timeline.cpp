#include "engine/base/timeline.h"

#include <atomic>
#include <condition_variable>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <mutex>
#include <sstream>
#include <thread>
#include <utility>

#include "engine/base/errors.h"
#include "engine/base/file_kind.h"
#include "engine/base/json.h"

namespace ddp::timeline {
namespace {

struct Event {
  const char* name;
  Clock::time_point begin;
  Clock::time_point end;
  int track;
  int64_t arg;
  TimeResolver resolve;  // a deferred span: sets begin and end on the writer thread
};

struct TrackName {
  int track;
  std::string name;
};

// The trace goes to `path` at the end of the run, renamed over what is there: checked now, not after
// training. Only a trace of an earlier run may be replaced (write_trace's files begin "[\n" and then an event
// or the closing bracket), so a log.timeline that names the run's checkpoint, its dataset or its config
// stops the run instead of destroying them; nor a directory, a named pipe or a device.
void refuse_to_replace(const std::string& path) {
  const std::string what = "log.timeline = " + path + ": ";
  if (const std::string kind = special_file_kind(path, /*follow_links=*/false); !kind.empty())
    throw UserError(what + "not a plain file (" + kind + "), where the run writes its trace file");
  std::error_code error;
  if (!std::filesystem::exists(std::filesystem::symlink_status(path, error))) return;
  std::ifstream in(path, std::ios::binary);
  char head[3] = {};
  in.read(head, sizeof(head));
  const bool trace =
      in.gcount() == 3 && head[0] == '[' && head[1] == '\n' && (head[2] == '{' || head[2] == '\n');
  if (!trace) {
    throw UserError(what +
                    "exists and is no trace of an earlier run, which the run's trace would replace: name "
                    "another file (a relative path lands in checkpoint.dir)");
  }
}

// trace.json's n-th earlier name: trace.<n>.json.
std::filesystem::path numbered_trace(const std::filesystem::path& path, int n) {
  std::filesystem::path numbered = path;
  numbered.replace_filename(path.stem().string() + "." + std::to_string(n) + path.extension().string());
  return numbered;
}

// A run that crashed left this rank's part file (its events up to the crash); the resumed run keeps it as
// trace.<n>.json.rank<R>.part, beside the trace.<n>.json an earlier run that finished leaves, instead of
// writing over it.
void keep_crashed_part(const std::string& path, int rank) {
  namespace fs = std::filesystem;
  const std::string part_name = ".rank" + std::to_string(rank) + ".part";
  std::error_code error;
  if (!fs::exists(fs::symlink_status(path + part_name, error))) return;
  for (int n = 1;; ++n) {
    const std::string kept = numbered_trace(path, n).string() + part_name;
    if (fs::exists(fs::symlink_status(kept, error)) ||
        fs::exists(fs::symlink_status(numbered_trace(path, n), error)))
      continue;
    fs::rename(path + part_name, kept, error);
    if (error) {
      throw UserError("log.timeline = " + path + ": cannot keep the crashed run's " + path + part_name +
                      " as " + kept + " (" + error.message() + ")");
    }
    return;
  }
}

class Recorder {
 public:
  std::atomic<bool> on{false};

  // A run that ends on an error leaves through main() without finish(): its writer thread stops here (a
  // joinable thread destroyed at exit would abort the process) and its part file goes.
  ~Recorder() {
    if (!on.exchange(false)) return;
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    writer_.join();
    std::fclose(part_);
    std::error_code ignored;
    std::filesystem::remove(part_path_, ignored);
  }

  void start(const std::string& path, int rank, const std::string& process_label) {
    std::lock_guard<std::mutex> lock(mutex_);
    DDP_CHECK(!on.load());
    refuse_to_replace(path);
    keep_crashed_part(path, rank);
    rank_ = rank;
    origin_ = Clock::now();
    part_path_ = path + ".rank" + std::to_string(rank) + ".part";
    part_ = std::fopen(part_path_.c_str(), "w");
    if (part_ == nullptr) throw UserError("log.timeline = " + path + ": cannot write " + part_path_);
    write_event({{"name", "process_name"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"name", process_label}}}});
    write_event(
        {{"name", "process_sort_index"}, {"ph", "M"}, {"pid", rank_}, {"args", {{"sort_index", rank_}}}});
    stopping_ = false;
    writer_ = std::thread([this] { write_loop(); });
    on.store(true);
  }

  std::string finish() {
    if (!on.exchange(false)) return "";
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    wake_.notify_one();
    writer_.join();
    std::fclose(part_);
    part_ = nullptr;
    std::ifstream in(part_path_);
    std::stringstream text;
    text << in.rdbuf();
    in.close();
    std::error_code ignored;
    std::filesystem::remove(part_path_, ignored);
    std::string events = text.str();
    while (!events.empty() && (events.back() == '\n' || events.back() == ',')) events.pop_back();
    return events;
  }

  void record(const Event& event) {
    std::lock_guard<std::mutex> lock(mutex_);
    buffer_.push_back(event);
  }

  int track(const std::string& name) {
    std::lock_guard<std::mutex> lock(mutex_);
    auto [it, added] = tracks_.try_emplace(name, static_cast<int>(tracks_.size()) + 1);
    if (added) new_tracks_.push_back({it->second, name});
    return it->second;
  }

 private:
  // Chrome's trace format counts microseconds; nanoseconds are the clock's resolution.
  static double microseconds(Clock::duration d) {
    return static_cast<double>(std::chrono::duration_cast<std::chrono::nanoseconds>(d).count()) / 1000.0;
  }

  // One event, one line of the rank's part file (the lines are joined into a JSON array at the end).
  void write_event(const json::Object& event) {
    const std::string line = event.dump() + ",\n";
    std::fwrite(line.data(), 1, line.size(), part_);
  }

  void write_loop() {
    std::vector<Event> events;
    std::vector<TrackName> names;
    bool last = false;
    while (!last) {
      {
        std::unique_lock<std::mutex> lock(mutex_);
        wake_.wait_for(lock, std::chrono::milliseconds(100), [this] { return stopping_; });
        last = stopping_;
        events.swap(buffer_);
        names.swap(new_tracks_);
      }
      for (const TrackName& t : names) {
        write_event({{"name", "thread_name"},
                     {"ph", "M"},
                     {"pid", rank_},
                     {"tid", t.track},
                     {"args", {{"name", t.name}}}});
        write_event({{"name", "thread_sort_index"},
                     {"ph", "M"},
                     {"pid", rank_},
                     {"tid", t.track},
                     {"args", {{"sort_index", t.track}}}});
      }
      for (Event& e : events) {
        if (e.resolve && !e.resolve(e.begin, e.end)) continue;
        json::Object span{{"name", e.name},
                          {"ph", "X"},
                          {"pid", rank_},
                          {"tid", e.track},
                          {"ts", microseconds(e.begin - origin_)},
                          {"dur", microseconds(e.end - e.begin)}};
        if (e.arg >= 0) span["args"] = {{"value", e.arg}};
        write_event(span);
      }
      std::fflush(part_);
      events.clear();
      names.clear();
    }
  }

  std::mutex mutex_;
  std::condition_variable wake_;
  bool stopping_ = false;
  std::vector<Event> buffer_;
  std::vector<TrackName> new_tracks_;
  std::map<std::string, int> tracks_;
  std::thread writer_;
  std::FILE* part_ = nullptr;
  std::string part_path_;
  int rank_ = 0;
  Clock::time_point origin_;
};

Recorder& recorder() {
  static Recorder r;
  return r;
}

thread_local int this_thread_track = 0;
std::atomic<int> unnamed_threads{0};

int thread_track() {
  if (this_thread_track == 0) {
    this_thread_track = recorder().track("thread " + std::to_string(unnamed_threads.fetch_add(1) + 1));
  }
  return this_thread_track;
}

}  // namespace

bool enabled() {
  return recorder().on.load(std::memory_order_relaxed);
}

void start(const std::string& path, int rank, const std::string& process_label) {
  recorder().start(path, rank, process_label);
  name_this_thread("main");
}

std::string finish() {
  return recorder().finish();
}

void write_trace(const std::string& path, const std::vector<std::string>& ranks_events) {
  const std::string tmp = path + ".tmp";
  {
    std::ofstream out(tmp);
    out << "[\n";
    bool first = true;
    for (const std::string& events : ranks_events) {
      if (events.empty()) continue;
      out << (first ? "" : ",\n") << events;
      first = false;
    }
    out << "\n]\n";
    out.flush();
    if (!out) {
      std::error_code ignored;
      std::filesystem::remove(tmp, ignored);
      throw UserError("log.timeline = " + path + ": cannot write " + tmp);
    }
  }
  std::error_code error;
  std::filesystem::rename(tmp, path, error);
  if (error) {
    std::error_code ignored;
    std::filesystem::remove(tmp, ignored);  // nothing of a failed write is left beside `path`
    throw UserError("log.timeline = " + path + ": cannot move " + tmp + " into place (" + error.message() +
                    ")");
  }
}

std::string keep_earlier_trace(const std::string& path) {
  namespace fs = std::filesystem;
  std::error_code error;
  if (!fs::exists(fs::symlink_status(path, error))) return "";
  const fs::path original(path);
  for (int n = 1;; ++n) {
    const fs::path numbered = numbered_trace(original, n);
    // A crashed run's parts may hold that number already (keep_crashed_part).
    if (fs::exists(fs::symlink_status(numbered, error)) ||
        fs::exists(fs::symlink_status(numbered.string() + ".rank0.part", error)))
      continue;
    fs::rename(original, numbered, error);
    if (error) {
      throw UserError("log.timeline = " + path + ": cannot keep the earlier trace as " + numbered.string() +
                      " (" + error.message() + ")");
    }
    return numbered.string();
  }
}

int remove_earlier_traces(const std::string& path) {
  namespace fs = std::filesystem;
  const fs::path original(path);
  const std::string stem = original.stem().string() + ".";
  const std::string extension = original.extension().string();
  const auto numbered_name = [&](std::string name) {
    if (const std::size_t part = name.find(".rank"); part != std::string::npos && name.ends_with(".part")) {
      const std::string rank = name.substr(part + 5, name.size() - part - 5 - 5);
      if (rank.empty() || rank.find_first_not_of("0123456789") != std::string::npos) return false;
      name.resize(part);
    }
    if (!name.starts_with(stem) || !name.ends_with(extension) ||
        name.size() <= stem.size() + extension.size())
      return false;
    const std::string number = name.substr(stem.size(), name.size() - stem.size() - extension.size());
    return number.find_first_not_of("0123456789") == std::string::npos;
  };
  std::error_code error;
  int removed = 0;
  const fs::path folder = original.has_parent_path() ? original.parent_path() : fs::path(".");
  for (const fs::directory_entry& entry : fs::directory_iterator(folder, error)) {
    if (!entry.is_regular_file(error) || !numbered_name(entry.path().filename().string())) continue;
    if (fs::remove(entry.path(), error)) ++removed;
  }
  return removed;
}

void name_this_thread(const char* name) {
  this_thread_track = recorder().track(name);
}

int track(const char* kind, int index) {
  return recorder().track(std::string(kind) + " " + std::to_string(index));
}

void record(const char* name, Clock::time_point begin, Clock::time_point end, int track_id, int64_t arg) {
  if (!enabled()) return;
  recorder().record({name, begin, end, track_id >= 0 ? track_id : thread_track(), arg, {}});
}

void record_deferred(const char* name, int track_id, TimeResolver resolve) {
  if (!enabled()) return;
  recorder().record({name, {}, {}, track_id, -1, std::move(resolve)});
}

}  // namespace ddp::timeline
