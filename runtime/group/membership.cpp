#include "runtime/group/membership.hpp"

#include <algorithm>
#include <condition_variable>
#include <mutex>
#include <optional>
#include <sstream>
#include <thread>

#include "runtime/base/log.hpp"
#include "runtime/base/status.hpp"
#include "runtime/group/addresses.hpp"

namespace co2 {
namespace {

using std::chrono::milliseconds;
using Clock = std::chrono::steady_clock;

// How often the coordinator looks for arrivals and asks the missing ranks' endpoints.
constexpr milliseconds kSurvivorPoll{20};

// A heartbeat question that came back this much later than its deadlines allow, or one asked
// this much later than the interval, says nothing about the successor: this process itself was
// not running (stopped, or starved of CPU). The silence is counted afresh from then, so that a
// rank resumed after a stop does not blame its successor for its own pause.
constexpr milliseconds kWatcherStall{1000};
// The shortest deadline of a heartbeat question: the one asked as the silence nears the probe's
// or the communicator's timeout waits only for the rest of it (so the silence is kept, and the
// failure comes, at that mark, not up to a question's deadline after it), but not so little that
// a live endpoint on a busy machine could not answer it after all.
constexpr milliseconds kShortestQuestion{10};

std::string ranks_text(const std::vector<int>& ranks) {
  std::string out;
  for (int r : ranks) out += (out.empty() ? "" : ",") + std::to_string(r);
  return out;
}

std::vector<int> parse_ranks(const std::string& text) {
  std::vector<int> out;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) out.push_back(std::stoi(item));
  return out;
}

std::shared_ptr<store::Store> connect_within(store::TcpStoreOptions where, milliseconds timeout) {
  where.timeout = timeout;
  where.server_may_be_late = false;  // every endpoint was up at formation: refused means gone
  return store::connect_tcp_store(where);
}

// Each rank records at its own endpoint the last generation it agreed on, so that a rank that
// was stopped while the others re-formed cannot start a second group when it resumes.
constexpr const char* kAgreedKey = "co2/elastic/agreed";

// The generation the rank behind `store` last agreed on (0: none), or -1 when it does not answer
// within the store's deadline.
int64_t agreed_generation(store::Store& store) {
  try {
    return store.add(kAgreedKey, 0);
  } catch (const std::exception&) {
    return -1;
  }
}

// The door's keys, at the store the group formed at.
constexpr const char* kDoorOpen = "co2/elastic/door/open";
constexpr const char* kDoorRequests = "co2/elastic/door/requests";  // join requests so far
std::string join_key(int64_t request) { return "co2/elastic/door/join/" + std::to_string(request); }
std::string generation_prefix(uint64_t generation) { return "co2/elastic/" + std::to_string(generation) + "/"; }

store::TcpStoreOptions parse_endpoint(const std::string& text) {
  std::stringstream in(text);
  store::TcpStoreOptions where;
  in >> where.host >> where.port >> where.auth_token;
  return where;
}

std::string endpoint_text(const store::TcpStoreOptions& where) {
  return where.host + " " + std::to_string(where.port) + " " + where.auth_token;
}

// Where a survivor reports, under the agreement's prefix, how long its ring successor (`rank`,
// in the old group) had left its heartbeat unanswered when the survivor arrived: milliseconds.
std::string silence_key(const std::string& prefix, int rank) { return prefix + "silence/" + std::to_string(rank); }

bool same_endpoint(const store::TcpStoreOptions& a, const store::TcpStoreOptions& b) {
  return a.host == b.host && a.port == b.port && a.auth_token == b.auth_token;
}

milliseconds since(Clock::time_point then) {
  return std::chrono::duration_cast<milliseconds>(Clock::now() - then);
}

// Where a watcher keeps, at its own endpoint, how long the endpoint at `watched` had left its
// heartbeat unanswered when it last looked (milliseconds): for ranks that look for a coordinator
// and do not watch that endpoint themselves.
std::string heartbeat_key(const store::TcpStoreOptions& watched) {
  return "co2/elastic/heartbeat/" + watched.host + ":" + std::to_string(watched.port);
}

enum class Answer { Yes, Refused, Silent };
struct Reply {
  Answer answer = Answer::Silent;
  int64_t generation = -1;  // the one the endpoint agreed on last, when it answered
};

// One question to the endpoint at `where`, waiting at most `deadline`. A failure well before the
// deadline is a refusal (the process is gone); one at the deadline is silence (it may be stopped).
Reply ask(const store::TcpStoreOptions& where, milliseconds deadline) {
  const Clock::time_point asked = Clock::now();
  Reply reply;
  try {
    reply.generation = agreed_generation(*connect_within(where, std::max(deadline, milliseconds(1))));
  } catch (const std::exception&) {
  }
  reply.answer = reply.generation >= 0                 ? Answer::Yes
                 : Clock::now() - asked < deadline / 2 ? Answer::Refused
                                                       : Answer::Silent;
  return reply;
}

}  // namespace

