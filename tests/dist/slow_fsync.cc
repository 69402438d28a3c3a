// LD_PRELOAD shim for tests: every fsync takes PARAFLOW_TEST_FSYNC_MS milliseconds longer, as on
// slow network storage.
#include <dlfcn.h>

#include <cstdlib>
#include <ctime>

extern "C" int fsync(int fd) {
  using Fsync = int (*)(int);
  static const auto real_fsync = reinterpret_cast<Fsync>(dlsym(RTLD_NEXT, "fsync"));
  const char* delay = std::getenv("PARAFLOW_TEST_FSYNC_MS");
  const long ms = delay != nullptr ? std::atol(delay) : 0;
  const timespec pause{ms / 1000, (ms % 1000) * 1000000L};
  nanosleep(&pause, nullptr);
  return real_fsync(fd);
}
