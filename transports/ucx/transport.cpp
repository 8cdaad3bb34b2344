// The `ucx` transport. Every UCP call is made under one mutex: the communicator's progress thread
// makes all calls but abort(), which may come from any thread and sends the abort notices itself.
// The worker is created UCS_THREAD_MODE_SERIALIZED accordingly; wait_for_activity sleeps on the
// worker's event fd without the mutex, so abort() never waits behind a sleeping progress thread.
#include "transports/ucx/transport.hpp"

#include <poll.h>
#include <ucp/api/ucp.h>
#include <unistd.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <mutex>
#include <sstream>
#include <thread>
#include <unordered_map>
#include <vector>

#include "runtime/base/log.hpp"

namespace co2::transport::ucx {

namespace {

using Clock = std::chrono::steady_clock;

// UCP tag = kind (2 bits) | source rank (14 bits) | the caller's tag (kTagBits = 48 bits).
// Receives match all 64 bits, so a message is matched by (source, tag) as the interface asks.
constexpr unsigned kSourceShift = kTagBits;
constexpr unsigned kKindShift = 62;
static_assert(kMaxRanks == 1 << (kKindShift - kSourceShift), "the source field holds every rank");
constexpr ucp_tag_t kMatchAll = ~ucp_tag_t(0);

// Each peer has one endpoint per lane, each its own connection (over TCP its own socket): the
// control lane (transport::kControlLaneTag), so that a control-lane message never queues behind
// the bulk bytes that UCX, the socket or the peer's receive path still holds for the others
// (docs/transports.md, "Lanes"), and `connections` bulk lanes, so that a path that caps each
// connection (a per-flow limit) still carries the link's rate. Bulk lane 0 is lane 0, the
// control lane is lane 1, further bulk lanes are 2..connections: one connection is 1.1's
// layout. A tag belongs to one lane, so messages of one tag keep their order.
constexpr int kBulkLane = 0, kControlLane = 1;
constexpr int kMaxLanes = kMaxConnections + 1;

// Control messages (Abort, Goodbye) have the top bit set: one standing receive catches both.
enum class Kind : ucp_tag_t { Data = 0, Hello = 1, Abort = 2, Goodbye = 3 };
constexpr ucp_tag_t kControlBit = ucp_tag_t(2) << kKindShift;

Kind kind_of(ucp_tag_t tag) { return Kind(tag >> kKindShift); }

ucp_tag_t wire_tag(Kind kind, int source, uint64_t tag) {
  return (ucp_tag_t(kind) << kKindShift) | (ucp_tag_t(source) << kSourceShift) | tag;
}

int source_of(ucp_tag_t tag) { return int((tag >> kSourceShift) & ucp_tag_t(kMaxRanks - 1)); }

// After an abort, how long a peer may take to settle (our notice reached it, its notice reached
// us, no transfer between us in flight; see settle_abort) before its endpoints are force-closed
// anyway (that cancels whatever is still queued on them, which releases the caller's send
// buffers). A notice that completed locally may still sit in UCX's transmit queue, which a
// forced close discards: the peer would then learn of the abort only from its endpoint timing
// out (status PeerLost instead of Aborted).
constexpr auto kNoticeGrace = std::chrono::milliseconds(1000);
// A peer's lanes are separate connections, so one lane may fail (the peer closed or aborted)
// while the other still delivers what the peer sent before: its last data, its goodbye, its
// abort notice. A lane's failure makes the peer lost once every lane failed or said goodbye,
// or after this long; until then operations that failed on that peer are held back as Pending,
// so that they report the peer's abort, or its data arrives, instead of a premature PeerLost.
constexpr auto kLaneGrace = std::chrono::milliseconds(500);
// On destruction: how long the messages this rank sent may take to leave the process, and how
// long closing the endpoints may take. Both bound the destructor when a peer is stalled.
constexpr auto kFlushLimit = std::chrono::milliseconds(2000);
constexpr auto kCloseLimit = std::chrono::milliseconds(1000);
// How long destroy waits for messages nobody will read (a peer's goodbye that arrived after the
// standing receive was withdrawn) to be taken off UCX's unexpected queue.
constexpr auto kDiscardLimit = std::chrono::milliseconds(200);
// Longest abort reason sent to the peers (the control receive buffer's size).
constexpr size_t kNoticeBytes = 512;
// ucp_worker_progress calls per progress(): enough to drain what a burst of messages queued.
constexpr int kProgressRounds = 8;

// How long wait_for_activity progresses the worker before it sleeps on the event fd; the
// environment's CO2_UCX_SPIN_US overrides it. Spinning measured no better than sleeping at once
// on a shared 2-core machine, and it takes CPU from the training thread.
constexpr std::chrono::microseconds kDefaultSpin{0};

std::chrono::microseconds spin_before_sleep(const std::string& where) {
  const char* text = std::getenv("CO2_UCX_SPIN_US");
  if (!text || !*text) return kDefaultSpin;
  char* end = nullptr;
  const long long value = std::strtoll(text, &end, 10);
  if (*end != '\0' || value < 0)
    throw RendezvousError(where + "CO2_UCX_SPIN_US must be a whole number of microseconds >= 0, "
                          "not '" + text + "'");
  return std::chrono::microseconds(value);
}

// Bulk connections per peer: CO2_UCX_CONNECTIONS where set, else `requested`, else 1.
int connections_per_peer(int requested, const std::string& where) {
  const char* text = std::getenv("CO2_UCX_CONNECTIONS");
  if (!text || !*text) return requested > 0 ? requested : kDefaultConnections;
  char* end = nullptr;
  const long value = std::strtol(text, &end, 10);
  if (*end != '\0' || value < 1 || value > kMaxConnections)
    throw RendezvousError(where + "CO2_UCX_CONNECTIONS must be a whole number in 1.." + std::to_string(kMaxConnections) +
                          ", not '" + text + "'");
  return int(value);
}

// UCX settings co2 chooses unless the environment sets them (UCX_TCP_<name>). UCX's TCP transport
// sends a large message in TX_SEG_SIZE pieces (8 KiB by default), one sendmsg and header each,
// and reads the socket in RX_SEG_SIZE pieces (64 KiB): at those sizes the syscalls and per-piece
// work cost the progress thread more than the bytes did. 256 KiB measured up to 1.8x the bus
// bandwidth on loopback at 1 MiB and 10-25 % less CPU per byte (docs/benchmarks.md, "CPU per
// byte"). Only TCP's configuration has these names (ucp_config_modify takes them unprefixed).
struct UcxDefault {
  const char* name;
  const char* value;
};
constexpr UcxDefault kTcpDefaults[] = {{"TX_SEG_SIZE", "256k"}, {"RX_SEG_SIZE", "256k"}};

// Whether UCX will use TCP: UCX_TLS leaves it among the transports and UCX_NET_DEVICES names a
// network interface (TCP's devices are the kernel's interfaces; InfiniBand ports look like
// mlx5_0:1). UCX warns about settings that no transport in use took.
bool tcp_selected() {
  const auto items_of = [](const char* text) {
    std::vector<std::string> items;
    std::istringstream list(text);
    for (std::string item; std::getline(list, item, ',');) items.push_back(item);
    return items;
  };
  if (const char* tls = std::getenv("UCX_TLS"); tls && *tls) {
    const bool excluding = tls[0] == '^';
    bool named = false;
    for (const std::string& item : items_of(tls + (excluding ? 1 : 0)))
      named = named || item == "tcp" || (!excluding && item == "all");
    if (excluding == named) return false;
  }
  if (const char* devices = std::getenv("UCX_NET_DEVICES"); devices && *devices) {
    for (const std::string& item : items_of(devices)) {
      if (item == "all" || ::access(("/sys/class/net/" + item).c_str(), F_OK) == 0) return true;
    }
    return false;
  }
  return true;
}

void apply_ucx_defaults(ucp_config_t* config) {
  if (!tcp_selected()) return;
  for (const UcxDefault& setting : kTcpDefaults) {
    if (std::getenv(("UCX_TCP_" + std::string(setting.name)).c_str())) continue;  // the user's choice
    // A UCX that does not know the name keeps its own default: the setting is an optimisation.
    (void)ucp_config_modify(config, setting.name, setting.value);
  }
}

std::string describe_tag(uint64_t tag) {
  std::ostringstream out;
  out << "0x" << std::hex << tag;
  return out.str();
}

std::string rank_list(const std::vector<int>& ranks) {
  std::string list;
  for (int rank : ranks) list += (list.empty() ? "" : ", ") + std::to_string(rank);
  return list;
}

// Statuses with which UCX fails operations on an endpoint whose peer went away.
bool means_peer_lost(ucs_status_t status) {
  switch (status) {
    case UCS_ERR_CONNECTION_RESET:
    case UCS_ERR_ENDPOINT_TIMEOUT:
    case UCS_ERR_UNREACHABLE:
    case UCS_ERR_REJECTED:
    case UCS_ERR_NOT_CONNECTED:
    case UCS_ERR_IO_ERROR:
    case UCS_ERR_CANCELED:
      return true;
    default:
      return false;
  }
}

class UcxTransport final : public PointToPoint {
 public:
  UcxTransport(int rank, int size, int connections, std::chrono::microseconds spin);
  ~UcxTransport() override;

