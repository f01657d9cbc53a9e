// Typed configuration of one ckptfs mount, validated once before anything starts.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/status.h"

namespace ckptfs {

struct ChunkingOptions {
  // Content-defined chunking bounds. A cut never falls before min_bytes or after max_bytes; the
  // expected chunk size is about avg_bytes. avg_bytes must be a power of two.
  uint32_t min_bytes = 256 * 1024;
  uint32_t avg_bytes = 1024 * 1024;
  uint32_t max_bytes = 4 * 1024 * 1024;
  // Inside a tensor of a recognized checkpoint file (common/payload_scanner.h) chunks are fixed
  // pieces of this size counted from the tensor's first byte, so equal tensors give equal chunks
  // wherever they lie. At most max_bytes (the write path holds one piece in memory); 0: max_bytes.
  uint32_t piece_bytes = 0;
  // Recognize checkpoint formats and cut chunks at tensor boundaries (-o tensor_chunking=0: off).
  bool tensor_boundaries = true;
};

// The largest chunk any node cuts (chunk_max).
inline constexpr uint64_t kMaxChunkBytes = 64ull << 20;

struct Config {
  // Where the local tier keeps chunks (chunks/), metadata (meta/), the log and the pid file.
  // Empty: DefaultCacheDir(mountpoint).
  std::string cache_dir;
  std::string mountpoint;

  // Stay attached to the terminal and log to stderr instead of <cache_dir>/ckptfs.log.
  bool foreground = false;
  // trace, debug, info, warn, error, critical, off.
  std::string log_level = "info";

  // Memory for verified chunks kept in RAM for reads, as their buffers hold it
  // (ChunkData::capacity()). Counted in the daemon's memory budget.
  uint64_t ram_cache_bytes = 128ull << 20;
  // Bytes of out-of-order writes one open file may hold while waiting for the gap before them to
  // fill; past this the file switches to its staging file (see store/file_writer.h).
  uint64_t reorder_bytes = 64ull << 20;
  ChunkingOptions chunking;
  // Writes are acknowledged once queued; this many bytes may wait per file for the chunking
  // workers before a writer blocks (back-pressure).
  uint64_t write_queue_bytes = 32ull << 20;
  // The daemon-wide bound on written bytes held in memory: half for all files' write queues
  // (writers wait for room), half for all reorder windows (a window that finds none spills to
  // its staging file). The per-file bounds above apply within it.
  uint64_t write_memory_bytes = 256ull << 20;
  // Threads that chunk, hash and store queued writes (each file is handled by one at a time).
  uint32_t write_threads = 2;
  // Threads that help a seal find its content-defined cuts, ahead of the thread that cuts (0:
  // none). Off by default: their candidate scan covers every byte, 1.4-1.8 times the work of
  // the cutting thread's own scan (which skips each chunk's first min_bytes), and on two cores a
  // seal ran slower with one; a many-core node is where it can pay (bench-cut in
  // scripts/gpu-node-checks.sh measures it).
  uint32_t cut_threads = 0;
  // Chunks read ahead of a sequential reader (0: none), by this many threads.
  uint32_t readahead_chunks = 4;
  uint32_t read_threads = 2;

  // "uring" (io_uring, falls back to pread when the kernel refuses) or "pread".
  std::string io_engine = "uring";

