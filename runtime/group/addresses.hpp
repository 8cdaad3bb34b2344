// What a process tells its peers about itself: the address other hosts reach it at, and
// random tokens (store auth tokens, ids).
#pragma once

#include <cstddef>
#include <string>

namespace co2 {

// `bytes` random bytes as lowercase hex.
std::string random_hex(size_t bytes);

// The address other hosts reach this one at: CO2_MASTER_ADDR if set, else the first IPv4
// address of an interface that is up and not loopback, else loopback.
std::string advertised_host();

}  // namespace co2