  // This worker's address, to publish.
  std::string address() const { return address_; }
  // Creates the endpoints and exchanges a wire-up message with every rank. Throws
  // RendezvousError at `deadline`, or when a peer is unreachable.
  void connect_peers(const std::vector<std::string>& addresses, Clock::time_point deadline,
                     std::chrono::milliseconds timeout);

  int rank() const override { return rank_; }
  // A matched rendezvous receive cannot be cancelled, and without peer error handling the
  // endpoints cannot be force-closed: its data may still land after the abort.
  bool receives_may_land_late() const override { return true; }
  int size() const override { return size_; }
  int connections_per_peer() const override { return connections_; }
  Handle post_send(int peer, uint64_t tag, const void* data, size_t length) override;
  Handle post_recv(int peer, uint64_t tag, void* data, size_t length) override;
  Outcome test(Handle handle) override;
  void progress() override;
  void wait_for_activity(std::chrono::microseconds max_wait) override;
  void abort(const std::string& reason) override;
  void peers_unresponsive(const std::vector<int>& ranks) override;
  std::string error_message() const override;

 private:
  struct Peer {
    UcxTransport* owner = nullptr;
    int rank = 0;
    ucp_ep_h endpoints[kMaxLanes] = {};  // by lane; all of the transport's lanes or none
    bool closed = false;  // the endpoints were handed to ucp_ep_close_nbx
    bool lost = false;    // an error handler ran, or the peer said goodbye on every lane
    bool peer_error_handling = false;  // both created with UCP_ERR_HANDLING_MODE_PEER
    // Goodbyes heard, by lane: a goodbye follows everything the peer sent on its lane, so the
    // peer is gone only once every lane said it (the lanes' connections are not ordered).
    bool goodbye[kMaxLanes] = {};
    // After an abort: our notice to it and the flushes of its endpoints still in flight, and
    // whether its own notice arrived (it aborted too and posts nothing more to us).
    std::vector<void*> notice_sends;
    bool abort_heard = false;
    // The membership saw it not answering (peers_unresponsive): an abort does not wait for it.
    bool unresponsive = false;
    // Lanes whose endpoint failed (error handler), when the first did, and why.
    bool failed[kMaxLanes] = {};
    // Bytes of data sends in flight, by lane (choose_lane).
    size_t bytes_in_flight[kMaxLanes] = {};
    Clock::time_point failed_at{};
    std::string failed_reason;
    std::string lost_reason;
  };

  struct Operation {
    void* request = nullptr;  // the UCP request while in flight
    bool is_send = false;
    bool cancel_requested = false;
    // The UCX operation failed while its peer's lanes were unsettled (Peer::failed): the
    // status to report once they are.
    bool held = false;
    ucs_status_t held_status = UCS_OK;
    int peer = 0;
    uint64_t tag = 0;
    size_t length = 0;
    int lane = -1;  // a send counted in its peer's bytes_in_flight until it completes
    Outcome outcome = Outcome::Pending;
    std::string detail;
  };

  static void on_endpoint_error(void* arg, ucp_ep_h endpoint, ucs_status_t status);

  // The lane of a data message to `peer`: the control lane, or the bulk lane with the fewest
  // bytes in flight (a connection that a per-flow cap or a shared queue slows down drains
  // slower and gets fewer messages, so every connection stays busy and none holds the rest
  // back), looked at from the tag's own stripe on so that idle lanes take consecutive tags in
  // turn. A tag with a send still in flight to that peer keeps its lane: messages of one tag
  // keep their order. Receives match on the worker, whatever lane a message came by.
  int choose_lane(const Peer& peer, uint64_t tag) const;
  bool any_lane_failed(const Peer& peer) const {
    return std::any_of(peer.failed, peer.failed + lanes_, [](bool failed) { return failed; });
  }

  // All below: mutex_ held.
  Handle remember(Operation operation);
  void complete_send(Operation& operation, ucs_status_t status);
  void complete_recv(Operation& operation, ucs_status_t status, const ucp_tag_recv_info_t& info);
  std::string peer_lost_detail(int peer) const;
  std::string aborted_detail() const { return "ucx transport aborted: " + abort_reason_; }
  // Progresses the worker and acts on what happened. True if anything did.
  bool progress_locked();
  void post_control_recv();
  void check_control_recv();
  void on_control(const ucp_tag_recv_info_t& info);
  // Receives and drops unexpected messages whose tag matches `value` under `mask`.
  void drain_unexpected(ucp_tag_t value = 0, ucp_tag_t mask = kControlBit);
  void reap_drains();
  void mark_lost(Peer& peer, const std::string& reason);
  // Whether a lane of `peer` failed but the peer is not (yet) taken as lost: see kLaneGrace.
  bool unsettled(const Peer& peer) const;
  // Marks lost the peers whose lane failures are settled; takes in control messages first.
  void settle_lanes();
  void say_goodbye();
  void close_lost_endpoints();
  void settle_abort();
  // After an abort: whether `peer` may be closed by flushing (see settle_abort).
  bool settled(const Peer& peer) const;
  void start_abort(const std::string& reason);
  // FORCE cancels what is queued (the caller's buffers are free at once); without it the close
  // waits until what was sent has been delivered.
  void close_endpoint(Peer& peer, bool force = true);
  // Creates `slot`'s endpoint of `lane` to the worker at `address`; throws RendezvousError.
  void create_endpoint(Peer& slot, int lane, const std::string& address, const std::string& where);
  void reap_closing_requests();
  // Progresses until `done` or `deadline`; true if `done`.
  template <typename Done>
  bool progress_until(Done done, Clock::time_point deadline);