// The heartbeat (membership.hpp): a thread that asks one endpoint, the ring successor's, whether
// it is there, and keeps since when its questions have gone unanswered (also at its own endpoint,
// heartbeat_key). Once a successor has left its questions unanswered for the communicator's
// timeout, and the last one timed out rather than being refused (a refusal is a process that is
// gone or left: the transport sees that itself), it fails the communicator through the sink the
// communicator handed over (MembershipChanges::report_failures_to), once per successor watched.
// Each of its store calls waits at most kHeartbeatDeadline, so stopping it waits no longer than a
// few of those.
class SuccessorWatch {
 public:
  // `own`: this process's endpoint, where it keeps what it saw (heartbeat_key). `fail_after`: the
  // communicator's no-progress timeout, the silence that fails it.
  SuccessorWatch(store::TcpStoreOptions own, milliseconds fail_after)
      : own_(std::move(own)), fail_after_(fail_after), thread_([this] { run(); }) {}

  ~SuccessorWatch() {
    {
      std::lock_guard<std::mutex> lock(mutex_);
      stopping_ = true;
    }
    changed_.notify_all();
    thread_.join();
  }

  // Watches `successor`, rank `rank` of the group, from now on (nothing: watches nobody),
  // forgetting what it saw of the one before. Once it returned, no failure found for the one
  // before reaches the communicator.
  void watch(std::optional<store::TcpStoreOptions> successor, int rank = -1) {
    {
      std::lock_guard<std::mutex> reporting(report_mutex_);
      std::lock_guard<std::mutex> lock(mutex_);
      successor_ = std::move(successor);
      successor_rank_ = rank;
      ++version_;
      unanswered_since_.reset();
    }
    changed_.notify_all();
  }

  // While held, the watcher watches on but fails nothing (the membership is changing). Once
  // hold(true) returned, no failure is being reported.
  void hold(bool held) {
    std::lock_guard<std::mutex> reporting(report_mutex_);
    std::lock_guard<std::mutex> lock(mutex_);
    held_ = held;
  }

  // Where a silent successor's failure goes (empty: nowhere). Once it returned, the sink before
  // is neither running nor called again.
  void report_to(MembershipChanges::FailureSink fail) {
    std::lock_guard<std::mutex> reporting(report_mutex_);
    report_ = std::move(fail);
  }

