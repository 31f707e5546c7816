# DDPTRAIN_FUZZ: every library is compiled with libFuzzer's coverage hooks (-fsanitize=fuzzer-no-link) and
# ASan + UBSan, so the targets of tests/fuzz find memory errors, undefined behaviour and leaks in the
# project's own readers. Included from the top-level CMakeLists.txt before any target is declared.
if(NOT CMAKE_CXX_COMPILER_ID MATCHES "Clang" OR NOT CMAKE_C_COMPILER_ID MATCHES "Clang")
  message(FATAL_ERROR "DDPTRAIN_FUZZ=ON needs clang with libFuzzer (C ${CMAKE_C_COMPILER_ID}, C++ "
                      "${CMAKE_CXX_COMPILER_ID} found): configure with CC=clang-14 CXX=clang++-14 "
                      "(Debian: clang-14 libclang-rt-14-dev)")
endif()
set(DDPTRAIN_SANITIZE ON)
add_compile_options(-fsanitize=fuzzer-no-link)
# libomp keeps its thread pool's bookkeeping until after LeakSanitizer's exit check, which then reports it
# as leaked, and inside a parallel region LSan cannot tell that from a leak of ours: this build runs the
# compute loops serially (engine/base/parallel_loops_serial.cpp). No reader of outside data uses them.
set(CMAKE_DISABLE_FIND_PACKAGE_OpenMP ON)
