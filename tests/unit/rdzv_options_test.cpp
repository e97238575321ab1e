// Join mode's command line (rdzv_options.hpp): torchrun's rendezvous flags in both spellings,
// the PET_* variables of the Kubeflow training operator (the command line wins), static
// rendezvous, --rdzv-conf, and every mistake as one UsageError naming the option.
#include <gtest/gtest.h>

#include <map>
#include <string>
#include <vector>

#include "common/error.hpp"
#include "exec/frontend/cli.hpp"
#include "exec/frontend/rdzv_options.hpp"

using pe::LaunchConfig;

namespace {

const std::map<std::string, std::string> kSecret = {{"PYTORCH_EXEC_RDZV_SECRET", "s"}};

LaunchConfig config(std::vector<const char*> args,
                    std::map<std::string, std::string> env = kSecret) {
  args.insert(args.begin(), "pytorch_exec");
  args.push_back("prog");
  pe::ValidationContext ctx;
  ctx.env = std::move(env);
  ctx.default_np = 8;
  return pe::validate_options(pe::parse_command_line(static_cast<int>(args.size()), args.data()),
                              ctx);
}

std::string usage_error(std::vector<const char*> args,
                        std::map<std::string, std::string> env = kSecret) {
  try {
    config(std::move(args), std::move(env));
  } catch (const pe::UsageError& e) {
    return e.what();
  }
  return "(no error)";
}

}  // namespace

TEST(RdzvOptionsTest, TorchrunSpellingsGiveJoinMode) {
  auto c = config({"--nnodes", "2:4", "--nproc_per_node", "3", "--rdzv_endpoint", "h:1234",
                   "--rdzv_id", "job", "--rdzv_backend", "c10d"});
  EXPECT_TRUE(c.join_mode());
  EXPECT_EQ(c.rdzv_host, "h");
  EXPECT_EQ(c.rdzv_port, 1234);
  EXPECT_EQ(c.rdzv_id, "job");
  EXPECT_EQ(c.run_id, "job");  // TORCHELASTIC_RUN_ID
  EXPECT_EQ(c.np, 3);
  EXPECT_EQ(c.nnodes_min, 2);
  EXPECT_EQ(c.nnodes_max, 4);
  EXPECT_FALSE(c.rdzv_static);
  EXPECT_EQ(c.rdzv_is_host, -1);  // by address
}

TEST(RdzvOptionsTest, DefaultsAreTorchruns) {
  auto c = config({"--rdzv-endpoint", "h"});
  EXPECT_EQ(c.rdzv_port, 29400);
  EXPECT_EQ(c.rdzv_id, "none");
  EXPECT_EQ(c.np, 1);  // one rank per node, not one per processor
  EXPECT_EQ(c.nnodes_min, 1);
  EXPECT_EQ(c.nnodes_max, 1);
  EXPECT_EQ(c.join_timeout, 600);
  EXPECT_FALSE(config({"-n", "2", "prog2"}, {}).join_mode());
}

TEST(RdzvOptionsTest, TorchrunsOneNodeLinesRunOnThisMachine) {
  // --nnodes 1 (the default) with an endpoint here: nobody can join, no secret is needed.
  for (auto args : std::vector<std::vector<const char*>>{
           {"--nnodes", "1", "--rdzv-backend", "c10d", "--rdzv-endpoint", "localhost:0"},
           {"--rdzv_endpoint", "127.0.0.1:29400", "--rdzv_backend", "static"},
           {"--rdzv-backend", "c10d"}}) {
    auto c = config(args, {});
    EXPECT_FALSE(c.join_mode()) << args[0];
    EXPECT_EQ(c.nnodes_max, 0) << args[0];
  }
  EXPECT_TRUE(config({"--rdzv-endpoint", "localhost", "--nnodes", "1:2"}).join_mode());
  // --node-rank of several nodes without an address: torchrun's --master-addr 127.0.0.1.
  auto s = config({"--nnodes", "2", "--node-rank", "1", "--master-port", "7000"});
  EXPECT_TRUE(s.rdzv_static);
  EXPECT_EQ(s.rdzv_host, "127.0.0.1");
  EXPECT_EQ(s.rdzv_port, 7000);
  EXPECT_EQ(usage_error({"--rdzv-backend", "etcd"}),
            "--rdzv-backend: 'etcd' is not supported (pytorch_exec hosts its own rendezvous: use "
            "c10d or static)");
}