  const int rank_;
  const int size_;
  const int connections_;  // bulk lanes per peer
  const int lanes_;        // connections_ + the control lane
  const std::chrono::microseconds spin_;
  ucp_context_h context_ = nullptr;
  ucp_worker_h worker_ = nullptr;
  int event_fd_ = -1;  // -1: the worker has no wakeup support; wait by progressing
  std::string address_;
  std::vector<std::unique_ptr<Peer>> peers_;

  mutable std::mutex mutex_;
  Handle next_handle_ = 1;
  std::unordered_map<Handle, Operation> operations_;
  std::string last_error_;
  bool lost_peer_pending_ = false;  // an error handler ran since close_lost_endpoints

  bool aborted_ = false;
  std::atomic<bool> abort_signalled_{false};  // read without the mutex by wait_for_activity
  std::string abort_reason_;
  Clock::time_point aborted_at_{};
  std::string notice_out_;
  bool endpoints_closed_ = false;

  std::vector<char> control_in_ = std::vector<char>(kNoticeBytes);
  void* control_recv_ = nullptr;
  std::vector<void*> goodbyes_;
  std::vector<void*> closing_;  // ucp_ep_close_nbx requests in flight

  // Data messages received (and dropped) after an abort: the request and the buffer it fills.
  struct Drain {
    void* request = nullptr;
    std::unique_ptr<char[]> buffer;
    int peer = -1;  // the sender
  };
  std::vector<Drain> drains_;
};

std::string status_text(ucs_status_t status) { return ucs_status_string(status); }

// UCX could not make a context and worker (no usable transport or device, typically): names the
// UCX_* selections in effect, the usual cause, and what to do, in one sentence.
std::string cannot_start_message(ucs_status_t status) {
  std::string selections;
  for (const char* name : {"UCX_TLS", "UCX_NET_DEVICES"}) {
    if (const char* value = std::getenv(name))
      selections += std::string(selections.empty() ? "" : ", ") + name + "=" + value;
  }
  return "UCX cannot start here (creating the UCP context and worker failed: " + status_text(status) + ") " +
         (selections.empty() ? std::string("with UCX's default transports")
                             : "with " + selections + " in the environment") +
         ": unset UCX_TLS and UCX_NET_DEVICES, or set them to transports and devices this host has "
         "(ucx_info -d lists them; UCX_TLS=tcp UCX_NET_DEVICES=lo on one host)";
}

UcxTransport::UcxTransport(int rank, int size, int connections, std::chrono::microseconds spin)
    : rank_(rank), size_(size), connections_(connections), lanes_(connections + 1), spin_(spin) {
  const std::string where = "ucx transport rank " + std::to_string(rank) + ": ";
  ucp_config_t* config = nullptr;
  ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);  // honours UCX_* variables
  if (status != UCS_OK)
    throw RendezvousError(where + "reading the UCX configuration failed: " + status_text(status));
  apply_ucx_defaults(config);

  // Wakeup first; a configuration whose transports cannot signal an event fd falls back to
  // waiting by progressing.
  for (bool wakeup : {true, false}) {
    ucp_params_t params{};
    params.field_mask =
        UCP_PARAM_FIELD_FEATURES | UCP_PARAM_FIELD_MT_WORKERS_SHARED | UCP_PARAM_FIELD_ESTIMATED_NUM_EPS;
    params.features = UCP_FEATURE_TAG | (wakeup ? UCP_FEATURE_WAKEUP : 0);
    params.mt_workers_shared = 0;
    params.estimated_num_eps = size_t(size);
    status = ucp_init(&params, config, &context_);
    if (status != UCS_OK) continue;
    ucp_worker_params_t worker_params{};
    worker_params.field_mask = UCP_WORKER_PARAM_FIELD_THREAD_MODE;
    worker_params.thread_mode = UCS_THREAD_MODE_SERIALIZED;
    status = ucp_worker_create(context_, &worker_params, &worker_);
    if (status == UCS_OK && wakeup) {
      status = ucp_worker_get_efd(worker_, &event_fd_);
      if (status != UCS_OK) {
        ucp_worker_destroy(worker_);
        worker_ = nullptr;
      }
    }
    if (status == UCS_OK) break;
    ucp_cleanup(context_);
    context_ = nullptr;
    worker_ = nullptr;
    event_fd_ = -1;
  }
  ucp_config_release(config);
  if (!worker_) throw RendezvousError(where + cannot_start_message(status));

  ucp_address_t* address = nullptr;
  size_t address_length = 0;
  status = ucp_worker_get_address(worker_, &address, &address_length);
  if (status != UCS_OK) {
    ucp_worker_destroy(worker_);
    ucp_cleanup(context_);
    throw RendezvousError(where + "ucp_worker_get_address failed: " + status_text(status));
  }
  address_.assign(reinterpret_cast<const char*>(address), address_length);
  ucp_worker_release_address(worker_, address);

