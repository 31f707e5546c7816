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

class Recorder {
 public:
  std::atomic<bool> on{false};

  void start(const std::string& path, int rank, const std::string& process_label) {
    std::lock_guard<std::mutex> lock(mutex_);
    DDP_CHECK(!on.load());
    rank_ = rank;
    origin_ = Clock::now();
    part_path_ = path + ".rank" + std::to_string(rank) + ".part";
    part_ = std::fopen(part_path_.c_str(), "w");
    if (part_ == nullptr) throw UserError("log.timeline = " + path + ": cannot write " + part_path_);
    std::fprintf(part_,
                 "{\"name\": \"process_name\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"name\": \"%s\"}},\n",
                 rank_, process_label.c_str());
    std::fprintf(
        part_,
        "{\"name\": \"process_sort_index\", \"ph\": \"M\", \"pid\": %d, \"args\": {\"sort_index\": %d}},\n",
        rank_, rank_);
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
        std::fprintf(
            part_,
            "{\"name\": \"thread_name\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, \"args\": {\"name\": "
            "\"%s\"}},\n{\"name\": \"thread_sort_index\", \"ph\": \"M\", \"pid\": %d, \"tid\": %d, "
            "\"args\": {\"sort_index\": %d}},\n",
            rank_, t.track, t.name.c_str(), rank_, t.track, t.track);
      }
      for (Event& e : events) {
        if (e.resolve && !e.resolve(e.begin, e.end)) continue;
        const double ts = std::chrono::duration<double, std::micro>(e.begin - origin_).count();
        const double dur = std::chrono::duration<double, std::micro>(e.end - e.begin).count();
        if (e.arg >= 0) {
          std::fprintf(
              part_,
              "{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f, "
              "\"args\": {\"value\": %lld}},\n",
              e.name, rank_, e.track, ts, dur, static_cast<long long>(e.arg));
        } else {
          std::fprintf(
              part_,
              "{\"name\": \"%s\", \"ph\": \"X\", \"pid\": %d, \"tid\": %d, \"ts\": %.3f, \"dur\": %.3f},\n",
              e.name, rank_, e.track, ts, dur);
        }
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
    if (!out) throw UserError("log.timeline = " + path + ": cannot write " + tmp);
  }
  std::error_code error;
  std::filesystem::rename(tmp, path, error);
  if (error)
    throw UserError("log.timeline = " + path + ": cannot move " + tmp + " into place (" + error.message() +
                    ")");
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
