// A one-line progress display for long commands: step/total, named metrics, rate and ETA.
// On a terminal it redraws in place; otherwise it prints a line every `print_every` updates.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace paraflow {

class Progress {
 public:
  Progress(std::string label, long total, long print_every = 1);
  // `metrics` is preformatted text such as "loss 3.21 | lr 6.0e-04".
  void update(long done, const std::string& metrics);
  void finish();

 private:
  std::string label_;
  long total_;
  long print_every_;
  bool interactive_;
  std::chrono::steady_clock::time_point start_;
};

std::string format_duration(double seconds);

}  // namespace paraflow