  for (int peer = 0; peer < size_; ++peer) {
    auto slot = std::make_unique<Peer>();
    slot->owner = this;
    slot->rank = peer;
    peers_.push_back(std::move(slot));
  }
  std::lock_guard<std::mutex> lock(mutex_);
  post_control_recv();
}

UcxTransport::~UcxTransport() {
  std::lock_guard<std::mutex> lock(mutex_);
  // Receives may write into buffers the caller frees after we return: withdraw them.
  for (auto& [handle, operation] : operations_)
    if (operation.request && !operation.is_send) ucp_request_cancel(worker_, operation.request);
  if (aborted_) {
    // A receive that had matched a peer's rendezvous send cannot be withdrawn: the peer is still
    // writing into it. Destroying the worker under it (or letting the process exit) cuts the
    // peer's transfer mid-way, which UCX 1.13's tcp transport does not survive (an assertion
    // in the live peer, docs/transports.md). So after an abort, wait (bounded) until the peers
    // settled and these transfers ended, as settle_abort does before closing the endpoints.
    progress_until([&] {
      check_control_recv();
      settle_abort();
      drain_unexpected();
      reap_drains();
      reap_closing_requests();
      return endpoints_closed_ && drains_.empty() && closing_.empty() &&
             std::none_of(operations_.begin(), operations_.end(), [](const auto& entry) {
               return entry.second.request &&
                      ucp_request_check_status(entry.second.request) == UCS_INPROGRESS;
             });
    }, std::max(Clock::now(), aborted_at_ + kNoticeGrace) + kCloseLimit);
  }
  if (control_recv_) ucp_request_cancel(worker_, control_recv_);

  // Messages this rank sent that have not left yet (a completed eager send may still sit in a
  // transport queue) must reach the peers before the endpoints close; the goodbye after them
  // tells the peers that nothing more will come (over transports without peer failure
  // detection, such as shared memory, it is the only way they learn).
  if (!aborted_) {
    say_goodbye();
    ucp_request_param_t param{};
    void* flush = ucp_worker_flush_nbx(worker_, &param);
    if (UCS_PTR_IS_PTR(flush)) {
      progress_until([&] { return ucp_request_check_status(flush) != UCS_INPROGRESS; },
                     Clock::now() + kFlushLimit);
      ucp_request_free(flush);
    }
  }
  for (auto& peer : peers_) close_endpoint(*peer);
  progress_until([&] {
    reap_closing_requests();
    return closing_.empty();
  }, Clock::now() + kCloseLimit);
  // Whatever arrived that nobody will receive (typically the peers' goodbyes) is taken off the
  // unexpected queue, which UCX would otherwise report, message by message, at worker destroy.
  drain_unexpected(0, 0);
  progress_until([&] {
    reap_drains();
    return drains_.empty();
  }, Clock::now() + kDiscardLimit);

  for (auto& [handle, operation] : operations_)
    if (operation.request) ucp_request_free(operation.request);
  for (auto& peer : peers_)
    for (void* request : peer->notice_sends) ucp_request_free(request);
  for (void* request : closing_) ucp_request_free(request);
  for (void* request : goodbyes_) ucp_request_free(request);
  if (control_recv_) ucp_request_free(control_recv_);
  for (Drain& drain : drains_)
    if (drain.request) ucp_request_free(drain.request);
  ucp_worker_destroy(worker_);
  ucp_cleanup(context_);
  drains_.clear();  // their buffers outlive the worker, which may still have written into them
}

void UcxTransport::on_endpoint_error(void* arg, ucp_ep_h endpoint, ucs_status_t status) {
  // Runs inside ucp_worker_progress, i.e. with the owner's mutex held: only records the
  // failure; settle_lanes decides once the control messages that preceded it were taken in.
  auto* peer = static_cast<Peer*>(arg);
  const int lanes = peer->owner->lanes_;
  const int lane = int(std::find(peer->endpoints, peer->endpoints + lanes, endpoint) - peer->endpoints);
  if (lane == lanes || peer->failed[lane]) return;
  if (!peer->owner->any_lane_failed(*peer)) {
    peer->failed_at = Clock::now();
    peer->failed_reason = std::string("ucx endpoint error: ") + status_text(status);
  }
  peer->failed[lane] = true;
  peer->owner->lost_peer_pending_ = true;
}

bool UcxTransport::unsettled(const Peer& peer) const {
  if (peer.lost) return false;
  for (int lane = 0; lane < lanes_; ++lane)
    if (peer.failed[lane] && !peer.goodbye[lane]) return true;
  return false;
}

void UcxTransport::settle_lanes() {
  check_control_recv();
  for (auto& peer : peers_) {
    if (!unsettled(*peer)) continue;
    // A lane that said goodbye and then closed is finished, not failed; the peer is lost when
    // every lane is finished or failed (all it sent before is in), or after the grace.
    bool all_finished = true;
    for (int lane = 0; lane < lanes_; ++lane)
      all_finished = all_finished && (peer->failed[lane] || peer->goodbye[lane]);
    if (all_finished || Clock::now() - peer->failed_at >= kLaneGrace)
      mark_lost(*peer, peer->failed_reason);
  }
}

void UcxTransport::mark_lost(Peer& peer, const std::string& reason) {
  if (peer.lost) return;
  peer.lost = true;
  peer.lost_reason = reason;
  lost_peer_pending_ = true;
}

void UcxTransport::say_goodbye() {
  for (auto& peer : peers_) {
    if (peer->rank == rank_ || peer->lost || peer->closed || !peer->endpoints[0]) continue;
    for (int lane = 0; lane < lanes_; ++lane) {
      ucp_request_param_t param{};
      void* request = ucp_tag_send_nbx(peer->endpoints[lane], nullptr, 0,
                                       wire_tag(Kind::Goodbye, rank_, uint64_t(lane)), &param);
      if (UCS_PTR_IS_PTR(request)) goodbyes_.push_back(request);
    }
  }
}

void UcxTransport::connect_peers(const std::vector<std::string>& addresses,
                                 Clock::time_point deadline, std::chrono::milliseconds timeout) {
  std::unique_lock<std::mutex> lock(mutex_);
  const std::string where = "ucx transport rank " + std::to_string(rank_) + ": ";
  // Every lane's endpoints are created in the same order on every rank: UCX's wire-up matches a
  // rank's endpoint with the peer's by a per-peer sequence number, so bulk meets bulk. Nothing
  // depends on it: receives match by tag whichever endpoint carried the message.
  for (int peer = 0; peer < size_; ++peer) {
    Peer& slot = *peers_[size_t(peer)];
    for (int lane = 0; lane < lanes_; ++lane)
      create_endpoint(slot, lane, addresses[size_t(peer)], where);
  }

  // Wire-up: a zero-length message each way on each lane between every pair proves both
  // directions work and has every connection up before the first collective. Slot
  // peer * lanes_ + lane.
  const size_t slots = size_t(size_) * size_t(lanes_);
  std::vector<void*> hellos_in(slots, nullptr), hellos_out(slots, nullptr);
  std::vector<bool> heard(slots, false);
  const auto release_all = [&] {
    for (void*& request : hellos_in)
      if (request) {
        ucp_request_cancel(worker_, request);
        ucp_request_free(request);
        request = nullptr;
      }
    for (void*& request : hellos_out)
      if (request) {
        ucp_request_free(request);
        request = nullptr;
      }
  };
  for (int peer = 0; peer < size_; ++peer)
    for (int lane = 0; lane < lanes_; ++lane) {
      ucp_request_param_t param{};
      param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
      void* request = ucp_tag_recv_nbx(worker_, nullptr, 0,
                                       wire_tag(Kind::Hello, peer, uint64_t(lane)), kMatchAll, &param);
      if (UCS_PTR_IS_PTR(request)) hellos_in[size_t(peer) * size_t(lanes_) + size_t(lane)] = request;
    }
  for (int peer = 0; peer < size_; ++peer)
    for (int lane = 0; lane < lanes_; ++lane) {
      ucp_request_param_t param{};
      void* request = ucp_tag_send_nbx(peers_[size_t(peer)]->endpoints[lane], nullptr, 0,
                                       wire_tag(Kind::Hello, rank_, uint64_t(lane)), &param);
      if (UCS_PTR_IS_PTR(request)) hellos_out[size_t(peer) * size_t(lanes_) + size_t(lane)] = request;
    }

  const auto settled = [&] {
    for (size_t slot = 0; slot < slots; ++slot) {
      void*& in = hellos_in[slot];
      if (in && ucp_request_check_status(in) != UCS_INPROGRESS) {
        heard[slot] = ucp_request_check_status(in) == UCS_OK;
        ucp_request_free(in);
        in = nullptr;
      }
      void*& out = hellos_out[slot];
      if (out && ucp_request_check_status(out) != UCS_INPROGRESS) {
        ucp_request_free(out);
        out = nullptr;
      }
    }
    // Nothing was sent yet that a failed lane's partner could still deliver.
    for (auto& peer : peers_)
      if (any_lane_failed(*peer)) mark_lost(*peer, peer->failed_reason);
    for (auto& peer : peers_)
      if (peer->lost) return true;
    return std::all_of(heard.begin(), heard.end(), [](bool b) { return b; }) &&
           std::all_of(hellos_out.begin(), hellos_out.end(), [](void* r) { return !r; });
  };
  const bool done = progress_until(settled, deadline);
  release_all();
  for (auto& peer : peers_)
    if (peer->lost)
      throw RendezvousError(where + "rank " + std::to_string(peer->rank) +
                            " was lost during wire-up (" + peer->lost_reason + ")");
  if (!done) {
    std::vector<int> silent;
    for (int peer = 0; peer < size_; ++peer)
      if (!std::all_of(heard.begin() + peer * lanes_, heard.begin() + (peer + 1) * lanes_, [](bool b) { return b; }))
        silent.push_back(peer);
    throw RendezvousError(where + "timed out after " + std::to_string(timeout.count()) +
                          " ms waiting for the wire-up with rank(s) " +
                          (silent.empty() ? std::string("(messages still leaving)")
                                          : rank_list(silent)) +
                          " (a peer is gone or cannot reach this host; check UCX_TLS / "
                          "UCX_NET_DEVICES)");
  }
  (void)lock;
}

void UcxTransport::create_endpoint(Peer& slot, int lane, const std::string& address,
                                   const std::string& where) {
  ucp_ep_params_t params{};
  params.field_mask = UCP_EP_PARAM_FIELD_REMOTE_ADDRESS | UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE |
                      UCP_EP_PARAM_FIELD_ERR_HANDLER;
  params.address = reinterpret_cast<const ucp_address_t*>(address.data());
  params.err_mode = UCP_ERR_HANDLING_MODE_PEER;
  // Either lane's error is the peer's: the handler records it, settle_lanes marks the peer lost.
  params.err_handler.cb = &UcxTransport::on_endpoint_error;
  params.err_handler.arg = &slot;
  ucp_ep_h& endpoint = slot.endpoints[lane];
  // The second lane takes the first one's mode, so that both are closed alike.
  ucs_status_t status = UCS_ERR_UNREACHABLE;
  if (lane == 0 || slot.peer_error_handling) {
    status = ucp_ep_create(worker_, &params, &endpoint);
    if (lane == 0) slot.peer_error_handling = status == UCS_OK;
  }
  if (status == UCS_ERR_UNREACHABLE && !slot.peer_error_handling) {
    // UCX 1.13's shared-memory transports (posix, sysv, self) cannot detect a failed peer, so
    // a configuration of only those (UCX_TLS=shm) has no transport for PEER mode. Run without
    // it: a peer's goodbye still reports a clean exit, and the communicator's no-progress
    // timeout reports a dead one (docs/transports.md).
    params.field_mask &= ~uint64_t(UCP_EP_PARAM_FIELD_ERR_HANDLER);
    params.err_mode = UCP_ERR_HANDLING_MODE_NONE;
    status = ucp_ep_create(worker_, &params, &endpoint);
  }
  if (status != UCS_OK) {
    endpoint = nullptr;
    throw RendezvousError(where + "creating the " + (lane == kControlLane ? "control" : "bulk") +
                          " lane's endpoint to rank " + std::to_string(slot.rank) +
                          " failed: " + status_text(status) +
                          " (no common UCX transport? check UCX_TLS on every rank)");
  }
}

template <typename Done>
bool UcxTransport::progress_until(Done done, Clock::time_point deadline) {
  for (;;) {
    if (done()) return true;
    if (Clock::now() >= deadline) return false;
    if (ucp_worker_progress(worker_) == 0) {
      // Nothing to do right now: sleep briefly on the event fd instead of spinning.
      if (event_fd_ >= 0 && ucp_worker_arm(worker_) == UCS_OK) {
        pollfd entry{event_fd_, POLLIN, 0};
        ::poll(&entry, 1, 1);
      }
    }
  }
}

int UcxTransport::choose_lane(const Peer& peer, uint64_t tag) const {
  if (tag & kControlLaneTag) return kControlLane;
  if (connections_ == 1) return kBulkLane;  // the default: nothing to choose, no scan per send
  const auto bulk_lane = [](int stripe) { return stripe == 0 ? kBulkLane : stripe + 1; };
  for (const auto& [handle, operation] : operations_)
    if (operation.lane >= 0 && operation.peer == peer.rank && operation.tag == tag) return operation.lane;
  const int first = int(tag % uint64_t(connections_));
  int best = bulk_lane(first);
  for (int i = 1; i < connections_; ++i) {
    const int lane = bulk_lane((first + i) % connections_);
    if (peer.bytes_in_flight[lane] < peer.bytes_in_flight[best]) best = lane;
  }
  return best;
}

Handle UcxTransport::remember(Operation operation) {
  const Handle handle = next_handle_++;
  operations_.emplace(handle, std::move(operation));
  return handle;
}

std::string UcxTransport::peer_lost_detail(int peer) const {
  return "rank " + std::to_string(peer) + " is gone (" + peers_[size_t(peer)]->lost_reason + ")";
}

void UcxTransport::complete_send(Operation& operation, ucs_status_t status) {
  if (status == UCS_OK) {
    operation.outcome = Outcome::Done;
  } else if (aborted_) {
    operation.outcome = Outcome::Aborted;
    operation.detail = aborted_detail();
  } else if (peers_[size_t(operation.peer)]->lost || means_peer_lost(status)) {
    operation.outcome = Outcome::PeerLost;
    operation.detail = peers_[size_t(operation.peer)]->lost
                           ? peer_lost_detail(operation.peer)
                           : "send to rank " + std::to_string(operation.peer) +
                                 " failed: " + status_text(status);
  } else {
    operation.outcome = Outcome::Failed;
    operation.detail = "ucx send to rank " + std::to_string(operation.peer) + " on tag " +
                       describe_tag(operation.tag) + " failed: " + status_text(status);
  }
}

void UcxTransport::complete_recv(Operation& operation, ucs_status_t status,
                                 const ucp_tag_recv_info_t& info) {
  const auto mismatch = [&](const std::string& sent) {
    operation.outcome = Outcome::SizeMismatch;
    operation.detail = "message size mismatch from rank " + std::to_string(operation.peer) +
                       " to rank " + std::to_string(rank_) + " on tag " +
                       describe_tag(operation.tag) + ": " + sent + " bytes sent, " +
                       std::to_string(operation.length) + " bytes expected";
  };
  if (status == UCS_OK) {
    if (info.length == operation.length) operation.outcome = Outcome::Done;
    else mismatch(std::to_string(info.length));
  } else if (status == UCS_ERR_MESSAGE_TRUNCATED) {
    mismatch(info.length > operation.length ? std::to_string(info.length)
                                            : "more than " + std::to_string(operation.length));
  } else if (aborted_) {
    operation.outcome = Outcome::Aborted;
    operation.detail = aborted_detail();
  } else if (peers_[size_t(operation.peer)]->lost) {
    operation.outcome = Outcome::PeerLost;
    operation.detail = peer_lost_detail(operation.peer);
  } else {
    operation.outcome = Outcome::Failed;
    operation.detail = "ucx receive from rank " + std::to_string(operation.peer) + " on tag " +
                       describe_tag(operation.tag) + " failed: " + status_text(status);
  }
}

Handle UcxTransport::post_send(int peer, uint64_t tag, const void* data, size_t length) {
  std::lock_guard<std::mutex> lock(mutex_);
  Operation operation;
  operation.is_send = true;
  operation.peer = peer;
  operation.tag = tag;
  operation.length = length;
  if (peer < 0 || peer >= size_) {
    operation.outcome = Outcome::Failed;
    operation.detail = "send to rank " + std::to_string(peer) +
                       " which is out of range for a group of " + std::to_string(size_);
  } else if (tag >> kTagBits) {
    operation.outcome = Outcome::Failed;
    operation.detail = "send tag " + describe_tag(tag) + " has more than " +
                       std::to_string(kTagBits) + " bits";
  } else if (aborted_) {
    operation.outcome = Outcome::Aborted;
    operation.detail = aborted_detail();
  } else if (peers_[size_t(peer)]->lost) {
    operation.outcome = Outcome::PeerLost;
    operation.detail = peer_lost_detail(peer);
  } else {
    ucp_request_param_t param{};
    Peer& to = *peers_[size_t(peer)];
    const int lane = choose_lane(to, tag);
    void* request = ucp_tag_send_nbx(to.endpoints[lane], data, length, wire_tag(Kind::Data, rank_, tag), &param);
    if (request != nullptr && !UCS_PTR_IS_ERR(request)) {
      operation.lane = lane;
      to.bytes_in_flight[lane] += length;
    }
    if (request == nullptr) {
      complete_send(operation, UCS_OK);
    } else if (UCS_PTR_IS_ERR(request) && unsettled(*peers_[size_t(peer)])) {
      operation.held = true;  // see test(): the peer's notice may still be on its way
      operation.held_status = UCS_PTR_STATUS(request);
    } else if (UCS_PTR_IS_ERR(request)) {
      complete_send(operation, UCS_PTR_STATUS(request));
    } else {
      operation.request = request;
    }
  }
  return remember(std::move(operation));
}

Handle UcxTransport::post_recv(int peer, uint64_t tag, void* data, size_t length) {
  std::lock_guard<std::mutex> lock(mutex_);
  Operation operation;
  operation.peer = peer;
  operation.tag = tag;
  operation.length = length;
  if (peer < 0 || peer >= size_) {
    operation.outcome = Outcome::Failed;
    operation.detail = "receive from rank " + std::to_string(peer) +
                       " which is out of range for a group of " + std::to_string(size_);
  } else if (tag >> kTagBits) {
    operation.outcome = Outcome::Failed;
    operation.detail = "receive tag " + describe_tag(tag) + " has more than " +
                       std::to_string(kTagBits) + " bits";
  } else if (aborted_) {
    operation.outcome = Outcome::Aborted;
    operation.detail = aborted_detail();
  } else {
    // Posted even when the peer is lost: a message that arrived before it died is still valid.
    // Always as a request: UCX 1.13 leaves recv_info unset when a receive completes at once
    // from the unexpected queue, and the message's length is needed to detect mismatches.
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;
    void* request = ucp_tag_recv_nbx(worker_, data, length, wire_tag(Kind::Data, peer, tag),
                                     kMatchAll, &param);
    if (UCS_PTR_IS_ERR(request)) {
      complete_recv(operation, UCS_PTR_STATUS(request), ucp_tag_recv_info_t{});
    } else {
      operation.request = request;
      if (peers_[size_t(peer)]->lost) {
        ucp_request_cancel(worker_, request);
        operation.cancel_requested = true;
      }
    }
  }
  return remember(std::move(operation));
}

Outcome UcxTransport::test(Handle handle) {
  std::lock_guard<std::mutex> lock(mutex_);
  auto found = operations_.find(handle);
  if (found == operations_.end()) {
    last_error_ = "test of unknown handle " + std::to_string(handle);
    return Outcome::Failed;
  }
  Operation& operation = found->second;
  if (operation.held) {
    settle_lanes();
    if (!aborted_ && unsettled(*peers_[size_t(operation.peer)])) return Outcome::Pending;
    if (operation.is_send) complete_send(operation, operation.held_status);
    else complete_recv(operation, operation.held_status, ucp_tag_recv_info_t{});
  } else if (operation.request) {
    ucp_tag_recv_info_t info{};
    const auto status_now = [&] {
      return operation.is_send ? ucp_request_check_status(operation.request)
                               : ucp_tag_recv_request_test(operation.request, &info);
    };
    ucs_status_t status = status_now();
    if (status == UCS_INPROGRESS && !operation.is_send && !operation.cancel_requested &&
        (aborted_ || peers_[size_t(operation.peer)]->lost)) {
      // Nothing more will arrive (or nothing more is wanted): withdraw the receive. An
      // unmatched receive completes at once with UCS_ERR_CANCELED.
      ucp_request_cancel(worker_, operation.request);
      operation.cancel_requested = true;
      status = status_now();
    }
    if (status == UCS_INPROGRESS && operation.is_send && aborted_) {
      settle_abort();
      status = status_now();
    }
    if (status == UCS_INPROGRESS) return Outcome::Pending;
    if (operation.lane >= 0) {
      peers_[size_t(operation.peer)]->bytes_in_flight[operation.lane] -= operation.length;
      operation.lane = -1;
    }
    // A peer that aborted sent its notice before closing its endpoints: if it arrived, the
    // failure is that abort, not the endpoint error that followed it. On a lane of its own the
    // notice may still be on its way: hold the failure until the peer's lanes settle.
    if (status != UCS_OK && status != UCS_ERR_MESSAGE_TRUNCATED && !aborted_) {
      settle_lanes();
      if (!aborted_ && unsettled(*peers_[size_t(operation.peer)])) {
        ucp_request_free(operation.request);
        operation.request = nullptr;
        operation.held = true;
        operation.held_status = status;
        return Outcome::Pending;
      }
    }
    if (operation.is_send) complete_send(operation, status);
    else complete_recv(operation, status, info);
    ucp_request_free(operation.request);
    operation.request = nullptr;
  }
  const Outcome outcome = operation.outcome;
  if (outcome != Outcome::Done) last_error_ = std::move(operation.detail);
  operations_.erase(found);
  return outcome;
}

bool UcxTransport::progress_locked() {
  bool happened = false;
  for (int round = 0; round < kProgressRounds; ++round) {
    if (ucp_worker_progress(worker_) == 0) break;
    happened = true;
  }
  const bool was_aborted = aborted_;
  settle_lanes();
  if (lost_peer_pending_) {
    close_lost_endpoints();
    happened = true;
  }
  if (aborted_) {
    settle_abort();
    drain_unexpected();
  }
  reap_closing_requests();
  reap_drains();
  return happened || aborted_ != was_aborted;
}

void UcxTransport::progress() {
  std::lock_guard<std::mutex> lock(mutex_);
  progress_locked();
}

void UcxTransport::wait_for_activity(std::chrono::microseconds max_wait) {
  const auto deadline = Clock::now() + max_wait;
  std::unique_lock<std::mutex> lock(mutex_);
  if (progress_locked()) return;
  // Spin briefly first: a message that is about to arrive is picked up without a sleep and
  // wakeup (tens of microseconds on loopback); after that, sleep on the event fd.
  const auto spin_until = std::min(deadline, Clock::now() + spin_);
  while (Clock::now() < spin_until) {
    if (progress_locked() || abort_signalled_) return;
  }
  if (event_fd_ < 0) {
    // No event fd: progress until something happens or the time is up.
    while (Clock::now() < deadline) {
      lock.unlock();
      std::this_thread::yield();
      lock.lock();
      if (progress_locked() || abort_signalled_) return;
    }
    return;
  }
  const ucs_status_t armed = ucp_worker_arm(worker_);
  if (armed == UCS_ERR_BUSY) {
    progress_locked();
    return;
  }
  lock.unlock();
  // abort() signals the worker after setting the flag; the flag covers a signal that arm()
  // consumed before we started waiting.
  if (!abort_signalled_.load()) {
    const auto left = std::max(std::chrono::microseconds(0),
                               std::chrono::duration_cast<std::chrono::microseconds>(deadline - Clock::now()));
    timespec wait{};
    wait.tv_sec = time_t(left.count() / 1000000);
    wait.tv_nsec = long(left.count() % 1000000) * 1000;
    pollfd entry{event_fd_, POLLIN, 0};
    ::ppoll(&entry, 1, &wait, nullptr);
  }
  lock.lock();
  progress_locked();
}

void UcxTransport::abort(const std::string& reason) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!aborted_) start_abort("rank " + std::to_string(rank_) + ": " + reason);
  }
  ucp_worker_signal(worker_);
}

