// A PeerBackend asking a PeerServer on 127.0.0.1, with an in-memory bucket behind it.
#include "peers/peer_backend.h"

#include <gtest/gtest.h>

#include <atomic>
#include <ctime>
#include <map>
#include <string>
#include <thread>

#include "backends/mem_backend.h"
#include "cache/chunk_cache.h"
#include "peers/peer_net.h"
#include "peers/peer_protocol.h"
#include "peers/peer_server.h"
#include "tests/test_util.h"

namespace ckptfs {
namespace {

const std::string kKey = DerivePeerKey("secret", "bucket", "");

struct Chunk {
  ChunkId id;
  std::string bytes;
  std::string key;
};

Chunk MakeChunk(const std::string& s) {
  ChunkId id = ChunkId::Of(s.data(), s.size());
  return {id, s, ChunkCache::ObjectKey(id)};
}

// A node's endpoint serving `held`; `wrong` makes it answer other bytes of the right length.
class Fixture : public ::testing::Test {
 protected:
  void StartServer() {
    auto s = PeerServer::Start(
        "127.0.0.1:0", kKey, 1 << 20, [this](const ChunkId& id, uint64_t len)
                                           -> Result<PeerServer::Chunk> {
          ++served_;
          auto it = held_.find(id);
          if (it == held_.end() || it->second.size() != len) return NotFound("not here");
          auto bytes = std::make_shared<std::string>(it->second);
          if (wrong_) (*bytes)[0] = static_cast<char>((*bytes)[0] ^ 1);
          return PeerServer::Chunk{.bytes = bytes->data(), .keep = bytes};
        },
        /*any_port=*/true);
    if (!s.ok()) FAIL() << s.status().ToString();
    server_ = std::move(*s);
    addr_ = "127.0.0.1:" + std::to_string(server_->port());
  }
  std::unique_ptr<PeerBackend> Client(std::string key = kKey) {
    auto store = std::make_unique<MemBackend>();
    store_ = store.get();
    return std::make_unique<PeerBackend>(
        std::move(store), PeerOptions{.self = "", .peers = {addr_}, .key = std::move(key),
                                      .timeout_s = 2, .down_s = 60});
  }
  static Result<std::string> Read(Backend* b, const Chunk& c) {
    std::string buf(c.bytes.size(), '\0');
    ASSIGN_OR_RETURN(size_t n, b->GetExact(c.key, buf.data(), buf.size()));
    buf.resize(n);
    return buf;
  }

