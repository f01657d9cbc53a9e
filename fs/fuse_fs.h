// The FUSE adapter: mounts a Store on a directory with the libfuse3 low-level API and serves it
// with the multithreaded loop until the filesystem is unmounted or a signal asks it to stop.
#pragma once

#include <functional>

#include "common/config.h"
#include "common/status.h"

namespace ckptfs {

class Store;

// Mounts `store` at cfg.mountpoint and serves it. `on_mounted` runs once the mount is in place
// (the daemon tells its parent then). Returns when the filesystem is unmounted (umount, SIGTERM,
// SIGINT, SIGHUP), after the kernel connection is closed; the caller then closes the store.
Status ServeMount(Store* store, const Config& cfg, const std::function<void()>& on_mounted);

}  // namespace ckptfs
