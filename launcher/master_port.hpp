// The port co2run gives MASTER_PORT when the user gives none.
#pragma once

namespace co2::launcher {

// A port below the kernel's ephemeral range (net.ipv4.ip_local_port_range), where no outgoing
// connection and no listener on port 0 can take it between this pick and rank 0's bind, that
// binds now together with the port after it (the examples' convention for a framework's own
// process group: gloo at MASTER_PORT + 1). Random within the range, so that concurrent jobs on
// one host rarely try the same one. Falls back to the kernel's choice of a free port where the
// range leaves no room below it; 0 where nothing binds.
int pick_master_port();

}  // namespace co2::launcher