  std::map<ChunkId, std::string> held_;
  std::atomic<bool> wrong_{false};
  std::atomic<int> served_{0};
  std::unique_ptr<PeerServer> server_;
  std::string addr_;
  MemBackend* store_ = nullptr;
};

TEST_F(Fixture, TheOwnerServesAChunkTheStoreDoesNotHave) {
  Chunk a = MakeChunk(std::string(100000, 'a') + "1");
  held_[a.id] = a.bytes;
  StartServer();
  auto client = Client();
  auto got = Read(client.get(), a);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_EQ(*got, a.bytes);
  // Counted on both ends: one chunk and its bytes, one request that went well.
  PeerMetrics& m = client->metrics();
  EXPECT_EQ(m.fetched_chunks.Get(), 1u);
  EXPECT_EQ(m.fetched_bytes.Get(), a.bytes.size());
  EXPECT_EQ(m.request(Outcome::kOk).Get().count, 1u);
  EXPECT_EQ(m.peers.load(), 1);
  EXPECT_EQ(m.peers_down.load(), 0);
  for (const Counter& f : m.fallbacks) EXPECT_EQ(f.Get(), 0u);
  // The server counts a chunk once it has sent all of it, which may be after the client has it.
  EXPECT_TRUE(test::Eventually([&] { return server_->metrics().served_chunks.Get() == 1u; }));
  EXPECT_EQ(server_->metrics().served_bytes.Get(), a.bytes.size());
}

TEST_F(Fixture, ANotHereAnswerGoesToTheStoreAndLeavesThePeerUp) {
  Chunk a = MakeChunk("only in the store");
  Chunk b = MakeChunk("only on the peer");
  held_[b.id] = b.bytes;
  StartServer();
  auto client = Client();
  ASSERT_TRUE(store_->Put(a.key, a.bytes.data(), a.bytes.size()).ok());
  EXPECT_EQ(*Read(client.get(), a), a.bytes);
  EXPECT_EQ(*Read(client.get(), b), b.bytes);  // still asked
  EXPECT_EQ(client->metrics().fallback(PeerFallback::kNotHere).Get(), 1u);
  EXPECT_EQ(client->metrics().request(Outcome::kNotFound).Get().count, 1u);
  EXPECT_EQ(client->metrics().peers_down.load(), 0);
  EXPECT_EQ(server_->metrics().unserved_by(PeerUnserved::kNotHere).Get(), 1u);
  EXPECT_TRUE(test::Eventually([&] { return server_->metrics().served_chunks.Get() == 1u; }));
}

TEST_F(Fixture, WrongBytesFromAPeerAreNeverReturnedAndThePeerIsLeftOut) {
  Chunk a = MakeChunk(std::string(5000, 'x'));
  Chunk b = MakeChunk(std::string(5000, 'y'));
  held_[a.id] = a.bytes;
  held_[b.id] = b.bytes;
  wrong_ = true;
  StartServer();
  auto client = Client();
  ASSERT_TRUE(store_->Put(a.key, a.bytes.data(), a.bytes.size()).ok());
  EXPECT_EQ(*Read(client.get(), a), a.bytes);  // the store's copy
  // Marked down: b, which only the peer has, is not asked for there.
  const int asked = served_;
  EXPECT_EQ(Read(client.get(), b).status().code(), Code::kNotFound);
  EXPECT_EQ(served_, asked);
  PeerMetrics& m = client->metrics();
  EXPECT_EQ(m.fallback(PeerFallback::kBadBytes).Get(), 1u);
  EXPECT_EQ(m.fallback(PeerFallback::kDown).Get(), 1u);
  EXPECT_EQ(m.fetched_chunks.Get(), 0u);
  EXPECT_EQ(m.peers_down.load(), 1);
}

TEST_F(Fixture, ARequestWithAnotherKeyIsRefusedAndTheReadGoesToTheStore) {
  Chunk a = MakeChunk("guarded");
  held_[a.id] = a.bytes;
  StartServer();
  auto client = Client(DerivePeerKey("not the secret", "bucket", ""));
  EXPECT_EQ(Read(client.get(), a).status().code(), Code::kNotFound);  // the store lacks it
  EXPECT_EQ(served_, 0);
  EXPECT_EQ(client->metrics().fallback(PeerFallback::kRefused).Get(), 1u);
  EXPECT_EQ(server_->metrics().refusal(PeerRefusal::kProof).Get(), 1u);
  ASSERT_TRUE(store_->Put(a.key, a.bytes.data(), a.bytes.size()).ok());
  EXPECT_EQ(*Read(client.get(), a), a.bytes);
}

TEST_F(Fixture, AReplayedOrLongRequestIsRefused) {
  Chunk a = MakeChunk("once");
  held_[a.id] = a.bytes;
  StartServer();
  const std::string wire =
      EncodePeerRequest(MakePeerRequest(a.id, a.bytes.size(), std::time(nullptr)), kKey);
  auto ask = [&](const std::string& w) {
    auto s = ConnectTcp(addr_, 2);
    EXPECT_TRUE(s.ok());
    EXPECT_TRUE(s->SendAll(w.data(), w.size()).ok());
    char head[kPeerAnswerHeader];
    EXPECT_TRUE(s->RecvAll(head, sizeof(head)).ok());
    PeerAnswer answer;
    uint64_t n = 0;
    EXPECT_TRUE(DecodePeerAnswerHeader(std::string_view(head, sizeof(head)), &answer, &n).ok());
    return answer;
  };
  EXPECT_EQ(ask(wire), PeerAnswer::kOk);
  EXPECT_EQ(ask(wire), PeerAnswer::kRefused);
  // Longer than the server's bound.
  EXPECT_EQ(ask(EncodePeerRequest(MakePeerRequest(a.id, 2 << 20, std::time(nullptr)), kKey)),
            PeerAnswer::kRefused);
  EXPECT_EQ(served_, 1);
  // Half a request (the sender closes early) is refused without an answer.
  {
    auto s = ConnectTcp(addr_, 2);
    ASSERT_TRUE(s.ok());
    ASSERT_TRUE(s->SendAll(wire.data(), 10).ok());
  }
  PeerMetrics& m = server_->metrics();
  EXPECT_TRUE(test::Eventually([&] { return m.refusal(PeerRefusal::kIncomplete).Get() > 0; }));
  EXPECT_EQ(m.refusal(PeerRefusal::kReplay).Get(), 1u);
  EXPECT_EQ(m.refusal(PeerRefusal::kLength).Get(), 1u);
  EXPECT_EQ(m.refusal(PeerRefusal::kIncomplete).Get(), 1u);
  EXPECT_EQ(m.refusal(PeerRefusal::kProof).Get(), 0u);
  EXPECT_TRUE(test::Eventually([&] { return m.served_chunks.Get() == 1u; }));
}

TEST_F(Fixture, APeerThatIsGoneCostsTheStoreRead) {
  StartServer();
  server_->Stop();
  server_.reset();  // the port is closed now
  Chunk a = MakeChunk("after the peer died");
  auto client = Client();
  ASSERT_TRUE(store_->Put(a.key, a.bytes.data(), a.bytes.size()).ok());
  EXPECT_EQ(*Read(client.get(), a), a.bytes);
  EXPECT_EQ(client->metrics().fallback(PeerFallback::kFailed).Get(), 1u);
  EXPECT_EQ(client->metrics().peers_down.load(), 1);
}

TEST_F(Fixture, APeerThatDoesNotAnswerIsCountedSlow) {
  // A listener that never accepts: the kernel completes the connection, nothing answers.
  auto quiet = ListenTcp("127.0.0.1:0", /*any_port=*/true);
  ASSERT_TRUE(quiet.ok());
  addr_ = "127.0.0.1:" + std::to_string(BoundPort(*quiet));
  Chunk a = MakeChunk("from the store after a timeout");
  auto store = std::make_unique<MemBackend>();
  store_ = store.get();
  PeerMetrics m;
  PeerBackend client(std::move(store), PeerOptions{.self = "", .peers = {addr_}, .key = kKey,
                                                   .timeout_s = 0.2, .down_s = 60},
                     &m);
  ASSERT_TRUE(store_->Put(a.key, a.bytes.data(), a.bytes.size()).ok());
  EXPECT_EQ(*Read(&client, a), a.bytes);
  EXPECT_EQ(m.fallback(PeerFallback::kSlow).Get(), 1u);
  EXPECT_EQ(m.request(Outcome::kError).Get().count, 1u);
}

TEST(PeerListenTest, OnlyANumericAddressIsBound) {
  EXPECT_EQ(ListenTcp("localhost:0").status().code(), Code::kInvalid);
  EXPECT_EQ(ListenTcp("127.0.0.1").status().code(), Code::kInvalid);
  EXPECT_EQ(ListenTcp("127.0.0.1:99999").status().code(), Code::kInvalid);
  EXPECT_EQ(PeerServer::Start("127.0.0.1:0", "k", 1, nullptr).status().code(), Code::kInvalid);
  EXPECT_EQ(ListenTcp("127.0.0.1:0").status().code(), Code::kInvalid);
  auto s = ListenTcp("127.0.0.1:0", /*any_port=*/true);
  ASSERT_TRUE(s.ok());
  EXPECT_GT(BoundPort(*s), 0);
}

}  // namespace
}  // namespace ckptfs
