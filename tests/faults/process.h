// Runs a command line as a real child process (through /bin/sh) with a deadline, capturing its
// output: the fault-injection tests judge how paraflow ends, not only whether it does.
#pragma once

#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <filesystem>
#include <functional>
#include <string>
#include <thread>

#include "base/file_io.h"

namespace paraflow::testing {

struct Ended {
  int exit_code = -1;     // when it exited
  int signal = 0;         // when a signal ended it (a crash, unless the test sent it)
  bool timed_out = false; // killed at the deadline (a hang)
  std::string output;     // stdout and stderr
};

class Process {
 public:
  Process(const std::string& command, const std::filesystem::path& output_file) : output_file_(output_file) {
    pid_ = fork();
    if (pid_ == 0) {
      setpgid(0, 0);  // its own group, so a hang's whole tree can be killed
      const std::string redirected = "exec " + command + " > '" + output_file.string() + "' 2>&1";
      execl("/bin/sh", "sh", "-c", redirected.c_str(), nullptr);
      _exit(127);
    }
  }
  pid_t pid() const { return pid_; }
  void signal(int number) const { kill(pid_, number); }
  bool finished() {
    if (done_) return true;
    int status = 0;
    if (waitpid(pid_, &status, WNOHANG) != pid_) return false;
    record(status);
    return true;
  }
  // Waits up to `deadline`, then kills the process group and reports a hang.
  Ended wait(std::chrono::duration<double> deadline) {
    const auto until = std::chrono::steady_clock::now() + deadline;
    while (!finished()) {
      if (std::chrono::steady_clock::now() > until) {
        kill(-pid_, SIGKILL);
        kill(pid_, SIGKILL);
        int status = 0;
        waitpid(pid_, &status, 0);
        ended_.timed_out = true;
        done_ = true;
        break;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(20));
    }
    ended_.output = std::filesystem::exists(output_file_) ? read_file(output_file_) : "";
    return ended_;
  }

 private:
  void record(int status) {
    if (WIFEXITED(status)) ended_.exit_code = WEXITSTATUS(status);
    if (WIFSIGNALED(status)) ended_.signal = WTERMSIG(status);
    done_ = true;
  }
  std::filesystem::path output_file_;
  pid_t pid_ = -1;
  bool done_ = false;
  Ended ended_;
};

inline Ended run_process(const std::string& command, const std::filesystem::path& output_file,
                         std::chrono::duration<double> deadline) {
  return Process(command, output_file).wait(deadline);
}

// What the suite counts as a failure however a command ends: a crash, a hang, or a library's
// raw exception text instead of a paraflow message.
inline void expect_clean_end(const Ended& ended, const std::string& what) {
  EXPECT_FALSE(ended.timed_out) << what << ": hung\n" << ended.output;
  EXPECT_EQ(ended.signal, 0) << what << ": killed by signal " << ended.signal << "\n" << ended.output;
  for (const char* raw : {"[json.exception", "basic_string", "terminate called", "what():", "std::", "yaml-cpp",
                          "Segmentation", "corrupted size", "double free"}) {
    EXPECT_EQ(ended.output.find(raw), std::string::npos) << what << ": raw library text '" << raw << "'\n"
                                                         << ended.output;
  }
}

// A command that must be refused: clean end, a non-zero status, and a message holding `needle`.
inline void expect_refused(const Ended& ended, const std::string& what, const std::string& needle) {
  expect_clean_end(ended, what);
  EXPECT_NE(ended.exit_code, 0) << what << " was accepted\n" << ended.output;
  EXPECT_NE(ended.output.find(needle), std::string::npos) << what << ": the message does not name '" << needle
                                                          << "'\n" << ended.output;
}

}  // namespace paraflow::testing