void UcxTransport::peers_unresponsive(const std::vector<int>& ranks) {
  {
    std::lock_guard<std::mutex> lock(mutex_);
    for (int rank : ranks)
      if (rank >= 0 && size_t(rank) < peers_.size() && rank != rank_) peers_[size_t(rank)]->unresponsive = true;
  }
  ucp_worker_signal(worker_);
}

std::string UcxTransport::error_message() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return last_error_;
}

void UcxTransport::start_abort(const std::string& reason) {
  aborted_ = true;
  abort_signalled_ = true;
  abort_reason_ = reason;
  aborted_at_ = Clock::now();
  // Tell every live peer, best effort, so that they fail with Aborted now instead of waiting
  // out their timeout. A rank that learns of an abort from a notice passes it on too.
  notice_out_ = reason.substr(0, kNoticeBytes);
  for (auto& peer : peers_) {
    if (peer->rank == rank_ || peer->lost || peer->closed || !peer->endpoints[0]) continue;
    // On the control lane: not behind the bulk bytes queued for the peer.
    ucp_request_param_t param{};
    void* request = ucp_tag_send_nbx(peer->endpoints[kControlLane], notice_out_.data(),
                                     notice_out_.size(), wire_tag(Kind::Abort, rank_, 0), &param);
    if (UCS_PTR_IS_PTR(request)) peer->notice_sends.push_back(request);
    // Completes once the notice (and everything before it) reached the peer, not merely left
    // this process's buffers; settle_abort closes the endpoints only after that. Every lane,
    // since closing any one cancels what it still holds.
    for (ucp_ep_h endpoint : peer->endpoints) {
      if (!endpoint) continue;  // a lane this transport lacks
      ucp_request_param_t flush_param{};
      void* flush = ucp_ep_flush_nbx(endpoint, &flush_param);
      if (UCS_PTR_IS_PTR(flush)) peer->notice_sends.push_back(flush);
    }
  }
}

