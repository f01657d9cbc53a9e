// The device side of a build without HIP (CKPTFS_WITH_HIP=OFF): same API, device reads refused.
#include "gpu/loader.h"

namespace ckptfs::gpu {

Result<std::unique_ptr<Stager>> NewHipStager(int device, const LoadOptions&) {
  return Status(Code::kUnsupported, "cannot read into device " + std::to_string(device) +
                                        ": ckptfs_gpu was built without HIP "
                                        "(configure with -DCKPTFS_WITH_HIP=ON)");
}

bool HaveHip() { return false; }
int DeviceCount() { return 0; }

}  // namespace ckptfs::gpu
