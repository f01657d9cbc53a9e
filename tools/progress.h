// A progress line on stderr for the long-running commands (gc, fsck, retain): redrawn in place on
// a terminal at most every 0.2 s; nothing when stderr is not a terminal.
#pragma once

#include <chrono>
#include <string>

namespace ckptfs {

class Progress {
 public:
  Progress();
  ~Progress() { Done(); }
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;
  void Show(const std::string& line);
  // Clears the line (before other output, and at the end).
  void Done();
  bool on_terminal() const { return tty_; }

 private:
  const bool tty_;
  bool drawn_ = false;
  std::chrono::steady_clock::time_point last_{};
};

}  // namespace ckptfs
