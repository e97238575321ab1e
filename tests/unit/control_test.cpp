// The control plane's messages: every message round-trips, malformed ones are errors, and the
// tree's parent/children/subtree relations agree with each other.  How a daemon reaches the
// front end (connect_first).
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include <chrono>
#include <csignal>
#include <thread>

#include "common/error.hpp"
#include "common/net.hpp"
#include "exec/ctrl/connection.hpp"

using namespace pe;

namespace {

NodeJob sample() {
  NodeJob j;
  j.job_id = "abc123";
  j.node = 1;
  j.replace_env = true;
  j.stdin_how = StdinHow::Forward;
  j.tree_radix = 4;
  j.program = "/usr/bin/python3";
  j.program_arg0 = "python3";
  j.args = {"train.py", "--lr", ""};
  j.placement.bind_to = topo::BindTo::Core;
  j.exports = {{"A", "1"}, {"B", ""}};
  j.stdin_mode = StdinMode::OneRank;
  j.stdin_rank = 2;
  j.env = {{"PATH", "/bin"}, {"X", "y=z"}};
  j.map.world_size = 3;
  j.map.nodes = {{"a", 0, {0}}, {"b", 1, {1, 2}}};
  j.map.ranks = {{0, 0}, {1, 0}, {1, 1}};
  return j;
}

pmix::SpawnRequest sample_spawn_request() {
  pmix::SpawnRequest r;
  r.parent_nspace = "ns";
  r.parent_rank = 1;
  pmix::SpawnApp a;
  a.cmd = "/bin/worker";
  a.argv = {"worker", "-x"};
  a.env = {"OMPI_PARENT_PORT=1.0:2"};
  a.cwd = "/tmp";
  a.maxprocs = 2;
  a.hosts = {"b"};
  r.apps = {a, a};
  r.apps[1].hostfile = "/etc/hosts.mpi";
  return r;
}

SpawnJob sample_spawn_job() {
  SpawnJob j;
  j.nspace = "ns.spawn1";
  j.generation = 1;
  j.number = 1;
  j.parent_nspace = "ns";
  j.apps = sample_spawn_request().apps;
  j.appnum = {0, 0, 1};
  j.map.world_size = 3;
  j.map.nodes = {{"a", 0, {0, 2}, 4}, {"b", 1, {1}, 4}};
  j.map.ranks = {{0, 0}, {1, 0}, {0, 1}};
  j.universe_size = 8;
  return j;
}

}  // namespace

std::string encode_job(const NodeJob& j) { return ctrl::encode(ctrl::Job{j}); }
NodeJob decode_job(const std::string& s) { return ctrl::decode<ctrl::Job>(s).job; }

TEST(ControlTest, JobDescriptionRoundTrips) {
  auto j = decode_job(encode_job(sample()));
  EXPECT_EQ(j.job_id, "abc123");
  EXPECT_EQ(j.node, 1);
  EXPECT_TRUE(j.replace_env);
  EXPECT_EQ(j.stdin_how, StdinHow::Forward);
  EXPECT_EQ(j.tree_radix, 4);
  EXPECT_EQ(j.args, (std::vector<std::string>{"train.py", "--lr", ""}));
  EXPECT_EQ(j.exports, sample().exports);
  EXPECT_EQ(j.placement.bind_to, topo::BindTo::Core);
  EXPECT_EQ(j.stdin_rank, 2);
  EXPECT_EQ(j.env, sample().env);
  ASSERT_EQ(j.map.nodes.size(), 2u);
  EXPECT_EQ(j.map.nodes[1].ranks, (std::vector<int>{1, 2}));
  EXPECT_EQ(j.map.ranks[2].node, 1);
  EXPECT_EQ(j.map.ranks[2].local_rank, 1);
}

