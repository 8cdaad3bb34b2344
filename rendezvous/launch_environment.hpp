// Where a process stands in its job, as its launcher told it through the environment.
#pragma once

#include <cstdint>
#include <string>

namespace co2::store {

struct LaunchEnvironment {
  bool present = false;  // false: no launcher variables at all (a single process on its own)
  int rank = 0, world_size = 1, local_rank = 0, local_world_size = 1;
  std::string master_addr;  // "" when the launcher gives none and the ranks span several hosts
  uint16_t master_port = 0;  // 0 when neither given nor derivable
  // Where master_port came from, for messages: "CO2_MASTER_PORT", "MASTER_PORT", or "" (derived).
  std::string master_port_variable;
  // TORCHELASTIC_RUN_ID is set: torchrun's agent serves its own store at MASTER_PORT.
  bool under_torchrun = false;
  // CO2_LAUNCHER_SERVES_STORE=1 (co2run --elastic): the launcher serves co2's store at
  // MASTER_ADDR:MASTER_PORT for the whole job, so no rank serves it and it outlives any rank.
  bool launcher_serves_store = false;
  std::string source;  // "torchrun/co2run", "openmpi", "slurm"
  // CO2_STORE_BIND as given ("" = unset): where rank 0's store listens ("*" = every address).
  std::string store_bind;
};

// Reads, in this order (the first family present wins):
//   torchrun / co2run: RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE
//   Open MPI (mpirun): OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
//   Slurm (srun):      SLURM_PROCID, SLURM_STEP_NUM_TASKS (else SLURM_NTASKS), SLURM_LOCALID,
//                      SLURM_STEP_TASKS_PER_NODE (else SLURM_TASKS_PER_NODE) at SLURM_NODEID;
//                      only inside a job step (SLURM_STEP_ID set), not in the batch script itself.
// The store's address: MASTER_ADDR, else 127.0.0.1 when every rank is on this host, else the
// first host of SLURM_STEP_NODELIST (else SLURM_JOB_NODELIST). Its port: CO2_MASTER_PORT (which
// wins, because torchrun's agent already serves its own store at MASTER_PORT), else MASTER_PORT,
// else one derived from the Open MPI or Slurm job id (10000-29999), else 0.
// A malformed or inconsistent value throws co2::Error(Status::InvalidArgument) naming the variable.
LaunchEnvironment read_launch_environment();

// Why rank 0 cannot serve the store at `environment`'s port (store::PortInUseError) and what to
// do, in one sentence: torchrun's agent holds MASTER_PORT under torchrun, else another program,
// a co2 run still alive or a second RANK=0 holds it.
std::string port_in_use_message(const LaunchEnvironment& environment);

// Which node (host) this process is on, as far as the launcher says; see read_node_name.
struct NodeName {
  int64_t id = -1;     // >= 0: the launcher's node index; -1: none, `host` names the node
  std::string host;    // this host's name when id < 0
  std::string source;  // where it came from, for messages: "GROUP_RANK", "SLURM_NODEID", ...
};

// The node of this process, from the launcher family read_launch_environment() picks (the first
// present wins, so the two never disagree on who launched us):
//   torchrun / co2run: GROUP_RANK; else (RANK - LOCAL_RANK) / LOCAL_WORLD_SIZE when all three
//                      are set and RANK - LOCAL_RANK is a multiple of LOCAL_WORLD_SIZE (torchrun
//                      numbers the ranks of a node contiguously); else the host name
//   Open MPI:          the host name (OMPI_COMM_WORLD_NODE_RANK is a rank within the node, and
//                      mpirun exports no node index)
//   Slurm job step:    SLURM_NODEID
//   no launcher:       the host name
// A malformed GROUP_RANK or SLURM_NODEID throws co2::Error(Status::InvalidArgument).
NodeName read_node_name();

// Where rank 0's store listens (the bind_host of TcpStoreServer::start; "" = every address):
//   CO2_STORE_BIND when set ("*" = every address, else a host name or address);
//   else MASTER_ADDR, so that the store is not reachable on interfaces the job does not use.
// Two cases fall back to every address, with the reason in `why` (else `why` is ""): MASTER_ADDR
// names no address of this host (a NAT or a load balancer in front of it), or it names only
// loopback here while the ranks span several hosts (Debian maps the host's own name to
// 127.0.1.1, which other hosts cannot reach).
std::string choose_store_bind(const LaunchEnvironment& environment, std::string& why);

}  // namespace co2::store