void UcxTransport::post_control_recv() {
  // Control messages that arrived while none was posted wait in UCX's unexpected queue, so
  // one standing receive loses nothing.
  ucp_request_param_t param{};
  param.op_attr_mask = UCP_OP_ATTR_FLAG_NO_IMM_CMPL;  // see post_recv
  void* request = ucp_tag_recv_nbx(worker_, control_in_.data(), control_in_.size(), kControlBit,
                                   kControlBit, &param);
  control_recv_ = UCS_PTR_IS_PTR(request) ? request : nullptr;
}

void UcxTransport::check_control_recv() {
  while (control_recv_) {
    ucp_tag_recv_info_t info{};
    const ucs_status_t status = ucp_tag_recv_request_test(control_recv_, &info);
    if (status == UCS_INPROGRESS) return;
    ucp_request_free(control_recv_);
    control_recv_ = nullptr;
    if (status != UCS_OK && status != UCS_ERR_MESSAGE_TRUNCATED) return;  // canceled
    on_control(info);
    post_control_recv();
  }
}

void UcxTransport::on_control(const ucp_tag_recv_info_t& info) {
  const int source = source_of(info.sender_tag);
  if (source >= size_) return;  // not from this group
  if (kind_of(info.sender_tag) == Kind::Goodbye) {
    Peer& peer = *peers_[size_t(source)];
    const uint64_t lane = info.sender_tag & ((uint64_t(1) << kSourceShift) - 1);
    if (lane < uint64_t(lanes_)) peer.goodbye[lane] = true;
    if (std::all_of(peer.goodbye, peer.goodbye + lanes_, [](bool said) { return said; }))
      mark_lost(peer, "it closed its transport");
    return;
  }
  if (kind_of(info.sender_tag) == Kind::Abort) peers_[size_t(source)]->abort_heard = true;
  if (aborted_) return;
  std::string reason(control_in_.data(), std::min(info.length, control_in_.size()));
  if (reason.empty()) reason = "rank " + std::to_string(source) + " aborted";
  start_abort(reason);
}

