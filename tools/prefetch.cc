// ckptfs prefetch PATH [--wait]: asks the daemon to pull PATH (a file or a directory tree) onto
// the local tier (user.ckptfs.prefetch), and with --wait follows user.ckptfs.cached until it is
// all there, drawing a progress bar on stderr when stderr is a terminal.
#include <signal.h>
#include <sys/xattr.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>
#include <cstring>
#include <string>
#include <thread>
#include <vector>

#include "formats/json.h"
#include "tools/commands.h"

namespace ckptfs {
namespace {

constexpr const char* kPrefetchAttr = "user.ckptfs.prefetch";
constexpr const char* kCachedAttr = "user.ckptfs.cached";
constexpr auto kPoll = std::chrono::milliseconds(250);
constexpr auto kPollMin = std::chrono::milliseconds(10);

volatile sig_atomic_t g_interrupted = 0;
void OnSignal(int) { g_interrupted = 1; }

Result<std::string> GetAttr(const std::string& path, const char* name) {
  char buf[4096];
  const ssize_t n = ::getxattr(path.c_str(), name, buf, sizeof(buf));
  if (n < 0) return Status::FromErrno(errno, std::string("getxattr ") + name + " " + path);
  return std::string(buf, static_cast<size_t>(n));
}

Status SetAttr(const std::string& path, const char* name, const char* value) {
  if (::setxattr(path.c_str(), name, value, std::strlen(value), 0) != 0) {
    const int err = errno;
    if (err == ENOTSUP || err == EPERM) {
      return Invalid(path + " is not in a ckptfs mount (or its daemon is too old to prefetch)");
    }
    return Status::FromErrno(err, std::string("setxattr ") + name + " " + path);
  }
  return Status::Ok();
}

struct Progress {
  uint64_t bytes = 0, cached_bytes = 0, files = 0;
};

Result<Progress> ReadProgress(const std::string& path) {
  ASSIGN_OR_RETURN(std::string text, GetAttr(path, kCachedAttr));
  ASSIGN_OR_RETURN(json::Value v, json::Parse(text));
  auto field = [&](const char* key) -> uint64_t {
    const json::Value* f = v.Find(key);
    return f && f->is_int() && f->as_int() > 0 ? static_cast<uint64_t>(f->as_int()) : 0;
  };
  return Progress{field("bytes"), field("cached_bytes"), field("files")};
}

// One line, redrawn in place: [#####.....]  45%  1.2 GiB / 2.6 GiB  340.0 MiB/s
void Draw(const Progress& p, double rate) {
  constexpr int kWidth = 30;
  const double frac = p.bytes ? static_cast<double>(p.cached_bytes) / static_cast<double>(p.bytes)
                              : 1.0;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.append(static_cast<size_t>(kWidth - filled), '.');
  std::fprintf(stderr, "\r[%s] %3d%%  %s / %s  %s/s   ", bar.c_str(), static_cast<int>(frac * 100),
               HumanBytes(static_cast<double>(p.cached_bytes)).c_str(),
               HumanBytes(static_cast<double>(p.bytes)).c_str(), HumanBytes(rate).c_str());
  std::fflush(stderr);
}

}  // namespace

int Prefetch(const std::vector<std::string>& args) {
  std::string path;
  bool wait = false;
  for (const std::string& a : args) {
    if (a == "--wait" || a == "-w") {
      wait = true;
    } else if (!a.empty() && a[0] == '-') {
      Fail("prefetch: unknown option " + a + " (usage: ckptfs prefetch PATH [--wait])");
      return kExitUsage;
    } else if (path.empty()) {
      path = a;
    } else {
      return Fail("prefetch takes one path (usage: ckptfs prefetch PATH [--wait])");
    }
  }
  if (path.empty()) return Fail("prefetch: no path given (usage: ckptfs prefetch PATH [--wait])");
  if (Status st = SetAttr(path, kPrefetchAttr, "1"); !st.ok()) return Fail(st.message());
  if (!wait) return 0;

  struct sigaction sa {};
  sa.sa_handler = OnSignal;
  ::sigaction(SIGINT, &sa, nullptr);
  ::sigaction(SIGTERM, &sa, nullptr);
  const bool tty = ::isatty(STDERR_FILENO);
  const auto start = std::chrono::steady_clock::now();
  uint64_t first = UINT64_MAX;  // cached bytes at the first look: the rate counts what moved
  for (bool settled = false;;) {
    // Pending first: work that ends between the two reads is then seen in the progress.
    auto pending = GetAttr(path, kPrefetchAttr);
    if (!pending.ok()) return Fail(pending.status().message());
    auto p = ReadProgress(path);
    if (!p.ok()) return Fail(p.status().ToString());
    if (first == UINT64_MAX) first = p->cached_bytes;
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    const double rate =
        secs > 0 ? static_cast<double>(p->cached_bytes - std::min(first, p->cached_bytes)) / secs
                 : 0;
    if (tty) Draw(*p, rate);
    if (p->cached_bytes >= p->bytes) {
      if (tty) std::fputc('\n', stderr);
      std::fprintf(stderr, "ckptfs: %s: %s in %lu files on the local tier (%.1f s, %s/s)\n",
                   path.c_str(), HumanBytes(static_cast<double>(p->bytes)).c_str(),
                   static_cast<unsigned long>(p->files), secs, HumanBytes(rate).c_str());
      return 0;
    }
    if (g_interrupted) {
      (void)SetAttr(path, kPrefetchAttr, "0");
      if (tty) std::fputc('\n', stderr);
      Fail("interrupted: the prefetch of " + path + " is cancelled");
      return 130;
    }
    if (*pending != "1") {
      // Done, yet not all there: look once more (a last chunk may have landed between the reads).
      if (settled) {
        if (tty) std::fputc('\n', stderr);
        return Fail(path + ": the prefetch ended with " +
                    HumanBytes(static_cast<double>(p->cached_bytes)) + " of " +
                    HumanBytes(static_cast<double>(p->bytes)) +
                    " on the local tier (chunks missing from the backend, or more than cache_size "
                    "holds; see the daemon's log)");
      }
      settled = true;
    }
    // The next look: after kPoll, or sooner when the rate so far says the rest lands sooner (a
    // script waiting on --wait goes on within ~10 ms of the last chunk, not up to kPoll late).
    auto next = kPoll;
    if (rate > 0) {
      const double left_ms = static_cast<double>(p->bytes - p->cached_bytes) / rate * 1000;
      if (left_ms < static_cast<double>(kPoll.count())) {
        next = std::max(kPollMin, std::chrono::milliseconds(static_cast<int64_t>(left_ms)));
      }
    }
    std::this_thread::sleep_for(next);
  }
}

}  // namespace ckptfs