TEST(RdzvOptionsTest, PetVariablesFillWhatTheCommandLineLeaves) {
  std::map<std::string, std::string> env = kSecret;
  env.insert({{"PET_NNODES", "1:3"},
              {"PET_NPROC_PER_NODE", "2"},
              {"PET_RDZV_ENDPOINT", "master:5000"},
              {"PET_RDZV_ID", "pod-job"},
              {"PET_RDZV_BACKEND", "c10d"},
              {"PET_MASTER_ADDR", "master"},
              {"PET_MASTER_PORT", "23456"},
              {"PET_NODE_RANK", "1"},
              {"PET_MAX_RESTARTS", "3"},
              {"PET_RDZV_CONF", "join_timeout=30"}});
  auto c = config({}, env);
  EXPECT_EQ(c.rdzv_host, "master");  // the c10d endpoint, not MASTER_ADDR
  EXPECT_EQ(c.rdzv_port, 5000);
  EXPECT_EQ(c.rdzv_id, "pod-job");
  EXPECT_EQ(c.np, 2);
  EXPECT_EQ(c.nnodes_min, 1);
  EXPECT_EQ(c.nnodes_max, 3);
  EXPECT_EQ(c.max_restarts, 3);
  EXPECT_EQ(c.join_timeout, 30);
  // The command line wins.
  auto d = config({"--nproc-per-node", "4", "--rdzv-id", "mine", "--nnodes", "2"}, env);
  EXPECT_EQ(d.np, 4);
  EXPECT_EQ(d.rdzv_id, "mine");
  EXPECT_EQ(d.nnodes_min, 2);
  // Nodes named on the command line: not a pod's job.
  EXPECT_FALSE(config({"-H", "a,b"}, env).join_mode());
  // Empty variables are not values.
  auto raw = pe::with_pet_environment({}, {{"PET_NNODES", ""}, {"PET_STANDALONE", "1"}});
  EXPECT_FALSE(raw.nnodes);
  EXPECT_TRUE(raw.standalone);
}

TEST(RdzvOptionsTest, StaticRendezvousFromMasterAddrHasFixedRanks) {
  auto c =
      config({"--nnodes", "3", "--master-addr", "m", "--master-port", "7000", "--node-rank", "2"});
  EXPECT_TRUE(c.rdzv_static);
  EXPECT_EQ(c.rdzv_host, "m");
  EXPECT_EQ(c.rdzv_port, 7000);
  EXPECT_EQ(c.node_rank, 2);
  EXPECT_EQ(c.rdzv_is_host, 0);
  EXPECT_EQ(config({"--nnodes", "3", "--master_addr", "m", "--node_rank", "0"}).rdzv_is_host, 1);
  EXPECT_EQ(config({"--nnodes", "2", "--master-addr", "m", "--node-rank", "1"}).rdzv_port, 29500);
  EXPECT_EQ(usage_error({"--nnodes", "2:3", "--master-addr", "m", "--node-rank", "1"}),
            "static rendezvous (--master-addr, --rdzv-backend static) needs a fixed --nnodes N, "
            "not MIN:MAX");
  EXPECT_EQ(usage_error({"--nnodes", "2", "--master-addr", "m"}),
            "static rendezvous needs --node-rank");
  EXPECT_EQ(usage_error({"--nnodes", "2", "--master-addr", "m", "--node-rank", "2"}),
            "--node-rank 2 is not below --nnodes 2");
}

TEST(RdzvOptionsTest, RdzvConfMapsOntoOurSettings) {
  auto c = config({"--rdzv-endpoint", "h", "--rdzv-conf",
                   "join_timeout=20,last_call_timeout=0.5,read_timeout=7,is_host=true,"
                   "keep_alive_interval=0.5,keep_alive_max_attempt=4,use_agent_store=1"});
  EXPECT_EQ(c.join_timeout, 20);
  EXPECT_EQ(c.last_call, 0.5);
  EXPECT_EQ(c.rdzv_read_timeout, 7);
  EXPECT_EQ(c.rdzv_is_host, 1);
  EXPECT_EQ(c.heartbeat_interval, 0.5);
  EXPECT_EQ(c.heartbeat_timeout, 2);
  EXPECT_EQ(config({"--rdzv-endpoint", "h", "--rdzv-conf", "is_host=0"}).rdzv_is_host, 0);
  EXPECT_EQ(
      config({"--rdzv-endpoint", "h", "--rdzv-host", "--rdzv-conf", "is_host=0"}).rdzv_is_host, 1);
  EXPECT_EQ(usage_error({"--rdzv-endpoint", "h", "--rdzv-conf", "bogus=1"}),
            "--rdzv-conf: unknown key 'bogus' (known: join_timeout, last_call_timeout, "
            "read_timeout, is_host, keep_alive_interval, keep_alive_max_attempt)");
  EXPECT_EQ(usage_error({"--rdzv-endpoint", "h", "--rdzv-conf", "join_timeout"}),
            "--rdzv-conf: 'join_timeout' is not KEY=VALUE");
}