  // How long a question to `successor` has gone unanswered (zero while it answers, and for an
  // endpoint this watcher does not watch).
  milliseconds silence_of(const store::TcpStoreOptions& successor) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!successor_ || !same_endpoint(*successor_, successor) || !unanswered_since_) return milliseconds(0);
    return since(*unanswered_since_);
  }

  // The rank watched, if it has left questions unanswered for `silence` or longer.
  std::optional<int> silent_for(milliseconds silence) const {
    std::lock_guard<std::mutex> lock(mutex_);
    if (!successor_ || !unanswered_since_ || since(*unanswered_since_) < silence) return std::nullopt;
    return successor_rank_;
  }

 private:
  void run() {
    std::unique_lock<std::mutex> lock(mutex_);
    uint64_t watching = version_ - 1;
    std::shared_ptr<store::Store> client;  // kept: a question on a live connection costs one round trip
    milliseconds client_deadline{0};       // the deadline `client` was made with
    std::shared_ptr<store::Store> own;
    // The silence kept at heartbeat_key() of the one watched; -1: not written since it was
    // re-pointed (the key may hold what an earlier watch of the same endpoint saw).
    int64_t published = -1;
    bool reported = false;  // this successor's silence failed the communicator already
    Clock::time_point looked = Clock::now();  // when the last question came back
    while (!stopping_) {
      if (watching != version_) {
        watching = version_;
        client.reset();
        published = -1;
        reported = false;
        looked = Clock::now();
      }
      if (!successor_) {
        changed_.wait(lock, [&] { return stopping_ || watching != version_; });
        continue;
      }
      const store::TcpStoreOptions where = *successor_;
      const int watched = successor_rank_;
      const Clock::time_point asked = Clock::now();
      if (!unanswered_since_) unanswered_since_ = asked;
      // The question that reaches a mark waits only for the rest: the silence is kept at the
      // probe's (ranks looking for a coordinator read it) and fails the communicator at the
      // timeout's as soon as it is there, not up to a question's deadline later.
      const milliseconds silent_now = since(*unanswered_since_);
      milliseconds deadline = kHeartbeatDeadline;
      for (const milliseconds mark : {std::min(fail_after_, kMembershipProbeTimeout), fail_after_}) {
        if (silent_now < mark) {
          deadline = std::clamp(mark - silent_now, kShortestQuestion, kHeartbeatDeadline);
          break;
        }
      }
      lock.unlock();
      bool answered = false;
      try {
        // A client answers within the deadline it was made with: a shorter question needs its own.
        if (!client || client_deadline != deadline) {
          client.reset();
          client = connect_within(where, deadline);
          client_deadline = deadline;
        }
        answered = agreed_generation(*client) >= 0;
      } catch (const std::exception&) {
      }
      const Clock::time_point back = Clock::now();
      // As ask(): a failure well before the deadline is a refusal, one at the deadline silence.
      const bool silent = !answered && back - asked >= deadline / 2;
      // A connection and a question, each within the deadline; more than that, or a late start,
      // was this process's own pause.
      const bool paused_here = back - asked > 2 * deadline + kWatcherStall ||
                               asked - looked > kHeartbeatInterval + kWatcherStall;
      looked = back;
      lock.lock();
      if (watching != version_) continue;  // re-pointed meanwhile: the answer was the old successor's
      if (answered)
        unanswered_since_.reset();
      else if (paused_here)
        unanswered_since_ = back;
      const milliseconds silence = answered || !unanswered_since_ ? milliseconds(0) : since(*unanswered_since_);
      // Kept first, then reported: the peers that learn of the failure from its abort and look
      // for a coordinator read the whole timeout of silence here.
      if (silence.count() != published) {
        lock.unlock();
        try {
          if (!own) own = connect_within(own_, kHeartbeatDeadline);
          own->add(heartbeat_key(where), silence.count() - own->add(heartbeat_key(where), 0));
          published = silence.count();
        } catch (const std::exception&) {
          own.reset();
        }
        lock.lock();
        if (watching != version_) continue;
      }
      if (silent && !reported && silence >= fail_after_) {
        lock.unlock();
        reported = report(watching, watched, silence);
        lock.lock();
        if (watching != version_) continue;
      }
      changed_.wait_until(lock, asked + kHeartbeatInterval, [&] { return stopping_ || watching != version_; });
    }
  }

  // Fails the communicator: rank `rank`, watched as `version`, was silent for `silence`. False
  // when it may not now (re-pointed, held, or no communicator yet): asked again at the next
  // question. Called without mutex_ (the communicator's failure asks unresponsive(), which
  // takes it).
  bool report(uint64_t version, int rank, milliseconds silence) {
    std::lock_guard<std::mutex> reporting(report_mutex_);
    {
      std::lock_guard<std::mutex> lock(mutex_);
      if (version != version_ || held_ || stopping_ || !report_) return false;
    }
    const std::string message = "rank " + std::to_string(rank) + " has not answered its membership endpoint for " +
                                std::to_string(silence.count()) + " ms (stopped or unreachable; the timeout is " +
                                std::to_string(fail_after_.count()) + " ms)";
    log::info("membership: " + message + ": the heartbeat fails the communicator");
    report_(Status::PeerTimeout, message);
    return true;
  }

  const store::TcpStoreOptions own_;
  const milliseconds fail_after_;
  // Held while a failure is reported, and by the calls that must not overlap one (watch, hold,
  // report_to); taken before mutex_.
  std::mutex report_mutex_;
  MembershipChanges::FailureSink report_;  // guarded by report_mutex_
  mutable std::mutex mutex_;
  std::condition_variable changed_;
  bool stopping_ = false;
  bool held_ = false;
  std::optional<store::TcpStoreOptions> successor_;
  int successor_rank_ = -1;
  uint64_t version_ = 0;  // counts the watch() calls
  std::optional<Clock::time_point> unanswered_since_;
  std::thread thread_;  // last: starts once the rest is initialized
};