void UcxTransport::close_endpoint(Peer& peer, bool force) {
  if (peer.closed) return;
  peer.closed = true;
  // FORCE cancels what is still queued on the endpoint; UCX allows it only with peer error
  // handling on both sides. Without it, the close flushes (bounded by the caller's deadline).
  for (ucp_ep_h endpoint : peer.endpoints) {
    if (!endpoint) continue;  // a wire-up that failed half way, or a lane this transport lacks
    ucp_request_param_t param{};
    param.op_attr_mask = UCP_OP_ATTR_FIELD_FLAGS;
    param.flags = peer.peer_error_handling && force ? UCP_EP_CLOSE_FLAG_FORCE : 0;
    void* request = ucp_ep_close_nbx(endpoint, &param);
    if (UCS_PTR_IS_PTR(request)) closing_.push_back(request);
  }
}

void UcxTransport::close_lost_endpoints() {
  lost_peer_pending_ = false;
  // UCX asks that an endpoint that failed be closed; its sends were already failed by UCX.
  for (auto& peer : peers_)
    if (peer->lost) close_endpoint(*peer);
}

void UcxTransport::settle_abort() {
  if (endpoints_closed_) return;
  // A peer is settled once our notice reached it (the flushes of its endpoints completed), its
  // own notice arrived (it aborted too and posts nothing more to us), and no transfer between
  // us is in flight any more (either side drains what the other sent). Closing an endpoint
  // before that, or with FORCE, crashed live peers now and then inside UCX 1.13's tcp
  // transport (docs/transports.md, UCX findings).
  bool all_settled = true;
  for (auto& peer : peers_) {
    auto& sends = peer->notice_sends;
    sends.erase(std::remove_if(sends.begin(), sends.end(),
                               [](void* request) {
                                 if (ucp_request_check_status(request) == UCS_INPROGRESS)
                                   return false;
                                 ucp_request_free(request);
                                 return true;
                               }),
                sends.end());
    // A stopped peer never settles: its endpoints are force-closed at once, which cancels the
    // sends queued to it, so that the caller's failed collective is released without waiting
    // out the grace that the live peers get. One that settled after all (a rank the membership
    // left out that was alive) is closed by flushing with the others: FORCE is what crashes a
    // live peer now and then (docs/transports.md, UCX findings).
    if (peer->unresponsive && peer->peer_error_handling && !peer->closed && !settled(*peer)) {
      log::info("ucx: rank " + std::to_string(rank_) + " closes its endpoints to rank " + std::to_string(peer->rank) +
                " at once: the membership saw it not answering");
      close_endpoint(*peer, /*force=*/true);
    }
    all_settled = all_settled && (settled(*peer) || peer->unresponsive);
  }
  if (!all_settled && Clock::now() - aborted_at_ < kNoticeGrace) return;
  // Settled peers' endpoints are closed by flushing. One that did not settle in time (stopped,
  // unreachable) is force-closed: that cancels the sends still queued to it, so the caller's
  // buffers are free again. Endpoints without peer error handling cannot be force-closed; they
  // stay open so that the peers' drains can complete the sends instead (drain_unexpected).
  endpoints_closed_ = true;
  for (auto& peer : peers_)
    if (peer->peer_error_handling) close_endpoint(*peer, /*force=*/!settled(*peer));
}

