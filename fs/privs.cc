#include "fs/privs.h"

#include <sys/stat.h>

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

}  // namespace

bool CallerPrivs::InGroupOrCapable(uint32_t gid) const {
  return fsetid || fsgid == gid || std::find(groups.begin(), groups.end(), gid) != groups.end();
}

CallerPrivs PrivsOf(pid_t pid) {
  CallerPrivs p;
  if (pid <= 0) return p;
  std::ifstream in("/proc/" + std::to_string(pid) + "/status");
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
  return p;
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
