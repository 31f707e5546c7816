// What the progress lines of training (engine/metrics.h) and of `prepare text` (io/text_corpus.cpp) share:
// one Keras-style bar, and durations and sizes written the same way everywhere.
#pragma once

#include <string>

namespace ddp::progress {

// "[==========>...................]": `fraction` (clamped to [0, 1]) of `width` cells done.
std::string bar(double fraction, int width = 30);

// A duration for a person: "12.3s" below 100 s, "734s" from there on.
std::string seconds_text(double seconds);

// A size for a person, in decimal units with three digits: "812 B", "61.2 kB", "12.3 MB", "1.50 GB".
std::string bytes_text(double bytes);

}  // namespace ddp::progress