// Holds the heartbeat's failure while the membership changes (agreement, admission, leave): until
// watch_successor() re-points it the watcher still watches the member before the change, and a
// failure then would land on a transport that is about to go.
class HeldWatch {
 public:
  explicit HeldWatch(SuccessorWatch* watch) : watch_(watch) {
    if (watch_) watch_->hold(true);
  }
  ~HeldWatch() {
    if (watch_) watch_->hold(false);
  }
  HeldWatch(const HeldWatch&) = delete;
  HeldWatch& operator=(const HeldWatch&) = delete;

 private:
  SuccessorWatch* watch_;
};

std::string Membership::start_endpoint() {
  store::TcpStoreOptions own;
  own.host = advertised_host();
  own.auth_token = random_hex(16);
  server_ = store::TcpStoreServer::start("", 0, own.auth_token);
  own.port = server_->port();
  watch_ = std::make_unique<SuccessorWatch>(own, timeout_);
  return endpoint_text(own);
}

void Membership::watch_successor() {
  if (!watch_) return;
  if (size() < 2) {
    watch_->watch(std::nullopt);
    return;
  }
  const int successor = (rank_ + 1) % size();
  watch_->watch(endpoints_[size_t(successor)], successor);
}

void Membership::report_failures_to(FailureSink fail) {
  if (watch_) watch_->report_to(std::move(fail));
}

std::vector<int> Membership::unresponsive() const {
  if (!watch_) return {};
  const std::optional<int> silent = watch_->silent_for(kUnresponsiveSilence);
  return silent ? std::vector<int>{*silent} : std::vector<int>{};
}

std::shared_ptr<Membership> Membership::publish(store::Store& store, const std::string& prefix, int rank, int size,
                                                const CommOptions& options, Door door, ConnectGroup connect) {
  std::shared_ptr<Membership> m(new Membership);
  m->rank_ = rank;
  m->min_ranks_ = options.elastic_min_ranks;
  m->timeout_ = options.timeout;
  m->connect_group_ = std::move(connect);
  store.set(prefix + "endpoint/" + std::to_string(rank), m->start_endpoint());
  for (int peer = 0; peer < size; ++peer)
    m->endpoints_.push_back(parse_endpoint(store.get(prefix + "endpoint/" + std::to_string(peer), options.timeout)));
  m->watch_successor();
  m->door_ = std::move(door);
  if (const std::shared_ptr<store::Store> keeper = m->door_keeper()) keeper->add(kDoorOpen, 1);
  return m;
}

std::shared_ptr<store::Store> Membership::door_keeper() {
  const bool keeps = door_.served_here || (door_.served_by_launcher && rank_ == 0);
  if (!keeps || door_store_ || door_unreachable_) return door_store_;
  try {
    door_store_ = connect_within(door_.where, timeout_);
  } catch (const std::exception& e) {
    door_unreachable_ = true;
    log::warn("membership: rank " + std::to_string(rank_) + " keeps the group's door but cannot reach it at " +
              door_.where.host + ":" + std::to_string(door_.where.port) + ", so no process can join: " + e.what());
  }
  return door_store_;
}

Membership::~Membership() = default;

bool Membership::door_open(store::Store& door) { return door.add(kDoorOpen, 0) > 0; }

std::pair<std::shared_ptr<Membership>, GroupTransport> Membership::join(const store::TcpStoreOptions& door_where,
                                                                        const CommOptions& options, ConnectGroup connect) {
  std::shared_ptr<Membership> m(new Membership);
  m->min_ranks_ = options.elastic_min_ranks;
  m->timeout_ = options.timeout;
  m->connect_group_ = std::move(connect);
  m->door_.where = door_where;
  std::shared_ptr<store::Store> door = store::connect_tcp_store(door_where);
  const int64_t request = door->add(kDoorRequests, 1) - 1;
  door->set(join_key(request), m->start_endpoint());
  log::info("membership: asked to join the running group at " + door_where.host + ":" +
            std::to_string(door_where.port) + " (request " + std::to_string(request) + ")");
  std::string admitted;
  try {
    // The members admit joiners at a boundary; before that they may still be re-forming after a
    // loss, which takes up to two timeouts and a probe.
    admitted = door->get(join_key(request) + "/admitted", 2 * options.timeout + kMembershipProbeTimeout);
  } catch (const transport::RendezvousError& e) {
    fail(Status::Rendezvous, "no running group admitted this process within " + std::to_string(options.timeout.count()) +
                                 " ms (its members admit joiners at a boundary while they train; the group's rank 0 "
                                 "keeps the door): " + e.what());
  }
  std::stringstream in(admitted);
  int size = 0;
  in >> m->generation_ >> m->rank_ >> size >> m->admitted_;
  if (m->rank_ < 0)
    fail(Status::Rendezvous, "the running group did not admit this process: its rank 0 could not reach this "
                             "process's membership endpoint (a firewall between them, or CO2_MASTER_ADDR names "
                             "an address the others cannot reach)");
  const std::string prefix = generation_prefix(m->generation_);
  std::stringstream list(door->get(prefix + "endpoints", options.timeout));
  for (std::string item; std::getline(list, item, ';');) m->endpoints_.push_back(parse_endpoint(item));
  require(int(m->endpoints_.size()) == size, Status::Internal, "membership: the admission lists " +
                                                                   std::to_string(m->endpoints_.size()) + " members, not " +
                                                                   std::to_string(size));
  m->watch_successor();
  GroupTransport transport = m->connect(*door, prefix + "admit/");
  m->record_generation();
  log::info("membership: joined as rank " + std::to_string(m->rank_) + " of " + std::to_string(size) +
            " (generation " + std::to_string(m->generation_) + ")");
  return {m, std::move(transport)};
}