TEST(ControlTest, MappingChoicesTravelAsCheckedBytes) {
  auto j = sample();
  j.placement.map_by = topo::MapBy::Numa;
  j.placement.rank_by = topo::RankBy::Domain;
  auto k = decode_job(encode_job(j));
  EXPECT_EQ(k.placement.map_by, topo::MapBy::Numa);
  EXPECT_EQ(k.placement.rank_by, topo::RankBy::Domain);
  EXPECT_EQ(k.placement.bind_to, topo::BindTo::Core);
  j.placement.bind_to = static_cast<topo::BindTo>(9);
  EXPECT_THROW(decode_job(encode_job(j)), wire::WireError);
  j = sample();
  j.placement.rank_by = static_cast<topo::RankBy>(9);
  EXPECT_THROW(decode_job(encode_job(j)), wire::WireError);
  // Open MPI's mapping: ppr:N:OBJECT, PE=n, overload-allowed.
  j = sample();
  j.placement.map_by = topo::MapBy::Ppr;
  j.placement.ppr = 4;
  j.placement.ppr_object = topo::MapBy::Socket;
  j.placement.pe = 8;
  j.placement.bind_to = topo::BindTo::HwThread;
  j.placement.bind_overload = true;
  j.placement.hwthread_cpus = true;
  j.placement.places = {"1:0-2", "", "0,3"};  // --rankfile
  j.placement.cpu_set = "0-7";                 // --cpu-set
  j.placement.cpu_list = "1:*";                // --cpu-list
  j.placement.cpu_list_ordered = true;
  j.prefix = "/opt/ompi";                      // --prefix
  k = decode_job(encode_job(j));
  EXPECT_TRUE(k.placement.hwthread_cpus);
  EXPECT_EQ(k.placement.places, j.placement.places);
  EXPECT_EQ(k.placement.cpu_set, "0-7");
  EXPECT_EQ(k.placement.cpu_list, "1:*");
  EXPECT_TRUE(k.placement.cpu_list_ordered);
  EXPECT_EQ(k.prefix, "/opt/ompi");
  EXPECT_EQ(k.placement.map_by, topo::MapBy::Ppr);
  EXPECT_EQ(k.placement.ppr, 4);
  EXPECT_EQ(k.placement.ppr_object, topo::MapBy::Socket);
  EXPECT_EQ(k.placement.pe, 8);
  EXPECT_EQ(k.placement.bind_to, topo::BindTo::HwThread);
  EXPECT_TRUE(k.placement.bind_overload);
  j.placement.ppr_object = topo::MapBy::Gpu;  // not an object ppr counts
  EXPECT_THROW(decode_job(encode_job(j)), wire::WireError);
  j.placement.ppr_object = topo::MapBy::Core;
  j.placement.ppr = 0;
  EXPECT_THROW(decode_job(encode_job(j)), wire::WireError);
}

TEST(ControlTest, MalformedJobDescriptionsAreErrors) {
  std::string good = encode_job(sample());
  for (size_t cut = 0; cut < good.size(); cut += 7)
    EXPECT_THROW(decode_job(good.substr(0, cut)), wire::WireError) << cut;
  EXPECT_THROW(decode_job(good + "x"), wire::WireError);
  auto bad = sample();
  bad.map.nodes[1].ranks = {1, 1};  // a rank twice, rank 2 missing
  EXPECT_THROW(decode_job(encode_job(bad)), wire::WireError);
  bad = sample();
  bad.node = 5;
  EXPECT_THROW(decode_job(encode_job(bad)), wire::WireError);
  bad = sample();
  bad.map.nodes[0].ranks = {7};
  EXPECT_THROW(decode_job(encode_job(bad)), wire::WireError);
}

TEST(ControlTest, GenerationAndExitRoundTrip) {
  GenerationInfo g;
  g.job_id = "j";
  g.generation = 2;
  g.restart_count = 2;
  g.max_restarts = 5;
  g.master_addr = "10.0.0.1";
  g.master_port = 29500;
  g.dc_token = std::string(32, 'f');
  g.agent_store = true;
  auto h = ctrl::decode<ctrl::Start>(ctrl::encode(ctrl::Start{g})).gen;
  EXPECT_EQ(h.dc_token, g.dc_token);
  EXPECT_TRUE(h.agent_store);
  EXPECT_EQ(h.generation, 2);
  EXPECT_EQ(h.master_addr, "10.0.0.1");
  EXPECT_EQ(h.master_port, 29500);
  g.master_port = 70000;
  EXPECT_THROW(ctrl::decode<ctrl::Start>(ctrl::encode(ctrl::Start{g})), wire::WireError);
  WorkerExit e;
  e.rank = 3;
  e.pid = 42;
  e.status = 9;
  e.pmix_unfinalized = true;
  e.error = "ValueError: \xff bad\nline";
  auto f = ctrl::decode<ctrl::Exit>(ctrl::encode(ctrl::Exit{e})).e;
  EXPECT_EQ(f.error, e.error);
  EXPECT_EQ(f.rank, 3);
  EXPECT_EQ(f.pid, 42);
  EXPECT_EQ(f.status, 9);
  EXPECT_TRUE(f.pmix_unfinalized);
}

ctrl::Routed routed(uint32_t node, ctrl::Msg type, std::string payload) {
  ctrl::Routed r;
  r.node = node;
  r.inner.type = static_cast<uint16_t>(type);
  r.inner.payload = std::move(payload);
  return r;
}

