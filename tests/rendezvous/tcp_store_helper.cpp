// A real process for the TCP store tests.
//   tcp_store_helper serve TOKEN   serves a store on 127.0.0.1, prints its port, runs until killed
//   tcp_store_helper rank          one rank of a group: reads RANK, WORLD_SIZE, MASTER_ADDR,
//                                  MASTER_PORT / CO2_MASTER_PORT, CO2_AUTH_TOKEN; with
//                                  CO2_TEST_SERVE=1 rank 0 serves the store itself. Publishes an
//                                  address, reads every peer's, passes a barrier; exit 0 = all agreed.
//                                  Rank 0 listens where choose_store_bind says (CO2_STORE_BIND)
//                                  and then prints "serving".
//   tcp_store_helper group         forms a group with co2::form_group from the same variables
//                                  (rank 0 serves the store), prints "formed rank R of W" and
//                                  exits 0, or prints the error and exits 1.
#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <iostream>

#include "runtime/group/group.hpp"
#include "runtime/base/status.hpp"
#include "rendezvous/launch_environment.hpp"
#include "rendezvous/tcp_store.hpp"

using namespace co2::store;

namespace {

int serve(const std::string& token) {
  auto server = TcpStoreServer::start("127.0.0.1", 0, token);
  std::printf("%u\n", unsigned(server->port()));
  std::fflush(stdout);
  for (;;) ::pause();
}

int rank_main() {
  const LaunchEnvironment environment = read_launch_environment();
  if (!environment.present) {
    std::fprintf(stderr, "no launch environment\n");
    return 2;
  }
  const char* token = std::getenv("CO2_AUTH_TOKEN");
  std::unique_ptr<TcpStoreServer> server;
  const char* serve_flag = std::getenv("CO2_TEST_SERVE");
  if (environment.rank == 0 && serve_flag != nullptr && std::strcmp(serve_flag, "1") == 0)
  {
    std::string why;
    try {
      server = TcpStoreServer::start(choose_store_bind(environment, why), environment.master_port, token ? token : "");
    } catch (const co2::store::PortInUseError&) {
      throw co2::transport::RendezvousError(port_in_use_message(environment));  // as co2_comm_create says it
    }
    std::printf("serving\n");
    std::fflush(stdout);
  }
  TcpStoreOptions options;
  options.host = environment.master_addr;
  options.port = environment.master_port;
  options.auth_token = token ? token : "";
  options.timeout = std::chrono::seconds(60);
  auto store = connect_tcp_store(options);

  const std::string mine = "worker-" + std::to_string(environment.rank) + "@" + std::to_string(::getpid());
  store->set("address/" + std::to_string(environment.rank), mine);
  std::vector<std::string> keys;
  for (int peer = 0; peer < environment.world_size; ++peer) keys.push_back("address/" + std::to_string(peer));
  store->wait(keys, std::chrono::seconds(60));
  for (int peer = 0; peer < environment.world_size; ++peer) {
    const std::string address = store->get(keys[size_t(peer)], std::chrono::seconds(1));
    if (address.rfind("worker-" + std::to_string(peer) + "@", 0) != 0) {
      std::fprintf(stderr, "rank %d read '%s' for rank %d\n", environment.rank, address.c_str(), peer);
      return 3;
    }
  }
  // Everyone leaves after everyone has read: rank 0's server must outlive the others' reads.
  if (store->add("done", 1) == environment.world_size) store->set("all_done", "");
  if (environment.rank == 0) store->get("all_done", std::chrono::seconds(60));
  std::printf("rank %d of %d: saw %d addresses\n", environment.rank, environment.world_size, environment.world_size);
  // The node co2_comm_split_nodes would take under this launcher.
  const NodeName node = read_node_name();
  std::printf("rank %d node: %s\n", environment.rank,
              node.id >= 0 ? (std::to_string(node.id) + " from " + node.source).c_str() : "this host's name");
  return 0;
}

int group_main() {
  co2::GroupRequest request;  // rank and world size from the launcher's variables
  request.options.timeout = std::chrono::seconds(60);
  auto comm = co2::form_group(request);
  std::printf("formed rank %d of %d\n", comm->rank(), comm->size());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  try {
    if (argc == 3 && std::strcmp(argv[1], "serve") == 0) return serve(argv[2]);
    if (argc == 2 && std::strcmp(argv[1], "rank") == 0) return rank_main();
    if (argc == 2 && std::strcmp(argv[1], "group") == 0) return group_main();
  } catch (const std::exception& error) {
    std::fprintf(stderr, "tcp_store_helper: %s\n", error.what());
    return 1;
  }
  std::fprintf(stderr, "usage: tcp_store_helper serve TOKEN | rank\n");
  return 2;
}