GroupTransport Membership::connect(store::Store& store, const std::string& prefix) const {
  return connect_group_(store, prefix, rank_, size());
}

void Membership::record_generation() {
  const std::shared_ptr<store::Store> own = connect_within(endpoints_[size_t(rank_)], timeout_);
  own->add(kAgreedKey, int64_t(generation_) - own->add(kAgreedKey, 0));
}

GroupTransport Membership::survivors(const std::string& cause) {
  const HeldWatch held(watch_.get());
  const Agreed agreed = agree(cause);
  previous_ = agreed.previous;
  return connect(*agreed.store, agreed.prefix);
}

int64_t Membership::join_requests() {
  const std::shared_ptr<store::Store> door = door_keeper();
  if (!door) return 0;
  try {
    return door->add(kDoorRequests, 0);
  } catch (const std::exception& e) {
    log::warn(std::string("membership: cannot read the door's join requests: ") + e.what());
    return 0;
  }
}

GroupTransport Membership::admit(int64_t join_requests) {
  const HeldWatch held(watch_.get());
  const int64_t first = admitted_;
  require(join_requests > first, Status::Internal, "membership: admit() without a new join request");
  // Counted as handled whether or not the admission succeeds: a joiner that died meanwhile is
  // not asked for again at every boundary.
  admitted_ = join_requests;
  ++generation_;
  const std::string prefix = generation_prefix(generation_);
  const std::shared_ptr<store::Store> door = door_store_ ? door_store_ : connect_within(door_.where, timeout_);
  if (rank_ == 0) {
    // Rank 0 decides: every requester whose endpoint answers, in the order they asked.
    const milliseconds probe = std::min(timeout_, kMembershipProbeTimeout);
    std::vector<store::TcpStoreOptions> grown = endpoints_;
    std::vector<int64_t> admitted, refused;
    for (int64_t request = first; request < join_requests; ++request) {
      try {
        const store::TcpStoreOptions where = parse_endpoint(door->get(join_key(request), probe));
        if (agreed_generation(*connect_within(where, probe)) >= 0) {
          grown.push_back(where);
          admitted.push_back(request);
          continue;
        }
      } catch (const std::exception&) {
      }
      refused.push_back(request);
      log::info("membership: join request " + std::to_string(request) + " is not admitted: its process does not answer");
    }
    std::string list;
    for (const auto& where : grown) list += (list.empty() ? "" : ";") + endpoint_text(where);
    door->set(prefix + "endpoints", list);
    for (size_t j = 0; j < admitted.size(); ++j)
      door->set(join_key(admitted[j]) + "/admitted", std::to_string(generation_) + " " +
                                                        std::to_string(size() + int(j)) + " " +
                                                        std::to_string(grown.size()) + " " + std::to_string(join_requests));
    for (int64_t request : refused) door->set(join_key(request) + "/admitted", "0 -1 0 0");
  }
  std::stringstream list(door->get(prefix + "endpoints", timeout_));
  std::vector<store::TcpStoreOptions> grown;
  for (std::string item; std::getline(list, item, ';');) grown.push_back(parse_endpoint(item));
  require(grown.size() >= endpoints_.size(), Status::Internal,
          "membership: the admission lists " + std::to_string(grown.size()) + " members, fewer than the " +
              std::to_string(endpoints_.size()) + " there are");
  const int joined = int(grown.size() - endpoints_.size());
  if (joined == 0) {
    log::info("membership: generation " + std::to_string(generation_) + " admitted nobody (the processes that asked are gone)");
    record_generation();
    return {};
  }
  endpoints_ = std::move(grown);
  watch_successor();
  GroupTransport transport = connect(*door, prefix + "admit/");
  record_generation();
  log::info("membership: generation " + std::to_string(generation_) + " admitted " + std::to_string(joined) +
            (joined == 1 ? " process" : " processes") + ": " + std::to_string(size()) + " ranks, this one is rank " +
            std::to_string(rank_));
  return transport;
}

