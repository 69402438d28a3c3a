// A one-line progress display for long commands: step/total, named metrics, rate and ETA.
// On a terminal it redraws in place; otherwise it prints a line every `print_every` updates.
#pragma once

#include <chrono>
#include <cstdio>
#include <string>

namespace paraflow {

class Progress {
 public:
  // `first`: where this session starts (a resumed run's step), so the rate counts its own work.
  Progress(std::string label, long total, long print_every = 1, long first = 0);
  // `metrics` is preformatted text such as "loss 3.21 | lr 6.0e-04".
  void update(long done, const std::string& metrics);
  void finish();

 private:
  std::string label_;
  long total_;
  long print_every_;
  long first_;
  bool interactive_;
  std::chrono::steady_clock::time_point start_;
};

std::string format_duration(double seconds);
// The time left at `done` of `total`, at the rate since `first` (0 before any work is done).
double remaining_seconds(double elapsed, long first, long done, long total);

}  // namespace paraflow