TEST(RdzvOptionsTest, SecretIsRequiredUnlessInsecure) {
  EXPECT_EQ(usage_error({"--rdzv-endpoint", "h"}, {}),
            "join mode needs the job's secret: --rdzv-secret-file FILE (mode 0600) or "
            "PYTORCH_EXEC_RDZV_SECRET in the environment, the same on every node (or "
            "--rdzv-insecure)");
  EXPECT_TRUE(config({"--rdzv-endpoint", "h", "--rdzv-insecure"}, {}).rdzv_insecure);
  EXPECT_EQ(config({"--rdzv-endpoint", "h", "--rdzv-secret-file", "/f"}, {}).rdzv_secret_file,
            "/f");
  EXPECT_EQ(usage_error({"--rdzv-endpoint", "h", "--rdzv-insecure"}),
            "--rdzv-insecure and a secret (--rdzv-secret-file or PYTORCH_EXEC_RDZV_SECRET) "
            "exclude each other");
}

// torchrun's single-node command lines: its static defaults name this machine, and the job
// runs as without them, with --master-port as the workers' MASTER_PORT.
TEST(RdzvOptionsTest, TorchrunOnOneNode) {
  auto c = config({"--master-port", "29533", "--nproc-per-node", "2"});
  EXPECT_FALSE(c.join_mode());
  EXPECT_EQ(c.master_port, 29533);
  EXPECT_EQ(c.np, 2);
  c = config({"--nnodes", "1", "--node-rank", "0", "--master-addr", "127.0.0.1", "--master-port",
              "29534", "--rdzv-id", "job7", "--rdzv-backend", "static"});
  EXPECT_FALSE(c.join_mode());
  EXPECT_EQ(c.master_port, 29534);
  EXPECT_EQ(c.run_id, "job7");
  EXPECT_EQ(config({"--master-addr", "elsewhere"}).master_port, 0);
  EXPECT_EQ(usage_error({"--master-addr", "m", "--node-rank", "1"}),
            "--node-rank 1 is not below --nnodes 1");
  EXPECT_TRUE(config({"--nnodes", "2", "--master-addr", "m", "--node-rank", "0"}).join_mode());
  EXPECT_EQ(config({"--nnodes", "2", "--master-addr", "m", "--node-rank", "0"}).master_port, 0);
}

TEST(RdzvOptionsTest, MistakesNameTheOption) {
  EXPECT_EQ(usage_error({"--rdzv-endpoint", "h", "--rdzv-backend", "etcd"}),
            "--rdzv-backend: 'etcd' is not supported (pytorch_exec hosts its own rendezvous: "
            "use c10d or static)");
  EXPECT_EQ(usage_error({"--rdzv-endpoint", "h:0"}), "--rdzv-endpoint: '0' is not a port number");
  EXPECT_EQ(usage_error({"--rdzv-endpoint", ":5"}), "--rdzv-endpoint: no host in ':5'");
  EXPECT_EQ(usage_error({"--rdzv-endpoint", "a:b:c"}),
            "--rdzv-endpoint: 'a:b:c' is not HOST[:PORT] (no IPv6: pytorch_exec's nodes meet "
            "over IPv4)");
  EXPECT_NE(usage_error({"--rdzv-endpoint", "[::1]:29400"}).find("no IPv6"), std::string::npos);
  EXPECT_EQ(usage_error({"--rdzv-endpoint", "10.9.9.9:"}),
            "--rdzv-endpoint: no port after the ':' in '10.9.9.9:'");
  EXPECT_EQ(usage_error({"--rdzv-endpoint", "h", "--rdzv-conf", "is_host=maybe"}),
            "--rdzv-conf is_host: 'maybe' is not true or false");
  EXPECT_EQ(config({"--rdzv-endpoint", "h", "--rdzv-conf", "is_host=Y"}).rdzv_is_host, 1);
  EXPECT_EQ(usage_error({"--rdzv-conf", "join_timeout=5"}),
            "--rdzv-conf needs --rdzv-endpoint (or --master-addr)");
  EXPECT_EQ(usage_error({"--node-rank", "1"}),
            "--node-rank 1 needs --rdzv-endpoint (or --master-addr)");
  EXPECT_EQ(usage_error({"--master-port", "x"}), "--master-port: 'x' is not a port number");
  EXPECT_EQ(usage_error({"--rdzv-backend", "c10d", "--master-addr", "m"}),
            "--rdzv-backend c10d needs --rdzv-endpoint HOST[:PORT]");
  EXPECT_EQ(usage_error({"--rdzv-endpoint", "h", "-H", "a,b"}),
            "--rdzv-endpoint: nodes join by themselves (run pytorch_exec on each); -H, --hostfile, "
            "--host-discovery and --spares do not apply");
  EXPECT_EQ(usage_error({"--standalone", "--rdzv-endpoint", "h"}),
            "--standalone runs on one node: no --rdzv-endpoint or --master-addr");
  EXPECT_FALSE(config({"--standalone", "--nproc-per-node", "2"}).join_mode());
  EXPECT_EQ(config({"--standalone", "--nproc-per-node", "auto"}).np, 8);
}