TEST(ControlTest, RoutedEnvelope) {
  auto r = ctrl::decode<ctrl::Routed>(ctrl::encode(routed(7, ctrl::Msg::Output, "data")));
  EXPECT_EQ(r.node, 7u);
  EXPECT_EQ(r.inner.type, static_cast<uint16_t>(ctrl::Msg::Output));
  EXPECT_EQ(r.inner.payload, "data");
  EXPECT_THROW(ctrl::decode<ctrl::Routed>(ctrl::encode(routed(1, ctrl::Msg::Routed, "x"))),
               wire::WireError);
  EXPECT_THROW(ctrl::decode<ctrl::Routed>("abc"), wire::WireError);
}

// Every message type: encode, decode, encode again gives the same bytes; every truncation and a
// trailing byte are errors; the type's name is known.
// Every encoding round_trip saw, for the protocol pin (EveryMessageRoundTrips).
std::string g_encodings;

template <class M>
void round_trip(const M& m) {
  std::string bytes = ctrl::encode(m);
  g_encodings += std::to_string(static_cast<int>(M::kType)) + ":" + bytes;
  M back = ctrl::decode<M>(bytes);
  EXPECT_EQ(ctrl::encode(back), bytes) << M::kName;
  for (size_t cut = 0; cut < bytes.size(); ++cut)
    EXPECT_THROW(ctrl::decode<M>(bytes.substr(0, cut)), wire::WireError) << M::kName << " " << cut;
  EXPECT_THROW(ctrl::decode<M>(bytes + "x"), wire::WireError) << M::kName;
  EXPECT_NO_THROW(ctrl::decode_any(static_cast<uint16_t>(M::kType), bytes)) << M::kName;
  EXPECT_STREQ(ctrl::msg_name(static_cast<uint16_t>(M::kType)), M::kName);
}

TEST(ControlTest, EveryMessageRoundTrips) {
  using namespace ctrl;
  std::string n32(32, 'n');
  g_encodings.clear();
  Challenge challenge;
  challenge.nonce = n32;
  round_trip(challenge);
  Hello hello;
  hello.node = "node-a", hello.nonce = n32, hello.proof = std::string(32, 'p');
  round_trip(hello);
  round_trip(Welcome{std::string(32, 'q')});
  round_trip(Redirect{{"10.0.0.2", "192.168.1.4"}, 4711});
  round_trip(Job{sample()});
  GenerationInfo g;
  g.job_id = "j";
  g.generation = 3;
  g.master_port = 29500;
  round_trip(Start{g});
  round_trip(Remap{sample().map});
  round_trip(Signal{SIGTERM});
  round_trip(Stdin{2, std::string("line\n\0x", 8)});
  round_trip(StdinClose{});
  round_trip(ProcFailed{2, 5, 7, true});
  round_trip(ProcFailed{2, 1, 3, false, 1});
  round_trip(FenceDone{"ns", 4, 0, "all the data"});
  round_trip(FenceDone{"ns", 4, 0, "a piece", true});
  round_trip(DmodexReq{1ull << 40, "ns", 5});
  round_trip(DmodexResp{1ull << 40, -1, "blob"});
  round_trip(Ready{29500, 4000, {"10.0.0.1"}});
  round_trip(Output{1, 2, 2, "err line\n"});
  WorkerExit e;
  e.rank = 1;
  e.status = 256;
  e.bind_failed = true;
  round_trip(Exit{e});
  round_trip(Abort{1, 2, 300, 7, "MPI_Abort"});
  round_trip(Fence{"ns", 9, true, "mine"});
  round_trip(StartFailed{3, "no such program"});
  round_trip(StdinDrained{});
  round_trip(Port{12345});
  round_trip(Lost{"gone"});
  round_trip(Joined{});
  round_trip(Heartbeat{});
  round_trip(routed(kAllNodes, Msg::Signal, encode(Signal{SIGINT})));
  round_trip(Output{1, 2, 1, "child line\n", 3});
  e.spawn = 2;
  round_trip(Exit{e});
  round_trip(Fence{"connect|ns:*;ns.spawn1:0,2", 0, false, ""});
  round_trip(SpawnReq{7, sample_spawn_request()});
  round_trip(SpawnResp{7, "", "ns.spawn1"});
  round_trip(SpawnResp{8, "no free slots", ""});
  round_trip(SpawnStart{sample_spawn_job()});
  round_trip(SpawnStarted{"ns.spawn1", 2, ""});
  round_trip(SpawnStop{0, 2});
  round_trip(Publish{{{"port:accept", std::string("\0packed", 7)}}});
  round_trip(Lookup{3, {"port:accept", "port:connect"}});
  round_trip(LookupResp{3, {{"port:accept", "v"}}});
  round_trip(Unpublish{{"port:accept"}});
  round_trip(JobEnd{3});
  round_trip(Leave{"no longer listed by its node source"});
  // The protocol pin: these encodings change when a message's fields change, and then two
  // builds cannot talk; the handshake says so only if the version changed too.
  uint64_t h = 1469598103934665603ull;  // FNV-1a
  for (char c : g_encodings) h = (h ^ static_cast<unsigned char>(c)) * 1099511628211ull;
  const std::pair<uint32_t, uint64_t> pinned = {6, 0x5785eb2fa4410f3aull};
  EXPECT_EQ(std::make_pair(kProtocolVersion, h), pinned)
      << "the control messages changed: add 1 to ctrl::kProtocolVersion (messages.hpp) and pin "
         "the new version with this digest, 0x"
      << std::hex << h;
  EXPECT_STREQ(msg_name(999), "unknown");
  EXPECT_THROW(decode_any(999, ""), wire::WireError);
}