  // FUSE tuning. Timeouts are safe to make long: on one node every change passes through this
  // daemon, which keeps the kernel's caches up to date.
  double attr_timeout_s = 5.0;
  double entry_timeout_s = 5.0;
  uint32_t max_threads = 8;
  uint32_t max_write_bytes = 1 << 20;
  uint32_t max_readahead_bytes = 16 << 20;
  uint32_t max_background = 64;
  bool writeback_cache = false;
  // FUSE passthrough (needs libfuse 3.17, a kernel with it, root, and no writeback cache): a file
  // created or truncated by open(2) is written by the kernel into a staging file of the local
  // tier and cut into chunks after its close (store/staging.h). Off, or where unavailable
  // (logged at mount), every byte goes through the daemon.
  bool passthrough = true;
  // A seal keeps a passthrough staging file as the home of its new chunks (a pack: cache/packs.h)
  // instead of writing them again into chunk files; chunks stored already are punched out of it.
  // Chunks the daemon writes itself are appended to packs of its own (cache/append_pack.h).
  bool packs = true;
  // The remote tiers (store/remote_tier.h), nearest first (--backend given once per tier). Empty:
  // none; the cache directory holds everything. Each "file:///PATH" (a directory, e.g. on a
  // parallel filesystem) or "s3://BUCKET[/PREFIX]". The farthest is the shared namespace.
  std::vector<std::string> backends;
  std::string s3_endpoint;  // empty: $AWS_ENDPOINT_URL
  std::string backend_faults;  // tests (--backend-faults): faults injected around every tier
  std::string cache_faults;    // tests (--cache-faults): chunk reads/writes that fail (cache/fault_io_engine.h)
  // "local": close and fsync make a file durable on the local tier; uploads follow behind.
  // "remote": fsync also waits until the tiers in durability_tiers hold the file.
  std::string durability = "local";
  // The tiers (0-based, nearest first) durability=remote waits for; empty: every tier.
  // -o durability_tier=N[+M...], counted from 1 in --backend order.
  std::vector<int> durability_tiers;
  // Per nearer tier (nearest first): how many recent checkpoints it keeps (0: all), and every
  // K-th step kept besides (0: none) (-o keep=N[+N...], keep_every=K[+K...]). Files of older
  // checkpoints are dropped from that tier only (store/tier_policy.h).
  std::vector<uint64_t> tier_keep, tier_keep_every;
  // Bytes of chunk files the local tier keeps (0: no bound). Only chunks the backend holds are
  // evicted; writers wait while the tier is full of chunks still to upload.
  uint64_t cache_bytes = 0;
  uint32_t upload_threads = 8;
  // How long fsync with durability=remote, and a writer waiting for room, wait for the backend.
  double remote_timeout_s = 600;
  // Seconds between two looks at what other nodes published to the backend (0: never).
  double sync_interval_s = 1.0;
  // Seconds between two passes that make durable the newest versions of files closed without
  // fsync (their chunk files are synced) and end the fallbacks kept for them (Store::Settle).
  // A machine crash can take back at most this much of such saves. 0: only fsync and a clean
  // stop do it.
  double settle_interval_s = 5.0;
  // What the first open of a file whose chunks are off the local tier pulls in behind it
  // (fs/warm.cc): "checkpoint" (the whole checkpoint it belongs to: one job on one node reads
  // it all), "file" (the file alone: a node of a many-node job reads only its own ranks, and
  // warming every rank on every node would fetch the checkpoint once per node), "off".
  std::string warm = "checkpoint";
  // Seconds between two full listings of the backend's files/ and dirs/ (store/journal.h): the
  // passes between read only the journal's new entries. 0: a full listing every pass (buckets
  // also written by ckptfs versions without the journal).
  double sync_full_interval_s = 600;
  // Garbage collection (docs/gc.md): the longest a publish may take from reading gc/round to its
  // record's PUT; a collector's --grace must be longer than every mount's gc_window.
  double gc_window_s = 300;
  // How long a mount may wait for its first sync from the backend before it fails (with
  // sync_interval > 0 a mount serves only once its namespace holds what the backend held).
  double mount_timeout_s = 300;

  // Resharded views (docs/views.md): a file of parameter rules ("REGEX RULE" per line) checked
  // before the built-in ones; empty: the built-in rules only.
  std::string view_rules;
  // The hf view's safetensors shards hold up to this many bytes each (-o hf_shard_size=), as
  // save_pretrained's max_shard_size does; one larger tensor gets a shard of its own.
  uint64_t view_hf_shard_bytes = 5'000'000'000;
  // Whether a checkpoint directory's listing shows `.views` (-o views=visible). Hidden by
  // default, as ZFS hides `.zfs`: tools that copy or measure a tree (cp -r, du, rsync, find)
  // would otherwise read every view of every checkpoint. A lookup of `.views` works either way.
  bool views_visible = false;
  // Where the Prometheus exporter listens (-o metrics=127.0.0.1:9567); empty: no exporter.
  std::string metrics_address;
  // Chunks served node to node (peers/, README "Chunks served node to node"). Where this node's
  // peer endpoint listens (-o peer_listen=IPV4:PORT, that address only; empty: none), and the
  // other nodes' endpoints (-o peers=HOST:PORT,HOST:PORT; given as one value, separated by
  // ':'-free commas in a config file, or by '+' on a command line: see mount_options.cc). A
  // chunk's owner fetches it from the farthest tier, the others fetch it from the owner. They
  // need an s3:// farthest tier: requests are proven with a key derived from its secret key.
  std::string peer_listen;
  std::vector<std::string> peers;
  // How long a peer may take to connect and between parts of its answer (-o peer_timeout=).
  double peer_timeout_s = 10;
  // Whether peers are also found through the bucket: each node keeps a record of its address
  // under nodes/, put anew every peer_heartbeat (-o peer_discovery=0: the peers given only).
  bool peer_discovery = true;
  double peer_heartbeat_s = 10;

  // Options handed to libfuse as given (-o allow_other, ...).
  std::vector<std::string> fuse_options;

  // Normalizes and checks every field; the first problem comes back as kInvalid.
  Status Validate();
};

// The cache directory used when none is given: /var/cache/ckptfs/<mountpoint path> for root,
// $XDG_CACHE_HOME (or ~/.cache)/ckptfs/<mountpoint path> otherwise.
std::string DefaultCacheDir(const std::string& abs_mountpoint);

// "4096", "64K", "1M", "2G" (powers of 1024) -> bytes.
Result<uint64_t> ParseSize(const std::string& text);

}  // namespace ckptfs
