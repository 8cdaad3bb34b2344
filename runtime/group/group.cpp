#include "runtime/group/group.hpp"


#include <unistd.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <map>
#include <mutex>
#include <random>
#include <sstream>
#include <stdexcept>
#include <vector>

#include "runtime/base/log.hpp"
#include "runtime/group/addresses.hpp"
#include "runtime/group/local_membership.hpp"
#include "runtime/group/membership.hpp"
#include "runtime/outer/codec_isa.hpp"
#include "rendezvous/tcp_store.hpp"
#include "transports/local/transport.hpp"
#ifdef CO2_HAVE_UCX
#include "transports/ucx/transport.hpp"
#endif
#ifdef CO2_HAVE_NCCL
#include "transports/nccl/transport.hpp"
#endif

namespace co2 {
namespace {

using std::chrono::milliseconds;

constexpr const char* kIdPrefix = "co2-id-";


// Store servers this process runs: the ones behind ids it made (until a group formed from the id
// met here) and the MASTER_PORT one of rank 0 (shared by every communicator that uses it).
struct ServerRegistry {
  std::mutex mutex;
  std::map<std::string, std::shared_ptr<store::TcpStoreServer>> by_id;
  std::map<uint16_t, std::weak_ptr<store::TcpStoreServer>> by_port;
};

ServerRegistry& servers() {
  static ServerRegistry* registry = new ServerRegistry;  // never destroyed: used at exit
  return *registry;
}

struct IdParts {
  std::string host;
  uint16_t port = 0;
  std::string token;
};

// "co2-id-tcp:<host>:<port>:<token>"; any other text is an id of the local transport only.
bool parse_tcp_id(const std::string& id, IdParts& parts) {
  const std::string head = std::string(kIdPrefix) + "tcp:";
  if (id.compare(0, head.size(), head) != 0) return false;
  const std::string rest = id.substr(head.size());
  const size_t token_colon = rest.rfind(':');
  if (token_colon == std::string::npos) return false;
  const size_t port_colon = rest.rfind(':', token_colon - 1);
  if (port_colon == std::string::npos || token_colon == 0) return false;
  parts.host = rest.substr(0, port_colon);
  const std::string port = rest.substr(port_colon + 1, token_colon - port_colon - 1);
  parts.token = rest.substr(token_colon + 1);
  char* end = nullptr;
  const long value = std::strtol(port.c_str(), &end, 10);
  if (port.empty() || *end || value <= 0 || value > 65535 || parts.host.empty()) return false;
  parts.port = uint16_t(value);
  return true;
}

// Rank 0 serves the store at MASTER_PORT, listening where store::choose_store_bind says; every
// communicator of this process that forms over that port at the same time shares one server.
std::shared_ptr<store::TcpStoreServer> serve_master_port(const store::LaunchEnvironment& launched,
                                                         const std::string& token) {
  const uint16_t port = launched.master_port;
  ServerRegistry& registry = servers();
  std::lock_guard<std::mutex> lock(registry.mutex);
  if (auto running = registry.by_port[port].lock()) return running;
  std::string why;
  const std::string bind = store::choose_store_bind(launched, why);
  if (!why.empty()) log::warn(why);
  std::shared_ptr<store::TcpStoreServer> server;
  try {
    server = store::TcpStoreServer::start(bind, port, token);
  } catch (const store::PortInUseError&) {
    throw transport::RendezvousError(store::port_in_use_message(launched));
  }
  registry.by_port[port] = server;
  return server;
}

// Which process this is, for rank claims: random per process image, and the pid so that a child
// forked after the first call differs from its parent.
std::string process_identity() {
  static const std::string random = random_hex(8);
  return random + "-" + std::to_string(::getpid());
}

std::string describe(const GroupRequest& request) {
  return "rank " + std::to_string(request.rank) + " of " + std::to_string(request.world_size);
}

// Every rank says which world size it believes in and checks the others': a wrong WORLD_SIZE is
// a clear rendezvous error, not a hang.
void agree_on_the_group(store::Store& store, const std::string& prefix, int rank, int world_size,
                        milliseconds timeout) {
  store.set(prefix + "world/" + std::to_string(rank), std::to_string(world_size));
  const auto deadline = Clock::now() + timeout;
  for (int peer = 0; peer < world_size; ++peer) {
    const auto left = std::max(milliseconds(0), std::chrono::ceil<milliseconds>(deadline - Clock::now()));
    std::string theirs;
    try {
      theirs = store.get(prefix + "world/" + std::to_string(peer), left);
    } catch (const transport::RendezvousError& e) {
      throw transport::RendezvousError("rank " + std::to_string(peer) + " never arrived within " +
                                       std::to_string(timeout.count()) + " ms (" + e.what() + "): start all " +
                                       std::to_string(world_size) + " ranks of WORLD_SIZE (co2run -n " +
                                       std::to_string(world_size) +
                                       " starts them), each with its own RANK and the same MASTER_ADDR and "
                                       "MASTER_PORT");
    }
    if (theirs != std::to_string(world_size))
      throw transport::RendezvousError("world size mismatch: rank " + std::to_string(peer) + " says " + theirs +
                                       ", rank " + std::to_string(rank) + " says " +
                                       std::to_string(world_size));
  }
}

// Keeps every rank at the store until all have their endpoints, and the process that serves the
// store until every rank is done with it, so that the server cannot vanish under a peer.
void leave_together(store::Store& store, const std::string& prefix, int rank, int world_size, bool serves_store,
                    milliseconds timeout) {
  const auto keys = [&](const char* what) {
    std::vector<std::string> out;
    for (int peer = 0; peer < world_size; ++peer) out.push_back(prefix + what + std::to_string(peer));
    return out;
  };
  store.set(prefix + "ready/" + std::to_string(rank), "1");
  store.wait(keys("ready/"), timeout);
  store.set(prefix + "left/" + std::to_string(rank), "1");
  if (serves_store) store.wait(keys("left/"), timeout);
}

// What a build without UCX says wherever processes need it.
constexpr const char* kBuiltWithoutUcx =
    "this libco2 was built without UCX, the transport between processes: install libucx-dev and build co2 "
    "again (pip install ., or meson setup -Ducx=enabled), or run the ranks as threads of one process "
    "(transport local)";

// Whether this build has the UCX transport at all; ucx_built() also asks whether UCX can start.
constexpr bool kUcxCompiledIn =
#ifdef CO2_HAVE_UCX
    true;
#else
    false;
#endif

std::unique_ptr<transport::PointToPoint> ucx_transport(store::Store& store, const std::string& prefix, int rank,
                                                       int world_size, const CommOptions& options) {
#ifdef CO2_HAVE_UCX
  return transport::ucx::connect(store, prefix + "ucx/", rank, world_size, options.timeout, options.connections_per_peer);
#else
  (void)store, (void)prefix, (void)rank, (void)world_size, (void)options;
  fail(Status::Unsupported, kBuiltWithoutUcx);
#endif
}

std::unique_ptr<transport::Collective> nccl_transport(store::Store& store, const std::string& prefix, int rank,
                                                      int world_size, int device_index, const CommOptions& options) {
#ifdef CO2_HAVE_NCCL
  const int devices = transport::nccl::usable_devices();
  require(devices > 0, Status::Unsupported,
          "the NCCL transport needs a usable CUDA device and cudaGetDeviceCount found none on this machine: run "
          "where a GPU and its driver are visible (nvidia-smi lists them), or use UCX (transport auto) for "
          "parameters in host memory");
  require(device_index < devices, Status::InvalidArgument,
          "CUDA device " + std::to_string(device_index) + " does not exist (" + std::to_string(devices) +
              " found); device_index defaults to the launcher's LOCAL_RANK: start at most one rank per GPU, "
              "or set co2_comm_config_t.device_index");
  return transport::nccl::connect(store, prefix + "nccl", rank, world_size, device_index, options.timeout);
#else
  (void)store, (void)prefix, (void)rank, (void)world_size, (void)device_index, (void)options;
  fail(Status::Unsupported,
       "this libco2 was built without NCCL: build co2 again where nvcc and NCCL are found (/usr/local/cuda; "
       "meson setup -Dcuda=enabled -Dnccl=enabled), or use UCX (transport auto) for parameters in host memory");
#endif
}

std::shared_ptr<Communicator> connect_over_nccl(store::Store& store, const std::string& prefix, int rank, int world_size,
                                                int device_index, const CommOptions& options) {
  return std::make_shared<Communicator>(nccl_transport(store, prefix, rank, world_size, device_index, options), options);
}

// How an elastic group re-forms (Membership's ConnectGroup): over the kind it formed over, an
// NCCL group on the same device. Every change forms a new NCCL communicator with
// ncclCommInitRank through the agreed store (docs/architecture.md, "Membership": why not
// ncclCommShrink).
ConnectGroup group_connector(TransportKind kind, int nccl_device_index, const CommOptions& options) {
  if (kind == TransportKind::Nccl)
    return [nccl_device_index, options](store::Store& store, const std::string& prefix, int rank, int size) {
      return GroupTransport(nccl_transport(store, prefix, rank, size, nccl_device_index, options));
    };
  return [options](store::Store& store, const std::string& prefix, int rank, int size) {
    return GroupTransport(ucx_transport(store, prefix, rank, size, options));
  };
}

// A whole number in [0, 2^20] from the environment; 0 when unset.
int count_from_environment(const char* name) {
  const char* text = std::getenv(name);
  if (text == nullptr || *text == '\0') return 0;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  require(*end == '\0' && value >= 0 && value <= 1 << 20, Status::InvalidArgument,
          std::string(name) + " must be a whole number >= 0, not '" + text + "'");
  return int(value);
}

// CO2_ELASTIC_MIN_RANKS (co2run --elastic sets it) for a launched group whose config left
// elastic_min_ranks at 0.
int elastic_min_ranks_from_environment() { return count_from_environment("CO2_ELASTIC_MIN_RANKS"); }

void require_min_ranks_fit(const GroupRequest& request) {
  require(request.options.elastic_min_ranks <= request.world_size, Status::InvalidArgument,
          "elastic_min_ranks " + std::to_string(request.options.elastic_min_ranks) + " is larger than the group (" +
              std::to_string(request.world_size) + " ranks)");
}

// Elastic membership (runtime/group/membership.hpp): this rank's endpoint, every rank's address,
// and how the communicator re-forms over the survivors after a failure.
void make_elastic(Communicator& comm, store::Store& store, const std::string& prefix, const GroupRequest& request,
                  Door door) {
  require_min_ranks_fit(request);
  const TransportKind kind = comm.collective_stream() != nullptr ? TransportKind::Nccl : TransportKind::Ucx;
  comm.set_membership(Membership::publish(store, prefix + "membership/", request.rank, request.world_size,
                                          request.options, std::move(door),
                                          group_connector(kind, comm.collective_device(), request.options)));
}

// A communicator admitted to a running elastic group: its engine's commit receives the group's
// state (runtime/engine/membership_change.cpp).
std::shared_ptr<Communicator> joining_communicator(GroupTransport transport,
                                                   std::shared_ptr<MembershipChanges> membership,
                                                   const CommOptions& options) {
  auto comm = transport.collective ? std::make_shared<Communicator>(std::move(transport.collective), options)
                                   : std::make_shared<Communicator>(std::move(transport.point_to_point), options);
  comm->set_membership(std::move(membership));
  comm->set_joining(true);
  return comm;
}

// A process that found a running elastic group's door open: joins it (Membership::join) over
// the group's kind of transport.
std::shared_ptr<Communicator> join_running_group(const store::TcpStoreOptions& door, const CommOptions& options,
                                                 ConnectGroup connect) {
  auto [membership, transport] = Membership::join(door, options, std::move(connect));
  return joining_communicator(std::move(transport), std::move(membership), options);
}

// A launched process takes the GPU of its local rank, as torch users do with
// torch.cuda.set_device(LOCAL_RANK): NCCL would otherwise use whatever device is current when
// the communicator is made, which is device 0 on every rank before the framework sets it.
int nccl_device(int configured, const store::LaunchEnvironment& launched) {
  if (configured >= 0) return configured;
  return launched.present ? launched.local_rank : -1;
}

// Where NCCL ranks that are threads of one process exchange the NCCL id.
std::shared_ptr<store::Store> threads_store() {
  static const std::shared_ptr<store::Store> store = store::make_memory_store();
  return store;
}

}  // namespace

std::string rank_owner_key(int rank) { return "co2/rank-owner/" + std::to_string(rank); }

bool rank_claimed(store::Store& store, int rank) { return store.add(rank_owner_key(rank), 0) > 0; }

void claim_rank(store::Store& store, int rank, const std::string& process) {
  const std::string key = rank_owner_key(rank);
  // Only this process's first use of `rank` at this store counts it; later communicators of the
  // same process (a group formed again) do not.
  if (store.add(key + "/" + process, 1) != 1) return;
  const int64_t processes = store.add(key, 1);
  if (processes != 1)
    throw transport::RendezvousError("rank " + std::to_string(rank) + " joined twice: " + std::to_string(processes) +
                                     " processes were given RANK=" + std::to_string(rank) +
                                     " (check the launcher's RANK, WORLD_SIZE and MASTER_PORT)");
}

bool ucx_built() {
#ifdef CO2_HAVE_UCX
  return transport::ucx::available();
#else
  return false;
#endif
}

const char* transport_name(TransportKind kind) {
  switch (kind) {
    case TransportKind::Auto: return "auto";
    case TransportKind::Local: return "local";
    case TransportKind::Ucx: return "ucx";
    case TransportKind::Nccl: return "nccl";
  }
  return "?";
}

TransportChoice choose_transport(TransportKind requested, const std::string& environment_override,
                                 const store::LaunchEnvironment& launched, int world_size, bool ucx_is_built) {
  if (requested == TransportKind::Auto && !environment_override.empty()) {
    if (environment_override == "local") return {TransportKind::Local, "CO2_TRANSPORT=local"};
    if (environment_override == "ucx") return {TransportKind::Ucx, "CO2_TRANSPORT=ucx"};
    if (environment_override != "auto")
      fail(Status::InvalidArgument, "CO2_TRANSPORT=" + environment_override + " is not one of auto, local, ucx");
  }
  if (requested != TransportKind::Auto) return {requested, "the communicator config asks for it"};
  if (world_size == 1) return {TransportKind::Local, "a group of one needs no network"};
  if (launched.present && launched.world_size > 1) {
    if (!ucx_is_built)
      fail(Status::Unsupported, "a launcher (" + launched.source + ") started " + std::to_string(launched.world_size) +
                                    " processes, but " + kBuiltWithoutUcx);
    return {TransportKind::Ucx, "a launcher (" + launched.source + ") started " +
                                    std::to_string(launched.world_size) + " processes"};
  }
  return {TransportKind::Local, "no launcher environment (RANK/WORLD_SIZE): the ranks are threads of this process"};
}

std::shared_ptr<Communicator> form_group(const GroupRequest& original) {
  GroupRequest request = original;
  // A bad CO2_WIRE_CODEC fails here, not on the progress thread's first compressed message.
  const CodecIsa codec = codec_isa();
  const store::LaunchEnvironment launched = store::read_launch_environment();
  if (request.rank_is_default && request.unique_id.empty() && launched.present) {
    request.rank = launched.rank;
    request.world_size = launched.world_size;
  }
  const char* override_text = std::getenv("CO2_TRANSPORT");
  const TransportChoice choice =
      choose_transport(request.transport, override_text ? override_text : "", launched, request.world_size,
                       kUcxCompiledIn);
  log::info(describe(request) + ": transport " + transport_name(choice.kind) + " (" + choice.reason +
            "), wire codec " + codec_isa_name(codec));

  switch (choice.kind) {
    case TransportKind::Local: {
      require_min_ranks_fit(request);
      require(request.world_size <= transport::local::kMaxRanks, Status::InvalidArgument,
              "world_size " + std::to_string(request.world_size) +
                  " is too large for the local transport (its ranks are threads of one process): "
                  "at most " + std::to_string(transport::local::kMaxRanks));
      const std::string group = request.unique_id.empty() ? "name:" + request.group_name : "id:" + request.unique_id;
      transport::local::LinkModel link;
      try {
        link = transport::local::LinkModel::from_environment();
      } catch (const std::invalid_argument& e) {
        fail(Status::InvalidArgument, e.what());  // a malformed CO2_LOCAL_TEST_* variable is the caller's
      }
      // A thread that asks for an elastic group that is running joins it.
      if (request.options.elastic_min_ranks > 0 && LocalMembership::door_open(group)) {
        auto [membership, transport] = LocalMembership::join(group, request.options, link);
        return joining_communicator(std::move(transport), std::move(membership), request.options);
      }
      auto transport = transport::local::join(group, request.rank, request.world_size, request.options.timeout, link);
      if (!request.unique_id.empty()) {
        std::lock_guard<std::mutex> lock(servers().mutex);
        servers().by_id.erase(request.unique_id);  // the group met: its id's store is not needed
      }
      auto comm = std::make_shared<Communicator>(std::move(transport), request.options);
      if (request.options.elastic_min_ranks > 0)
        comm->set_membership(std::make_shared<LocalMembership>(group, request.rank, request.world_size,
                                                               request.options.timeout, link));
      return comm;
    }
    case TransportKind::Ucx:
    case TransportKind::Nccl: {
      // Processes meet at a TCP store: the one the id names, or rank 0's at MASTER_ADDR:PORT.
      // NCCL ranks that are threads of this process (no id, no launcher) meet in memory.
      if (choice.kind == TransportKind::Nccl && request.unique_id.empty() && !launched.present) {
        require(request.options.elastic_min_ranks == 0, Status::Unsupported,
                "elastic membership over NCCL needs ranks that are processes (started by a launcher, or "
                "formed with co2_comm_create_with_id): NCCL ranks that are threads of one process have no "
                "membership endpoints; set elastic_min_ranks = 0, or use the local transport for threads");
        const std::string group = "co2/nccl/" + request.group_name + "/";
        const int64_t generation = threads_store()->add(group + "generation/" + std::to_string(request.rank), 1);
        return connect_over_nccl(*threads_store(), group + std::to_string(generation) + "/", request.rank,
                                 request.world_size, request.device_index, request.options);
      }
#ifdef CO2_HAVE_UCX
      // Before any rank meets the store: every rank whose UCX cannot start says why, none waits
      // for a peer that already gave up.
      if (choice.kind == TransportKind::Ucx) transport::ucx::check_can_start();
#endif
      store::TcpStoreOptions where;
      where.timeout = request.options.timeout;
      std::shared_ptr<store::TcpStoreServer> server;
      if (!request.unique_id.empty()) {
        IdParts parts;
        require(parse_tcp_id(request.unique_id, parts), Status::InvalidArgument,
                "this id names no store (it was made by an older co2): make it with co2_get_unique_id");
        where.host = parts.host;
        where.port = parts.port;
        where.auth_token = parts.token;
        // Every rank of this process that uses the id holds the server until it is done with
        // the store, so that the last one to leave stops it.
        std::lock_guard<std::mutex> lock(servers().mutex);
        auto found = servers().by_id.find(request.unique_id);
        if (found != servers().by_id.end()) server = found->second;
      } else {
        require(launched.present && !launched.master_addr.empty() && launched.master_port != 0, Status::InvalidArgument,
                std::string("transport ") + transport_name(choice.kind) +
                    " needs MASTER_ADDR and MASTER_PORT (or CO2_MASTER_PORT) in the environment, as co2run "
                    "and torchrun set them; or form the group with co2_comm_create_with_id");
        where.host = launched.master_addr;
        where.port = launched.master_port;
        if (const char* token = std::getenv("CO2_AUTH_TOKEN")) where.auth_token = token;
        // Under co2run --elastic the launcher serves the store, and with it the group's door, for
        // the whole job: a lost rank 0 takes nothing with it.
        if (request.rank == 0 && !launched.launcher_serves_store) server = serve_master_port(launched, where.auth_token);
      }
      // co2run --elastic starts a failed rank again to join its running group: that group's
      // store was up, so a refused connection means the group has ended (or, where rank 0 served
      // the store, lost rank 0), not that rank 0 is late.
      const int restart = request.unique_id.empty() ? count_from_environment("CO2_RESTART_COUNT") : 0;
      if (restart > 0) where.server_may_be_late = false;
      const std::string restarted = "rank " + std::to_string(request.rank) + " was started again (CO2_RESTART_COUNT=" +
                                    std::to_string(restart) + ") to join its running elastic group, but the group's door";
      std::shared_ptr<store::Store> store;
      try {
        store = store::connect_tcp_store(where);
      } catch (const transport::RendezvousError& e) {
        if (restart == 0) throw;
        throw transport::RendezvousError(restarted + " is gone: the group has ended" +
                                         std::string(launched.launcher_serves_store
                                                         ? " (the launcher that served it exited)"
                                                         : ", or its rank 0 (which keeps the door) is gone") +
                                         " (" + e.what() + ")");
      }
      if (request.options.elastic_min_ranks == 0 && request.unique_id.empty())
        request.options.elastic_min_ranks = elastic_min_ranks_from_environment();
      // A launched rank that arrives after its elastic group formed (a restarted one) joins it.
      if (request.options.elastic_min_ranks > 0 && request.unique_id.empty() && Membership::door_open(*store))
        return join_running_group(
            where, request.options,
            group_connector(choice.kind, nccl_device(request.device_index, launched), request.options));
      // A restarted rank whose first process died before it reached the store takes its place
      // in the group still forming; one whose rank was taken finds no door to join.
      require(restart == 0 || !rank_claimed(*store, request.rank), Status::Rendezvous,
              restarted + " at " + where.host + ":" + std::to_string(where.port) + " is closed: the group is finishing, its rank 0 left, or it was not "
                  "elastic (co2run --elastic sets CO2_ELASTIC_MIN_RANKS)");
      claim_rank(*store, request.rank, process_identity());
      const int64_t generation = store->add("co2/generation/" + std::to_string(request.rank), 1);
      const std::string prefix = "co2/group" + std::to_string(generation) + "/";
      agree_on_the_group(*store, prefix, request.rank, request.world_size, request.options.timeout);
      auto comm = choice.kind == TransportKind::Ucx
                      ? std::make_shared<Communicator>(
                            ucx_transport(*store, prefix, request.rank, request.world_size, request.options),
                            request.options)
                      : connect_over_nccl(*store, prefix, request.rank, request.world_size,
                                          nccl_device(request.device_index, launched), request.options);
      if (request.options.elastic_min_ranks > 0)
        make_elastic(*comm, *store, prefix, request,
                     Door{where, server, launched.launcher_serves_store && request.unique_id.empty()});
      leave_together(*store, prefix, request.rank, request.world_size, server != nullptr, request.options.timeout);
      if (!request.unique_id.empty()) {
        std::lock_guard<std::mutex> lock(servers().mutex);
        servers().by_id.erase(request.unique_id);
      }
      return comm;
    }
    case TransportKind::Auto:
      break;
  }
  fail(Status::Internal, "choose_transport returned auto");
}

std::string make_unique_id() {
  const std::string token = random_hex(16);
  std::shared_ptr<store::TcpStoreServer> server = store::TcpStoreServer::start("", 0, token);
  const std::string id = std::string(kIdPrefix) + "tcp:" + advertised_host() + ":" +
                         std::to_string(server->port()) + ":" + token;
  std::lock_guard<std::mutex> lock(servers().mutex);
  servers().by_id[id] = std::move(server);
  return id;
}

namespace {

void wait_on_parent(Communicator& parent, const std::shared_ptr<Request>& request, const char* caller = "co2_comm_split") {
  if (request->wait_status() != Status::Ok) {
    const std::string message = parent.error_message();
    fail(parent.error_status(),
         std::string(caller) + ": " + (message.empty() ? std::string("the parent's collective failed") : message));
  }
}

}  // namespace

std::shared_ptr<Communicator> split_group(Communicator& parent, int color, int key, GroupRequest request) {
  const int size = parent.size(), me = parent.rank();
  const CollectiveId split_id{0, Purpose::Split};
  std::vector<int64_t> mine = {color, key}, all(2 * size_t(size));
  wait_on_parent(parent, parent.allgather(mine.data(), all.data(), 2, DataType::I64, split_id));

  // Members of this rank's color, in (key, parent rank) order; the first one makes the id.
  std::vector<std::pair<int64_t, int>> members;
  for (int r = 0; r < size; ++r)
    if (color >= 0 && all[2 * size_t(r)] == color) members.push_back({all[2 * size_t(r) + 1], r});
  std::sort(members.begin(), members.end());
  int sub_rank = -1;
  for (size_t i = 0; i < members.size(); ++i)
    if (members[i].second == me) sub_rank = int(i);
  const bool leader = sub_rank == 0;

  constexpr size_t kIdBytes = 128;  // CO2_UNIQUE_ID_BYTES
  std::vector<char> my_id(kIdBytes, 0), ids(kIdBytes * size_t(size), 0);
  if (leader) {
    const std::string id = make_unique_id();
    require(id.size() < kIdBytes, Status::InvalidArgument,
            "co2_comm_split: the group id does not fit (set a shorter CO2_MASTER_ADDR)");
    std::copy(id.begin(), id.end(), my_id.begin());
  }
  wait_on_parent(parent, parent.allgather(my_id.data(), ids.data(), kIdBytes / 8, DataType::I64, split_id));
  if (color < 0) return nullptr;

  const char* leader_id = ids.data() + kIdBytes * size_t(members.front().second);
  request.unique_id = std::string(leader_id, strnlen(leader_id, kIdBytes));
  request.rank = sub_rank;
  request.world_size = int(members.size());
  request.rank_is_default = false;
  if (request.transport == TransportKind::Auto && parent.collective_stream() != nullptr) {
    request.transport = TransportKind::Nccl;
    if (request.device_index < 0) request.device_index = parent.collective_device();
  }
  return form_group(request);
}

namespace {

// One rank's node name on the wire of split_nodes' all-gather: the id, then the host name and
// the source as zero-padded text (a Linux host name has at most 64 bytes; longer text is cut).
constexpr size_t kHostBytes = 256, kSourceBytes = 256;
constexpr size_t kNameWords = 1 + (kHostBytes + kSourceBytes) / 8;

void put_text(const std::string& text, char* into, size_t room) {
  std::memcpy(into, text.data(), std::min(text.size(), room - 1));
}

std::string describe_node(const store::NodeName& name) {
  if (name.id >= 0) return "node id " + std::to_string(name.id) + " from " + name.source;
  return "host '" + name.host + "'";
}

}  // namespace

NodePlace place_on_nodes(const std::vector<store::NodeName>& names, int me) {
  for (size_t r = 0; r < names.size(); ++r)
    if (names[r].id == kNodeUnresolved)
      fail(Status::InvalidArgument,
           "co2_comm_split_nodes: rank " + std::to_string(r) + " cannot tell its node: " + names[r].source);
  int by_id = -1, by_host = -1;
  for (int r = 0; r < int(names.size()); ++r) (names[size_t(r)].id >= 0 ? by_id : by_host) = r;
  if (by_id >= 0 && by_host >= 0)
    fail(Status::InvalidArgument,
         "co2_comm_split_nodes: rank " + std::to_string(by_id) + " has " + describe_node(names[size_t(by_id)]) +
             ", but rank " + std::to_string(by_host) + " only its host name (" + names[size_t(by_host)].source +
             "): launch every rank the same way, or set co2_comm_config_t.node_id on every rank");

  // Nodes in the order of their lowest parent rank; ranks of a node in parent-rank order.
  std::map<std::pair<int64_t, std::string>, int> index_of;
  std::vector<int> sizes, first_rank;
  NodePlace place;
  for (int r = 0; r < int(names.size()); ++r) {
    const store::NodeName& name = names[size_t(r)];
    const auto found = index_of.emplace(std::make_pair(name.id, name.id >= 0 ? "" : name.host), int(sizes.size()));
    if (found.second) {
      sizes.push_back(0);
      first_rank.push_back(r);
    }
    const int node = found.first->second;
    if (r == me) {
      place.node = node;
      place.local = sizes[size_t(node)];
    }
    ++sizes[size_t(node)];
  }
  place.nodes = int(sizes.size());
  place.per_node = sizes.empty() ? 0 : sizes.front();
  if (std::all_of(sizes.begin(), sizes.end(), [&](int n) { return n == place.per_node; })) return place;

  constexpr size_t kNodesNamed = 16;  // a message, not a listing of a huge cluster
  std::string listing;
  for (size_t node = 0; node < sizes.size() && node < kNodesNamed; ++node)
    listing += std::string(node ? "; " : "") + "node " + std::to_string(node) + " (" +
               describe_node(names[size_t(first_rank[node])]) + ") has " + std::to_string(sizes[node]) +
               (sizes[node] == 1 ? " rank" : " ranks");
  if (sizes.size() > kNodesNamed) listing += "; ... (" + std::to_string(sizes.size()) + " nodes)";
  fail(Status::InvalidArgument,
       "co2_comm_split_nodes: the nodes hold different numbers of ranks: " + listing +
           ". Hierarchical training needs the same number of ranks on every node (local rank j of every node "
           "carries shard j of the inter-node all-reduce)");
}

std::pair<std::shared_ptr<Communicator>, std::shared_ptr<Communicator>> split_nodes(Communicator& parent, int node_id,
                                                                                   const GroupRequest& request) {
  store::NodeName mine;
  if (node_id >= 0) {
    mine.id = node_id;
    mine.source = "co2_comm_config_t.node_id";
  } else {
    try {
      mine = store::read_node_name();
    } catch (const Error& error) {
      mine.id = kNodeUnresolved;
      mine.source = error.what();
    }
  }
  const size_t size = size_t(parent.size());
  std::vector<int64_t> record(kNameWords, 0), all(kNameWords * size, 0);
  record[0] = mine.id;
  char* text = reinterpret_cast<char*>(record.data() + 1);
  put_text(mine.host, text, kHostBytes);
  put_text(mine.source, text + kHostBytes, kSourceBytes);
  wait_on_parent(parent,
                 parent.allgather(record.data(), all.data(), kNameWords, DataType::I64, CollectiveId{0, Purpose::Split}),
                 "co2_comm_split_nodes");
  std::vector<store::NodeName> names(size);
  for (size_t r = 0; r < size; ++r) {
    const int64_t* theirs = all.data() + kNameWords * r;
    const char* their_text = reinterpret_cast<const char*>(theirs + 1);
    names[r].id = theirs[0];
    names[r].host.assign(their_text, strnlen(their_text, kHostBytes));
    names[r].source.assign(their_text + kHostBytes, strnlen(their_text + kHostBytes, kSourceBytes));
  }
  const NodePlace place = place_on_nodes(names, parent.rank());
  auto intra = split_group(parent, place.node, place.local, request);
  auto inter = split_group(parent, place.local, place.node, request);
  return {std::move(intra), std::move(inter)};
}

}  // namespace co2
