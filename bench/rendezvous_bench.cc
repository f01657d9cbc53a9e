// What choosing a chunk's owner costs (RendezvousSet::Owner, peers/peer_protocol.h) as the node
// count grows: the set hashes each node's address into a seed once, when it is made (what a node
// does when its peer set changes, timed apart); each choice then mixes the chunk id with every
// node's seed, so its cost is linear in the nodes. Prints ns per chunk for each node count, and
// how evenly the chunks fall (the most and fewest any node owns, over the mean).
// Usage: rendezvous_bench [CHUNKS=100000] [NODES=1000 ...]
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "common/chunk_id.h"
#include "peers/peer_protocol.h"

using namespace ckptfs;

int main(int argc, char** argv) {
  const long chunks = argc > 1 ? std::atol(argv[1]) : 100000;
  std::vector<long> counts;
  for (int i = 2; i < argc; ++i) counts.push_back(std::atol(argv[i]));
  if (counts.empty()) counts = {16, 1000};
  if (chunks <= 0 || std::any_of(counts.begin(), counts.end(), [](long n) { return n <= 0; })) {
    std::fprintf(stderr, "usage: rendezvous_bench [CHUNKS>0] [NODES>0 ...]\n");
    return 2;
  }
  std::vector<ChunkId> ids;
  ids.reserve(static_cast<size_t>(chunks));
  for (long c = 0; c < chunks; ++c) ids.push_back(ChunkId::Of(&c, sizeof(c)));
  for (long n : counts) {
    std::vector<std::string> nodes;
    for (long i = 0; i < n; ++i) {
      nodes.push_back("10." + std::to_string(i / 65536 % 256) + "." + std::to_string(i / 256 % 256) +
                      "." + std::to_string(i % 256) + ":7070");
    }
    std::vector<long> owned(static_cast<size_t>(n), 0);
    const auto made = std::chrono::steady_clock::now();
    const RendezvousSet set(nodes);
    const auto t0 = std::chrono::steady_clock::now();
    for (const ChunkId& id : ids) ++owned[static_cast<size_t>(set.Owner(id))];
    const double ns = std::chrono::duration<double, std::nano>(
                          std::chrono::steady_clock::now() - t0).count();
    const double make_us = std::chrono::duration<double, std::micro>(t0 - made).count();
    const double mean = static_cast<double>(chunks) / static_cast<double>(n);
    const auto [lo, hi] = std::minmax_element(owned.begin(), owned.end());
    std::printf("rendezvous  %5ld nodes  %8ld chunks  %10.0f ns per chunk  %6.2f ns per node  "
                "owned per node: max %.2f, min %.2f x the mean  (set made in %.0f us)\n",
                n, chunks, ns / static_cast<double>(chunks),
                ns / static_cast<double>(chunks) / static_cast<double>(n),
                static_cast<double>(*hi) / mean, static_cast<double>(*lo) / mean, make_us);
  }
  return 0;
}