TEST(ControlTest, SpawnMessagesCarryEverything) {
  using namespace ctrl;
  SpawnJob j = decode<SpawnStart>(encode(SpawnStart{sample_spawn_job()})).job;
  EXPECT_EQ(j.nspace, "ns.spawn1");
  EXPECT_EQ(j.appnum, (std::vector<int>{0, 0, 1}));
  ASSERT_EQ(j.apps.size(), 2u);
  EXPECT_EQ(j.apps[0].argv, (std::vector<std::string>{"worker", "-x"}));
  EXPECT_EQ(j.apps[0].env, (std::vector<std::string>{"OMPI_PARENT_PORT=1.0:2"}));
  EXPECT_EQ(j.apps[1].hostfile, "/etc/hosts.mpi");
  EXPECT_EQ(j.map.nodes[0].slots, 4);
  EXPECT_EQ(j.map.nodes[0].ranks, (std::vector<int>{0, 2}));
  EXPECT_EQ(j.universe_size, 8);
  auto bad = sample_spawn_job();
  bad.appnum = {0, 2, 1};  // no application 2
  EXPECT_THROW(decode<SpawnStart>(encode(SpawnStart{bad})), wire::WireError);
  bad.appnum = {0, 0};  // a rank without an application
  EXPECT_THROW(decode<SpawnStart>(encode(SpawnStart{bad})), wire::WireError);
}

TEST(ControlTest, MessagesCheckTheirValues) {
  using namespace ctrl;
  EXPECT_THROW(decode<Signal>(encode(Signal{0})), wire::WireError);
  EXPECT_THROW(decode<Signal>(encode(Signal{NSIG})), wire::WireError);
  Challenge c;
  c.nonce = std::string(33, 'n');
  EXPECT_THROW(decode<Challenge>(encode(c)), wire::WireError);
  Hello h;
  h.node = std::string(2000, 'h');
  EXPECT_THROW(encode(h), wire::WireError);
  std::vector<std::string> many(300, "a");
  EXPECT_THROW(decode<Redirect>(encode(Redirect{many, 1})), wire::WireError);
  NodeJob j = sample();
  j.stdin_rank = 9;
  EXPECT_THROW(decode<Job>(encode(Job{j})), wire::WireError);
  std::string job = encode(Job{sample()});
  // The stdin mode's byte is out of range: find it by encoding two values and diffing.
  j = sample();
  j.stdin_mode = StdinMode::None;
  std::string other = encode(Job{j});
  ASSERT_EQ(other.size(), job.size());
  size_t at = 0;
  while (at < job.size() && job[at] == other[at]) ++at;
  ASSERT_LT(at, job.size());
  job[at] = 9;
  EXPECT_THROW(decode<Job>(job), wire::WireError);
}

TEST(ControlTest, DispatcherCallsTheHandlerOfTheType) {
  ctrl::Dispatcher<int> d;
  int got_sig = 0, from = -1;
  d.on<ctrl::Signal>([&](int node, ctrl::Signal& m) { got_sig = m.sig, from = node; });
  wire::Frame f{static_cast<uint16_t>(ctrl::Msg::Signal), 0, ctrl::encode(ctrl::Signal{SIGUSR1})};
  d.dispatch(f, 3);
  EXPECT_EQ(got_sig, SIGUSR1);
  EXPECT_EQ(from, 3);
  wire::Frame other{static_cast<uint16_t>(ctrl::Msg::Port), 0, ctrl::encode(ctrl::Port{1})};
  EXPECT_THROW(d.dispatch(other, 0), wire::WireError);
}

