#include "tools/progress.h"

#include <unistd.h>

#include <cstdio>

namespace ckptfs {

Progress::Progress() : tty_(::isatty(STDERR_FILENO)) {}

void Progress::Show(const std::string& line) {
  const auto now = std::chrono::steady_clock::now();
  if (!tty_ || now - last_ < std::chrono::milliseconds(200)) return;
  last_ = now;
  std::fprintf(stderr, "\r\033[K%s", line.c_str());
  drawn_ = true;
}

void Progress::Done() {
  if (drawn_) std::fprintf(stderr, "\r\033[K");
  drawn_ = false;
}

}  // namespace ckptfs
