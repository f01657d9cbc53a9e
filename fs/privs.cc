#include "fs/privs.h"

#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <fstream>
#include <sstream>
#include <string>

namespace ckptfs::fs {
namespace {

constexpr int kCapFsetid = 4;  // CAP_FSETID in linux/capability.h

// Set-group-ID that matters: with group execute it makes a set-group-ID program; without, the
// kernel clears it too when the caller is not in the file's group and lacks CAP_FSETID.
uint32_t SgidToClear(uint32_t mode, uint32_t gid, const CallerPrivs& who) {
  if (!(mode & S_ISGID)) return 0;
  if ((mode & S_IXGRP) || !who.InGroupOrCapable(gid)) return S_ISGID;
  return 0;
}

// The user namespace a process runs in ("user:[4026531837]"); "" when unreadable.
std::string UserNamespace(const std::string& proc) {
  char buf[64];
  const ssize_t n = ::readlink((proc + "/ns/user").c_str(), buf, sizeof(buf));
  return n > 0 ? std::string(buf, static_cast<size_t>(n)) : std::string();
}

}  // namespace

bool CallerPrivs::InGroupOrCapable(uint32_t gid) const {
  return fsetid || fsgid == gid || std::find(groups.begin(), groups.end(), gid) != groups.end();
}

CallerPrivs PrivsOf(pid_t pid) {
  CallerPrivs p;
  if (pid <= 0) return p;
  const std::string proc = "/proc/" + std::to_string(pid);
  std::ifstream in(proc + "/status");
  std::string line;
  while (std::getline(in, line)) {
    std::istringstream fields(line.substr(line.find(':') + 1));
    if (line.rfind("CapEff:", 0) == 0) {
      std::string hex;
      fields >> hex;
      p.fsetid = (std::strtoull(hex.c_str(), nullptr, 16) >> kCapFsetid) & 1;
    } else if (line.rfind("Gid:", 0) == 0) {
      uint32_t real, eff, saved;
      fields >> real >> eff >> saved >> p.fsgid;  // the filesystem gid is the fourth
    } else if (line.rfind("Groups:", 0) == 0) {
      for (uint32_t g; fields >> g;) p.groups.push_back(g);
    }
  }
  if (p.fsetid && UserNamespace(proc) != UserNamespace("/proc/self")) p.fsetid = false;
  return p;
}

void CapsRemovals::Note(uint64_t ino, pid_t pid) {
  std::lock_guard lock(mu_);
  recent_.emplace_back(ino, pid);
  if (recent_.size() > kKept) recent_.pop_front();
}

bool CapsRemovals::Take(uint64_t ino, pid_t pid) {
  std::lock_guard lock(mu_);
  auto it = std::find(recent_.begin(), recent_.end(), std::pair{ino, pid});
  if (it == recent_.end()) return false;
  recent_.erase(it);
  return true;
}

uint32_t SetidClearedByWrite(uint32_t mode, uint32_t gid, const CallerPrivs& who) {
  if (!S_ISREG(mode) || who.fsetid) return 0;
  return (mode & S_ISUID) | SgidToClear(mode, gid, who);
}

uint32_t SetidClearedByChown(uint32_t mode, uint32_t gid, const CallerPrivs& who) {
  if (S_ISDIR(mode)) return 0;
  return (mode & S_ISUID) | SgidToClear(mode, gid, who);
}

}  // namespace ckptfs::fs