GroupTransport Membership::release(int leaving) {
  require(leaving >= 0 && leaving < size(), Status::Internal, "membership: release() of a rank out of range");
  const HeldWatch held(watch_.get());
  ++generation_;
  if (leaving == rank_) {
    // A door this process serves closes with it; one the launcher serves stays open, and the
    // next rank 0 keeps it.
    if (door_.served_here && door_store_) {
      try {
        door_store_->add(kDoorOpen, -door_store_->add(kDoorOpen, 0));
      } catch (const std::exception&) {
      }
    }
    if (watch_) watch_->watch(std::nullopt);
    server_.reset();
    log::info("membership: rank " + std::to_string(rank_) + " left the group (generation " +
              std::to_string(generation_) + ")");
    return {};
  }
  const int coordinator = leaving == 0 ? 1 : 0;
  const std::shared_ptr<store::Store> store = connect_within(endpoints_[size_t(coordinator)], timeout_);
  endpoints_.erase(endpoints_.begin() + leaving);
  if (rank_ > leaving) --rank_;
  watch_successor();
  GroupTransport transport = connect(*store, generation_prefix(generation_) + "leave/");
  record_generation();
  log::info("membership: rank " + std::to_string(leaving) + " left; generation " + std::to_string(generation_) +
            " has " + std::to_string(size()) + " ranks, this one is rank " + std::to_string(rank_));
  return transport;
}

std::shared_ptr<store::Store> Membership::coordinator_store(int* coordinator) const {
  const milliseconds probe = std::min(timeout_, kMembershipProbeTimeout);
  for (int candidate = 0; candidate < size(); ++candidate) {
    // Our own endpoint answers unless this process is broken; its deadline is the long one.
    if (candidate == rank_) {
      *coordinator = candidate;
      return connect_within(endpoints_[size_t(candidate)], timeout_);
    }
    const store::TcpStoreOptions& where = endpoints_[size_t(candidate)];
    // The silence its ring predecessor's heartbeat saw counts toward the probe: this rank's own
    // watcher's, or, for rank 0, the one that its predecessor (the last rank, not asked yet)
    // keeps at its endpoint, asked once rank 0 does not answer a short question. That one is as
    // old as the watcher's last question (up to kHeartbeatInterval; the watcher keeps it at the
    // probe's mark as well): while it falls short, rank 0 is asked short questions, and the kept
    // silence read again between them, their own silence counted too. A candidate past 0 has a
    // predecessor that did not answer either: nobody alive saw more.
    const int predecessor = (candidate + size() - 1) % size();
    milliseconds seen(0);
    Answer answer = Answer::Silent;
    if (predecessor == rank_) {
      if (watch_) seen = watch_->silence_of(where);
    } else if (candidate == 0) {
      answer = ask(where, std::min(kProbeSlice, probe)).answer;
      std::optional<milliseconds> kept = answer == Answer::Silent ? kept_silence(predecessor, where) : std::nullopt;
      seen = kept.value_or(milliseconds(0));
      while (answer == Answer::Silent && kept && seen < probe) {
        const Clock::time_point asking = Clock::now();
        answer = ask(where, std::min(kProbeSlice, probe - seen)).answer;
        if (answer != Answer::Silent) break;
        seen += since(asking);
        kept = kept_silence(predecessor, where);
        if (kept) seen = std::max(seen, *kept);
      }
    }
    if (answer == Answer::Silent && seen < probe) answer = ask(where, probe - seen).answer;
    if (answer == Answer::Yes) {
      *coordinator = candidate;
      return connect_within(where, timeout_);
    }
    // Gone (refused) or stopped (no answer): the next rank coordinates.
    if (answer == Answer::Silent && seen.count() > 0)
      log::info("membership: rank " + std::to_string(candidate) + " did not answer (its predecessor's heartbeat saw it "
                "silent for " + std::to_string(seen.count()) + " ms): not asked to coordinate");
  }
  fail(Status::Internal, "membership: no endpoint answered, not even this rank's own");
}

