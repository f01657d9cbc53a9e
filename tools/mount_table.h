// Finding ckptfs mounts in /proc/self/mountinfo.
#pragma once

#include <optional>
#include <string>

namespace ckptfs {

struct MountEntry {
  std::string mountpoint;
  std::string cache_dir;  // the mount's source field
};

// The ckptfs mount at `mountpoint` (an absolute, normalized path), if any.
std::optional<MountEntry> FindMount(const std::string& mountpoint);

// The absolute form of `path` (made absolute against the working directory, "." and ".."
// resolved lexically, so it works on a dead mount too).
std::string AbsolutePath(const std::string& path);

}  // namespace ckptfs
