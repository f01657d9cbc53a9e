// The C ABI of gpu/ckptfs_gpu.h over the C++ API of gpu/loader.h. No exception crosses it.
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <new>
#include <string>
#include <vector>

#include "gpu/ckptfs_gpu.h"
#include "gpu/loader.h"

namespace {

using ckptfs::Status;

thread_local std::string g_last_error;

int Fail(const Status& st) {
  g_last_error = st.message();
  const int err = ckptfs::ToErrno(st);
  return err > 0 ? -err : -EIO;
}

int FailNoMemory() {
  g_last_error = "out of memory";
  return -ENOMEM;
}

ckptfs::gpu::LoadOptions ToOptions(const ckptfs_gpu_options* o) {
  ckptfs::gpu::LoadOptions out;
  if (!o) return out;
  if (o->queue_depth) out.queue_depth = o->queue_depth;
  if (o->staging_buffers) out.staging_buffers = o->staging_buffers;
  if (o->piece_bytes) out.piece_bytes = static_cast<size_t>(o->piece_bytes);
  if (o->staging_bytes) out.staging_bytes = static_cast<size_t>(o->staging_bytes);
  out.max_op_bytes = static_cast<size_t>(o->max_op_bytes);
  if (o->use_pread) out.engine = "pread";
  if (o->no_huge_pages) out.huge_pages = false;
  return out;
}

int Index(const char* path, const char* const* names, size_t n_names, char** json,
          size_t* json_len) {
  if (!path || !json || (n_names > 0 && !names)) {
    return Fail(ckptfs::Invalid("ckptfs_gpu_index: a required argument is NULL"));
  }
  auto index = ckptfs::gpu::ReadTensorIndex(path);
  if (!index.ok()) return Fail(index.status());
  if (n_names > 0) {
    std::vector<std::string> wanted;
    wanted.reserve(n_names);
    for (size_t i = 0; i < n_names; ++i) {
      if (!names[i]) return Fail(ckptfs::Invalid("ckptfs_gpu_index: a NULL name"));
      wanted.emplace_back(names[i]);
    }
    index = ckptfs::gpu::SelectTensors(*index, wanted, path);
    if (!index.ok()) return Fail(index.status());
  }
  const std::string text = ckptfs::gpu::TensorIndexJson(*index);
  char* out = static_cast<char*>(std::malloc(text.size() + 1));
  if (!out) return FailNoMemory();
  std::memcpy(out, text.data(), text.size());
  out[text.size()] = '\0';
  *json = out;
  if (json_len) *json_len = text.size();
  return 0;
}

int Read(const char* path, const ckptfs_gpu_extent* extents, size_t n, int device,
         const ckptfs_gpu_options* options) {
  if (!path || (n > 0 && !extents)) {
    return Fail(ckptfs::Invalid("ckptfs_gpu_read: a required argument is NULL"));
  }
  std::vector<ckptfs::gpu::Extent> list(n);
  for (size_t i = 0; i < n; ++i) {
    list[i].offset = extents[i].offset;
    list[i].length = extents[i].length;
    list[i].dst = extents[i].dst;
    if (extents[i].name) list[i].name = extents[i].name;
  }
  const ckptfs::gpu::LoadOptions opts = ToOptions(options);
  Status st = device < 0 ? ckptfs::gpu::ReadToHost(path, list, opts)
                         : ckptfs::gpu::ReadToDevice(path, list, device, opts);
  return st.ok() ? 0 : Fail(st);
}

// Runs one C ABI call: no exception crosses into C; this thread's last error is the call's.
template <typename F>
int Guarded(const char* call, F&& f) {
  g_last_error.clear();
  try {
    return f();
  } catch (const std::bad_alloc&) {
    return FailNoMemory();
  } catch (...) {
    return Fail(ckptfs::Internal(std::string(call) + ": unexpected exception"));
  }
}

}  // namespace

extern "C" {

int ckptfs_gpu_abi_version(void) { return CKPTFS_GPU_ABI_VERSION; }

int ckptfs_gpu_has_hip(void) { return ckptfs::gpu::HaveHip() ? 1 : 0; }

int ckptfs_gpu_device_count(void) { return ckptfs::gpu::DeviceCount(); }

const char* ckptfs_gpu_last_error(void) { return g_last_error.c_str(); }

int ckptfs_gpu_index(const char* path, const char* const* names, size_t n_names, char** json,
                     size_t* json_len) {
  return Guarded("ckptfs_gpu_index", [&] { return Index(path, names, n_names, json, json_len); });
}

int ckptfs_gpu_read(const char* path, const ckptfs_gpu_extent* extents, size_t n, int device,
                    const ckptfs_gpu_options* options) {
  return Guarded("ckptfs_gpu_read", [&] { return Read(path, extents, n, device, options); });
}

void ckptfs_gpu_free(void* p) { std::free(p); }

}  // extern "C"
