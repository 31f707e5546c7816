// A shared library the binary opens while it runs rather than when it starts: the GPU path's cuDNN and NCCL.
// A build with CUDA then starts, trains and runs check-env on nodes that have neither, and says which library
// is missing only when a GPU is asked for (the loader would otherwise stop the process before main()).
#pragma once

#include <string>
#include <type_traits>
#include <vector>

namespace ddp::base {

class RuntimeLibrary {
 public:
  // Opens the first of `candidates` that loads: a soname for the loader's own search (LD_LIBRARY_PATH,
  // ld.so.cache), then fallbacks such as the path found at build time.
  explicit RuntimeLibrary(std::vector<std::string> candidates);
  RuntimeLibrary(const RuntimeLibrary&) = delete;
  RuntimeLibrary& operator=(const RuntimeLibrary&) = delete;
  ~RuntimeLibrary();  // leaves the library loaded: its code may run until the process ends

  bool loaded() const { return handle_ != nullptr; }
  // The first candidate: the name a user installs or puts on LD_LIBRARY_PATH.
  const std::string& name() const { return candidates_.front(); }
  // Empty when loaded; else "libx.so.1 could not be loaded (the loader's words)".
  const std::string& why_not_loaded() const { return why_not_; }
  // The address of `symbol`, or nullptr when the library did not load or lacks it.
  void* symbol(const char* symbol) const;

 private:
  std::vector<std::string> candidates_;
  void* handle_ = nullptr;
  std::string why_not_;
};

// The body of a function that stands in for its namesake in `library` (the code calls cuDNN's and NCCL's
// functions by their own names, and the build links these stand-ins instead of the libraries): calls the
// library's function, looked up once, or returns `missing` (converted to the result's type) when the library
// or the symbol is absent.
template <auto Function, typename Missing, typename... Args>
std::invoke_result_t<decltype(Function), Args...> call_loaded(const RuntimeLibrary& library, const char* name,
                                                              Missing missing, Args... args) {
  using Pointer = decltype(Function);
  static const auto loaded = reinterpret_cast<Pointer>(library.symbol(name));
  if (loaded == nullptr) return missing;
  return loaded(args...);
}

}  // namespace ddp::base
