#!/usr/bin/env bash
# Installs what ckptfs needs to build, test and benchmark on Debian 12, from Debian's packages only.
# Idempotent: packages already present are skipped, so a warm machine pays only the dpkg query.
set -euo pipefail
pkgs=(
  build-essential cmake ninja-build pkg-config meson dpkg-dev
  libfuse3-dev fuse3 liburing-dev libxxhash-dev liblmdb-dev lmdb-utils libspdlog-dev libfmt-dev
  libgtest-dev googletest
  clang libclang-rt-14-dev
  python3-torch python3-numpy python3-pytest attr psmisc procps util-linux e2fsprogs
  libcurl4-openssl-dev libssl-dev openssl zlib1g-dev libdeflate-dev python3-botocore python3-boto3
  ceph-mon ceph-osd radosgw ceph-common curl
  # The Prometheus exporter (-o metrics=) and the Prometheus server its test scrapes it with;
  # matplotlib for bench/plot.py.
  prometheus-cpp-dev prometheus python3-matplotlib
  # The set-id and systemd-unit mount tests: setcap, systemd-escape; the views' page-cache test
  # watches the daemon's writes to /dev/fuse with strace.
  libcap2-bin systemd strace
  # tc, which bench/link.py uses to put the S3 port behind a link (bench_remote.py --link).
  iproute2
  # HIP (AMD's runtime and headers) so that scripts/test.sh compiles gpu/ with CKPTFS_WITH_HIP=ON:
  # 66 MB to download, 350 MB installed. No GPU is needed to build.
  hipcc libamdhip64-dev
)
missing=()
for p in "${pkgs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "install-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  apt-get install -y -qq --no-install-recommends "${missing[@]}" >/dev/null
fi
# libfuse 3.17 (FUSE passthrough), from Debian 13's source package, static, into build-deps/.
bash "$(dirname "$0")/libfuse.sh"
