// The NCCL transport: a collective-kind transport (transports/collective.hpp) over one NCCL
// communicator. The unique id travels through the rendezvous store; ncclCommInitRankConfig runs
// non-blocking and is polled up to the timeout; every collective is enqueued on the transport's
// stream; a clean shutdown finalizes and destroys the communicator, a fault (or abort) calls
// ncclCommAbort. NCCL refuses two ranks on one GPU.
#pragma once

#include <chrono>
#include <memory>
#include <string>

#include "transports/collective.hpp"
#include "transports/rendezvous.hpp"

namespace co2::transport::nccl {

// CUDA devices NCCL could use here: 0 on any error (no driver) or when there are none.
int usable_devices();

// Forms the group `key` of `size` ranks on CUDA device `device`. Rank 0 creates the NCCL unique
// id and publishes it under `key`; the others read it. Throws RendezvousError when the group does
// not form within `timeout` (a missing peer, or a second rank on the same GPU). device < 0: the
// calling thread's current CUDA device.
std::unique_ptr<Collective> connect(Rendezvous& store, const std::string& key, int rank, int size,
                                    int device, std::chrono::milliseconds timeout);

}  // namespace co2::transport::nccl
