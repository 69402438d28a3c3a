#include "base/progress.h"

#include <fmt/format.h>
#include <unistd.h>

namespace paraflow {

std::string format_duration(double seconds) {
  long total = static_cast<long>(seconds + 0.5);
  if (total >= 3600) return fmt::format("{}h{:02}m", total / 3600, (total / 60) % 60);
  if (total >= 60) return fmt::format("{}m{:02}s", total / 60, total % 60);
  return fmt::format("{}s", total);
}

double remaining_seconds(double elapsed, long first, long done, long total) {
  return done > first ? elapsed / static_cast<double>(done - first) * static_cast<double>(total - done) : 0.0;
}

Progress::Progress(std::string label, long total, long print_every, long first)
    : label_(std::move(label)),
      total_(total),
      print_every_(print_every < 1 ? 1 : print_every),
      first_(first),
      interactive_(::isatty(STDERR_FILENO) == 1),
      start_(std::chrono::steady_clock::now()) {}

void Progress::update(long done, const std::string& metrics) {
  if (!interactive_ && done % print_every_ != 0 && done != total_) return;
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  const double eta = remaining_seconds(elapsed, first_, done, total_);
  std::string line = fmt::format("{} {}/{} | {} | ETA {}", label_, done, total_, metrics, format_duration(eta));
  if (interactive_) {
    fmt::print(stderr, "\r\033[K{}", line);
  } else {
    fmt::print(stderr, "{}\n", line);
  }
  std::fflush(stderr);
}

void Progress::finish() {
  if (interactive_) fmt::print(stderr, "\n");
}

}  // namespace paraflow
