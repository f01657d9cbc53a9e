#!/usr/bin/env bash
# Packs a built ckptfs into a folder that runs on another x86-64 Linux machine without this one's
# packages (a GPU node, a container): the binary stripped of its debug info, every shared library
# it needs except the C and C++ runtimes (glibc, libstdc++, libgcc_s: the target's own, which must
# be at least as new), and libckptfs_gpu.so with its runtime beside the Python module.
#
#   scripts/bundle.sh OUT [BUILD_DIR [GPU_BUILD_DIR]]   (defaults: build, and build-cuda if built)
#
# OUT/bin/ckptfs          runs the daemon and the CLI with OUT/lib on the loader's path
# OUT/gpu/                libckptfs_gpu.so, ckptfs_gpu.py and the libraries the .so needs;
#                         use it with CKPTFS_GPU_LIB=OUT/gpu/libckptfs_gpu.so and
#                         LD_LIBRARY_PATH=OUT/gpu
set -euo pipefail
out=${1:?usage: scripts/bundle.sh OUT [BUILD_DIR [GPU_BUILD_DIR]]}
build=${2:-build}
gpu_build=${3:-build-cuda}
root=$(cd "$(dirname "$0")/.." && pwd)
cd "$root"
[[ -x $build/tools/ckptfs ]] || { echo "no $build/tools/ckptfs: build it first" >&2; exit 1; }

rm -rf "$out"
mkdir -p "$out/bin" "$out/lib" "$out/libexec" "$out/gpu"

# The libraries a file needs, as the loader here resolves them, less the C and C++ runtimes.
deps() {
  ldd "$1" | awk '$2 == "=>" && $3 ~ /^\// {print $3}' |
    grep -Ev '/(libc|libm|libdl|librt|libpthread|libresolv|libstdc\+\+|libgcc_s)\.so' || true
}

strip --strip-debug -o "$out/libexec/ckptfs" "$build/tools/ckptfs"
for lib in $(deps "$build/tools/ckptfs"); do cp -L "$lib" "$out/lib/"; done
cat > "$out/bin/ckptfs" <<'EOF'
#!/bin/sh
here=$(dirname "$(readlink -f "$0")")/..
LD_LIBRARY_PATH="$here/lib${LD_LIBRARY_PATH:+:$LD_LIBRARY_PATH}" exec "$here/libexec/ckptfs" "$@"
EOF
chmod +x "$out/bin/ckptfs"

gpu_lib=$gpu_build/gpu/libckptfs_gpu.so
[[ -f $gpu_lib ]] || gpu_lib=$build/gpu/libckptfs_gpu.so
if [[ -f $gpu_lib ]]; then
  strip --strip-debug -o "$out/gpu/libckptfs_gpu.so" "$gpu_lib"
  for lib in $(deps "$gpu_lib"); do cp -L "$lib" "$out/gpu/"; done
  cp gpu/ckptfs_gpu.py "$out/gpu/"
fi
du -sh "$out"