std::optional<milliseconds> Membership::kept_silence(int watcher, const store::TcpStoreOptions& watched) const {
  try {
    return milliseconds(
        connect_within(endpoints_[size_t(watcher)], std::min(kProbeSlice, timeout_))->add(heartbeat_key(watched), 0));
  } catch (const std::exception&) {
    return std::nullopt;
  }
}

std::vector<int> Membership::wait_for_survivors(store::Store& store, const std::string& prefix) const {
  enum class Seen { Unknown, Arrived, Gone };
  const milliseconds probe = std::min(timeout_, kMembershipProbeTimeout);
  std::vector<Seen> seen(static_cast<size_t>(size()), Seen::Unknown);
  std::vector<bool> answered(static_cast<size_t>(size()), false);  // at the last question asked
  // A rank that answers meets the failure within its own no-progress timeout (sooner when a
  // peer's abort reaches it); the time spent probing ranks that do not answer is not counted.
  Clock::time_point deadline = Clock::now() + timeout_ + probe;
  for (;;) {
    bool waiting = false;
    for (int r = 0; r < size(); ++r) {
      Seen& state = seen[size_t(r)];
      if (state != Seen::Unknown) continue;
      if (store.add(prefix + "arrived/" + std::to_string(r), 0) > 0) {
        state = Seen::Arrived;
        continue;
      }
      // Its ring predecessor reports, when it arrives, how long its heartbeat saw this rank
      // silent: that counts toward the probe. Until the predecessor arrives (or is gone), the
      // silence it keeps at its endpoint counts the same way, and a short question only tells
      // whether the rank answers or refuses unless it covers the rest of the probe.
      const int predecessor = (r + size() - 1) % size();
      const bool report_final = seen[size_t(predecessor)] != Seen::Unknown;
      milliseconds reported(store.add(silence_key(prefix, r), 0));
      // Read before the predecessor arrives: one round trip to a live rank rather than a short
      // question to a stopped one (when the heartbeat failed the group, the predecessor saw the
      // whole timeout, and it may arrive only after that question).
      if (!report_final && reported < probe && !answered[size_t(r)]) {
        const Clock::time_point reading = Clock::now();
        reported = std::max(reported, kept_silence(predecessor, endpoints_[size_t(r)]).value_or(milliseconds(0)));
        deadline += Clock::now() - reading;  // a stopped predecessor takes kProbeSlice to tell
      }
      if (reported >= probe) {
        state = Seen::Gone;
        log::info("membership: rank " + std::to_string(r) + " had not answered its predecessor's heartbeat for " +
                  std::to_string(reported.count()) + " ms: left out of the group without a probe");
        continue;
      }
      // Once what the predecessor saw leaves no more of the probe than a short question's
      // deadline, the question asks for the rest, and its silence completes the probe.
      const milliseconds rest = probe - reported;
      const bool asks_the_rest = report_final || rest <= std::min(kProbeSlice, probe);
      const Clock::time_point asked = Clock::now();
      const auto [answer, generation] = ask(endpoints_[size_t(r)], asks_the_rest ? rest : std::min(kProbeSlice, probe));
      answered[size_t(r)] = answer == Answer::Yes;
      if (generation >= int64_t(generation_))
        fail(Status::PeerLost, "rank " + std::to_string(rank_) + " was left out of the group: rank " +
                                   std::to_string(r) + " already agreed on generation " + std::to_string(generation) +
                                   " without it (this rank stopped answering while the others re-formed)");
      if (answer == Answer::Yes) {
        waiting = true;  // alive, not here yet: its training thread has not seen the failure
        continue;
      }
      deadline += Clock::now() - asked;
      if (answer == Answer::Silent && !asks_the_rest) {
        waiting = true;  // asked for the rest of the probe once its predecessor's report is in
        continue;
      }
      state = Seen::Gone;
      log::info("membership: rank " + std::to_string(r) + " does not answer" +
                (reported.count() > 0 ? " (its predecessor's heartbeat saw it silent for " +
                                            std::to_string(reported.count()) + " ms before)"
                                      : std::string()) +
                ": left out of the group");
    }
    if (!waiting) break;
    if (Clock::now() >= deadline) {
      for (int r = 0; r < size(); ++r)
        if (seen[size_t(r)] == Seen::Unknown) {
          seen[size_t(r)] = Seen::Gone;
          log::warn("membership: rank " + std::to_string(r) + " is alive but did not arrive within " +
                    std::to_string(timeout_.count()) + " ms: left out of the group");
        }
      break;
    }
    std::this_thread::sleep_for(kSurvivorPoll);
  }
  std::vector<int> members;
  for (int r = 0; r < size(); ++r)
    if (seen[size_t(r)] == Seen::Arrived) members.push_back(r);
  return members;
}

