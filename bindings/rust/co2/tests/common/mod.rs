//! Helpers shared by the integration tests: in-process ranks on the local transport.
#![allow(dead_code)]

use std::sync::atomic::{AtomicUsize, Ordering};

use co2::{CommConfig, Communicator, Transport};

/// cargo runs tests as parallel threads of one process, and the local transport keys groups by
/// name: every group gets a name of its own.
pub fn group_name(test: &str) -> String {
    static NEXT: AtomicUsize = AtomicUsize::new(0);
    format!("co2-rust-{test}-{}-{}", std::process::id(), NEXT.fetch_add(1, Ordering::Relaxed))
}

/// A config for `rank` of `world` on the local transport, with a no-progress timeout short
/// enough that a broken test fails instead of hanging.
pub fn local_config(group: &str, rank: i32, world: i32) -> CommConfig {
    CommConfig::new()
        .transport(Transport::Local)
        .rank(rank)
        .world_size(world)
        .group_name(group)
        .timeout_ms(30_000)
}

/// Runs `body(rank, communicator)` on `world` threads, one rank each, and returns the results
/// in rank order.
pub fn run_ranks<T: Send>(world: i32, group: &str, body: impl Fn(i32, Communicator) -> T + Sync) -> Vec<T> {
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..world)
            .map(|rank| {
                let body = &body;
                scope.spawn(move || {
                    let comm = Communicator::new(&local_config(group, rank, world)).expect("communicator");
                    body(rank, comm)
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
    })
}

/// Bitwise equality of f32 slices (NaN patterns and signed zeros included).
pub fn bits(values: &[f32]) -> Vec<u32> {
    values.iter().map(|v| v.to_bits()).collect()
}
