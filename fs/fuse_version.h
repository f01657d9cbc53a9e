// The libfuse API fs/ is written against, in one place. libfuse 3.17 (scripts/libfuse.sh) adds
// FUSE passthrough; with an older libfuse ckptfs builds without it.
#pragma once

#define FUSE_USE_VERSION 312
#include <fuse_lowlevel.h>

namespace ckptfs::fs {

#if defined(FUSE_CAP_PASSTHROUGH)
inline constexpr bool kFusePassthrough = true;
#else
inline constexpr bool kFusePassthrough = false;
#endif

}  // namespace ckptfs::fs