Membership::Agreed Membership::agree(const std::string& cause) {
  ++generation_;
  // A coordinator that dies while the others wait at its endpoint: agree again with the next
  // rank that answers. The coordinator's rank is part of the keys, so every survivor meets the
  // others at the same keys whether or not it saw the first coordinator.
  for (int attempt = 1;; ++attempt) {
    try {
      return agree_once(cause);
    } catch (const transport::RendezvousError& e) {
      if (attempt >= size())
        fail(Status::PeerLost, "the group lost a rank (" + cause + ") and the survivors could not agree on a new "
                               "group: " + e.what());
      log::warn("membership: the coordinator of generation " + std::to_string(generation_) +
                " went away during the agreement (" + e.what() + "); agreeing again");
    }
  }
}

Membership::Agreed Membership::agree_once(const std::string& cause) {
  int coordinator = 0;
  std::shared_ptr<store::Store> store = coordinator_store(&coordinator);
  const std::string prefix =
      "co2/elastic/" + std::to_string(generation_) + "/" + std::to_string(coordinator) + "/";
  log::info("membership: rank " + std::to_string(rank_) + " of " + std::to_string(size()) + " lost a peer (" + cause +
            "); rank " + std::to_string(coordinator) + " coordinates generation " + std::to_string(generation_));
  // The report goes first: the coordinator reads it once this rank has arrived. Written as a
  // value, not added: an agreement tried again at the same coordinator reports again.
  if (watch_ && size() > 1) {
    const int successor = (rank_ + 1) % size();
    const int64_t silence = watch_->silence_of(endpoints_[size_t(successor)]).count();
    const std::string key = silence_key(prefix, successor);
    if (silence > 0) store->add(key, silence - store->add(key, 0));
  }
  store->add(prefix + "arrived/" + std::to_string(rank_), 1);
  if (coordinator == rank_) {
    const std::vector<int> survivors = wait_for_survivors(*store, prefix);
    store->set(prefix + "members", int(survivors.size()) >= min_ranks_ ? ranks_text(survivors)
                                                                        : "!" + ranks_text(survivors));
  }
  // The coordinator may meet the failure up to a timeout after this rank did, and then waits up
  // to a timeout for ranks that answer but have not arrived.
  const std::string members_text = store->get(prefix + "members", 2 * timeout_ + kMembershipProbeTimeout);
  const bool too_few = !members_text.empty() && members_text[0] == '!';
  const std::vector<int> members = parse_ranks(too_few ? members_text.substr(1) : members_text);
  if (too_few)
    fail(Status::PeerLost, "the group lost a rank (" + cause + ") and only " + std::to_string(members.size()) +
                               " of " + std::to_string(size()) + " ranks remain (" + ranks_text(members) +
                               "), fewer than elastic_min_ranks = " + std::to_string(min_ranks_));
  const auto me = std::find(members.begin(), members.end(), rank_);
  if (me == members.end())
    fail(Status::PeerLost, "rank " + std::to_string(rank_) + " was left out of the re-formed group (members " +
                               ranks_text(members) + " of the old ranks): it arrived after the survivors agreed, "
                               "or its membership endpoint did not answer in time; first failure: " + cause);
  record_generation();
  Agreed agreed;
  agreed.rank = int(me - members.begin());
  agreed.size = int(members.size());
  agreed.previous = members;
  agreed.store = store;
  agreed.prefix = prefix;
  std::vector<store::TcpStoreOptions> kept;
  for (int r : members) kept.push_back(endpoints_[size_t(r)]);
  endpoints_ = std::move(kept);
  rank_ = agreed.rank;
  watch_successor();
  log::info("membership: generation " + std::to_string(generation_) + " has " + std::to_string(agreed.size) +
            " ranks (old ranks " + ranks_text(members) + "); this one is rank " + std::to_string(agreed.rank));
  return agreed;
}

}  // namespace co2