TEST(ControlTest, TreeRelationsAgree) {
  for (int radix : {1, 2, 3, 32}) {
    const int n = 200;
    std::vector<int> seen(n, 0);
    for (int p = -1; p < n; ++p) {
      std::vector<int> kids;
      if (p < 0) {
        for (int i = 0; i < std::min(radix, n); ++i) kids.push_back(i);
      } else {
        kids = ctrl::tree_children(p, radix, n);
      }
      EXPECT_LE(kids.size(), static_cast<size_t>(radix));
      for (int c : kids) {
        EXPECT_EQ(ctrl::tree_parent(c, radix), p) << radix << " " << c;
        ++seen[c];
        if (p >= 0) {
          EXPECT_TRUE(ctrl::in_subtree(p, c, radix));
          EXPECT_FALSE(ctrl::in_subtree(c, p, radix));
        }
      }
    }
    for (int i = 0; i < n; ++i) EXPECT_EQ(seen[i], 1) << "radix " << radix << " node " << i;
  }
}

// connect_first: every address at once, again and again until one answers.
namespace {

// A listening socket on 127.0.0.1 (its port in *port), or, listen=false, a port nothing
// listens on (bound, then closed).
pe::UniqueFd loopback_port(int* port, bool listen = true) {
  pe::UniqueFd fd(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
  struct sockaddr_in sa {};
  sa.sin_family = AF_INET;
  sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  EXPECT_EQ(::bind(fd.get(), reinterpret_cast<struct sockaddr*>(&sa), sizeof sa), 0);
  socklen_t len = sizeof sa;
  ::getsockname(fd.get(), reinterpret_cast<struct sockaddr*>(&sa), &len);
  *port = ntohs(sa.sin_port);
  if (listen) ::listen(fd.get(), 4);
  else fd.reset();
  return fd;
}

}  // namespace

TEST(ConnectFirstTest, TheAddressThatAnswersWinsAndOneThatComesLaterIsTriedAgain) {
  int closed = 0, open = 0;
  loopback_port(&closed, false);
  auto l = loopback_port(&open);
  auto t0 = std::chrono::steady_clock::now();
  auto fd = pe::connect_first({{"127.0.0.1", closed}, {"127.0.0.1", open}}, 10, 3);
  EXPECT_TRUE(fd.valid());
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  // Refused at first: the port listens a moment later (a front end that was not up yet).
  int later = 0;
  loopback_port(&later, false);
  std::thread up([&] {
    std::this_thread::sleep_for(std::chrono::milliseconds(800));
    pe::UniqueFd s(::socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0));
    int one = 1;
    ::setsockopt(s.get(), SOL_SOCKET, SO_REUSEADDR, &one, sizeof one);
    struct sockaddr_in sa {};
    sa.sin_family = AF_INET;
    sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    sa.sin_port = htons(static_cast<uint16_t>(later));
    ::bind(s.get(), reinterpret_cast<struct sockaddr*>(&sa), sizeof sa);
    ::listen(s.get(), 4);
    std::this_thread::sleep_for(std::chrono::milliseconds(2000));
  });
  auto fd2 = pe::connect_first({{"127.0.0.1", later}}, 10, 3);
  EXPECT_TRUE(fd2.valid());
  up.join();
  // Nothing answers: a TimeoutError naming the address and its trouble, at the timeout.
  try {
    pe::connect_first({{"127.0.0.1", closed}}, 1, 3);
    ADD_FAILURE() << "connected to a closed port";
  } catch (const pe::TimeoutError& e) {
    EXPECT_NE(std::string(e.what()).find("127.0.0.1:" + std::to_string(closed) +
                                         ": Connection refused"),
              std::string::npos)
        << e.what();
  }
}

TEST(ControlTest, HandshakesSayWhichProtocolThePeerSpeaks) {
  using namespace ctrl;
  Hello h;
  h.node = "n";
  EXPECT_EQ(protocol_mismatch(encode(h)), "");
  EXPECT_EQ(protocol_mismatch(encode(Challenge{})), "");
  h.protocol = kProtocolMagic | 9;
  EXPECT_EQ(protocol_mismatch(encode(h)), "control protocol 9");
  // A build before the field: its hello starts with the node name's length.
  std::string old = encode(Hello{}).substr(4);
  EXPECT_EQ(protocol_mismatch(old),
            "an older control protocol, without a version (control protocol 1)");
  EXPECT_EQ(protocol_mismatch("ab"), "no control protocol (not a pytorch_exec)");
  EXPECT_NE(protocol_here().find("control protocol " + std::to_string(kProtocolVersion)),
            std::string::npos);
}
