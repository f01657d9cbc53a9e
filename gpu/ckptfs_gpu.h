/* ckptfs_gpu C ABI: load checkpoint tensors from a ckptfs mount into host or device memory.
 *
 * Plain C, for ctypes (gpu/ckptfs_gpu.py) and other languages. The caller allocates every
 * destination (torch.empty(..., device=...) and its data_ptr()); the library only fills it and
 * never keeps a pointer after a call returns.
 *
 * Every int-returning call returns 0 on success and a negative errno on failure (-ENODATA: no
 * tensor index / not a checkpoint, -EIO: a damaged or truncated checkpoint, -ENOENT: no such file
 * or tensor, -EOPNOTSUPP: a device read in a build without HIP, ...). The failure's message, naming
 * the file and what is wrong, is then ckptfs_gpu_last_error() until the same thread's next call.
 * All calls are thread-safe; concurrent calls share nothing.
 */
#ifndef CKPTFS_GPU_CKPTFS_GPU_H_
#define CKPTFS_GPU_CKPTFS_GPU_H_

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define CKPTFS_GPU_ABI_VERSION 1

/* One byte range of the file and where its bytes go. */
typedef struct ckptfs_gpu_extent {
  uint64_t offset;  /* in the file */
  uint64_t length;  /* bytes */
  void* dst;        /* host memory, or device memory on `device` for a device read */
  const char* name; /* the tensor's name, for error messages; may be NULL */
} ckptfs_gpu_extent;

/* Tuning; a zero field takes its default. NULL options: all defaults. */
typedef struct ckptfs_gpu_options {
  uint32_t queue_depth;     /* reads in flight (4) */
  uint32_t staging_buffers; /* device reads: pinned host buffers (4) */
  uint64_t piece_bytes;     /* largest single read request (4 MiB) */
  uint64_t staging_bytes;   /* device reads: bytes per staging buffer (16 MiB) */
  uint64_t max_op_bytes;    /* testing aid: cap every request, exercising short reads (none) */
  int32_t use_pread;        /* 1: plain pread instead of io_uring */
  int32_t no_huge_pages;    /* 1: do not advise huge pages for host destinations */
} ckptfs_gpu_options;

int ckptfs_gpu_abi_version(void);

/* 1 when built with HIP (CKPTFS_WITH_HIP=ON), else 0. */
int ckptfs_gpu_has_hip(void);

/* Devices HIP sees; 0 without HIP or without devices. */
int ckptfs_gpu_device_count(void);

/* The message of this thread's last failed call ("" if none). Valid until its next call. */
const char* ckptfs_gpu_last_error(void);

/* The tensor index of `path` (user.ckptfs.tensors, its pages merged) as one JSON list of
 * {"name","dtype","shape"[,"stride"],"offset","length"[,"global_shape","global_offset"]}.
 * With n_names > 0 only the tensors named in names[0..n_names), in that order; a name not in
 * the index fails with -ENOENT and a message listing the unknown names.
 * On success *json (NUL-terminated, *json_len bytes before the NUL) is the caller's to release
 * with ckptfs_gpu_free. */
int ckptfs_gpu_index(const char* path, const char* const* names, size_t n_names, char** json,
                     size_t* json_len);

/* Reads extents[0..n) of `path` into their destinations. device < 0: host memory, read straight
 * into it with io_uring; device >= 0: device memory on that HIP device, read through pinned
 * staging buffers and copied asynchronously. Returns once every byte is in place (or after a
 * failure, once nothing is in flight any more). */
int ckptfs_gpu_read(const char* path, const ckptfs_gpu_extent* extents, size_t n, int device,
                    const ckptfs_gpu_options* options);

/* Releases what the library allocated (ckptfs_gpu_index's JSON). NULL is fine. */
void ckptfs_gpu_free(void* p);

#ifdef __cplusplus
}
#endif

#endif /* CKPTFS_GPU_CKPTFS_GPU_H_ */