bool UcxTransport::settled(const Peer& peer) const {
  // A flushing close waits for our sends to the peer; a transfer from the peer needs our
  // endpoint to answer its rendezvous. Either may need the peer's endpoint still open.
  const auto in_flight = [&](void* request) {
    return request && ucp_request_check_status(request) == UCS_INPROGRESS;
  };
  for (const auto& [handle, operation] : operations_)
    if (operation.peer == peer.rank && in_flight(operation.request)) return false;
  for (const Drain& drain : drains_)
    if (drain.peer == peer.rank && in_flight(drain.request)) return false;
  return peer.notice_sends.empty() &&
         (peer.rank == rank_ || peer.lost || peer.closed || !peer.endpoints[0] || peer.abort_heard);
}

void UcxTransport::drain_unexpected(ucp_tag_t value, ucp_tag_t mask) {
  // After an abort nobody receives data any more, but a peer's rendezvous send waits until its
  // message is received. Over transports with peer error handling, closing the endpoints
  // cancels those sends on both sides; without it (shared memory), receiving and dropping the
  // messages is what lets the senders' sends complete.
  for (;;) {
    ucp_tag_recv_info_t info{};
    ucp_tag_message_h message = ucp_tag_probe_nb(worker_, value, mask, 1, &info);
    if (!message) return;
    Drain drain;
    drain.peer = source_of(info.sender_tag);
    drain.buffer.reset(new char[std::max<size_t>(info.length, 1)]);
    ucp_request_param_t param{};
    void* request = ucp_tag_msg_recv_nbx(worker_, drain.buffer.get(), info.length, message, &param);
    if (UCS_PTR_IS_PTR(request)) {
      drain.request = request;
      drains_.push_back(std::move(drain));
    }
  }
}

void UcxTransport::reap_drains() {
  drains_.erase(std::remove_if(drains_.begin(), drains_.end(),
                               [](Drain& drain) {
                                 if (ucp_request_check_status(drain.request) == UCS_INPROGRESS)
                                   return false;
                                 ucp_request_free(drain.request);
                                 return true;
                               }),
                drains_.end());
}

void UcxTransport::reap_closing_requests() {
  closing_.erase(std::remove_if(closing_.begin(), closing_.end(),
                                [](void* request) {
                                  if (ucp_request_check_status(request) == UCS_INPROGRESS)
                                    return false;
                                  ucp_request_free(request);
                                  return true;
                                }),
                 closing_.end());
}

}  // namespace

std::unique_ptr<PointToPoint> connect(Rendezvous& rendezvous, const std::string& key_prefix,
                                      int rank, int size, std::chrono::milliseconds timeout,
                                      int connections) {
  const std::string where = "ucx transport rank " + std::to_string(rank) + ": ";
  if (size < 1 || size > kMaxRanks)
    throw RendezvousError(where + "size " + std::to_string(size) + " must be in 1.." +
                          std::to_string(kMaxRanks));
  if (rank < 0 || rank >= size)
    throw RendezvousError(where + "rank is out of range for size " + std::to_string(size));
  if (timeout.count() < 0)
    throw RendezvousError(where + "timeout must be >= 0 ms, not " + std::to_string(timeout.count()));
  if (connections < 0 || connections > kMaxConnections)
    throw RendezvousError(where + "connections per peer must be in 1.." + std::to_string(kMaxConnections) +
                          " (0: the default), not " + std::to_string(connections));
  const int lanes = connections_per_peer(connections, where);
  const auto deadline = Clock::now() + timeout;

  auto transport = std::make_unique<UcxTransport>(rank, size, lanes, spin_before_sleep(where));
  // "connections:address": every rank must make as many endpoints as its peers expect.
  rendezvous.set(key_prefix + std::to_string(rank), std::to_string(lanes) + ":" + transport->address());
  std::vector<std::string> addresses(static_cast<size_t>(size));
  for (int peer = 0; peer < size; ++peer) {
    // Rounded up: a truncated remainder would give up before the deadline the error names.
    const auto left = std::max(std::chrono::milliseconds(0),
                               std::chrono::ceil<std::chrono::milliseconds>(deadline - Clock::now()));
    std::string published;
    try {
      published = rendezvous.get(key_prefix + std::to_string(peer), left);
    } catch (const RendezvousError& error) {
      throw RendezvousError(where + "the worker address of rank " + std::to_string(peer) +
                            " did not arrive within " + std::to_string(timeout.count()) +
                            " ms: " + error.what());
    }
    const size_t colon = published.find(':');
    const std::string theirs = colon == std::string::npos ? "?" : published.substr(0, colon);
    if (theirs != std::to_string(lanes))
      throw RendezvousError(where + "rank " + std::to_string(peer) + " uses " + theirs +
                            " connection(s) per peer and this rank " + std::to_string(lanes) +
                            ": give every rank the same (CO2_UCX_CONNECTIONS, or the communicator's "
                            "connections_per_peer)");
    addresses[size_t(peer)] = published.substr(colon + 1);
  }
  transport->connect_peers(addresses, deadline, timeout);
  return transport;
}

namespace {

// Whether a UCP context and worker can be made with the current UCX_* settings: UCS_OK or the
// first failure. Kept from the first call (the settings are read once per process, as UCX does).
ucs_status_t start_status() {
  static const ucs_status_t answer = [] {
    ucp_config_t* config = nullptr;
    ucs_status_t status = ucp_config_read(nullptr, nullptr, &config);
    if (status != UCS_OK) return status;
    ucp_params_t params{};
    params.field_mask = UCP_PARAM_FIELD_FEATURES;
    params.features = UCP_FEATURE_TAG;
    ucp_context_h context = nullptr;
    status = ucp_init(&params, config, &context);
    ucp_config_release(config);
    if (status != UCS_OK) return status;
    ucp_worker_params_t worker_params{};
    ucp_worker_h worker = nullptr;
    status = ucp_worker_create(context, &worker_params, &worker);
    if (status == UCS_OK) ucp_worker_destroy(worker);
    ucp_cleanup(context);
    return status;
  }();
  return answer;
}

}  // namespace

bool available() { return start_status() == UCS_OK; }

void check_can_start() {
  const ucs_status_t status = start_status();
  if (status != UCS_OK) throw RendezvousError(cannot_start_message(status));
}

}  // namespace co2::transport::ucx
