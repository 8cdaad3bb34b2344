//! co2 example in plain Rust: least-squares linear regression trained data-parallel.
//!
//! Every rank holds its own shard of generated data (fixed seeds) and runs minibatch SGD (the
//! "framework": written here, not part of co2) on parameters that live in the engine's flat
//! storage; after every inner step it calls `Engine::step`, and every τ-th step is a CO2 round
//! boundary whose all-reduce overlaps the next τ steps. After every round, rank 0 prints the
//! loss of the consensus model (the anchor) over all shards.
//!
//! How the ranks are formed:
//! - with RANK and WORLD_SIZE in the environment (a launcher such as `co2run` set them): this
//!   process is that one rank, `Transport::Auto` (UCX across processes where built);
//! - otherwise: `--world W` ranks as threads of this process over the `local` transport.
//!
//! Usage: co2-regression [--world W] [--rounds N] [--tau N] [--algorithm co2|sync|diloco|localsgd]
//!                       [--group NAME] [--timeout-ms MS] [--quiet]
//! --timeout-ms: the communicator's no-progress (and rendezvous) timeout; the library's default
//! (CO2_DEFAULT_TIMEOUT_MS, 5 minutes) otherwise.
//! Exit status: 0 when the final loss is below 1% of the initial one, 1 on a co2 error, 2 if
//! training did not converge that far, 64 on bad arguments.

use std::process::ExitCode;
use std::sync::Arc;
use std::thread;

use co2::{
    Algorithm, CommConfig, Communicator, Consensus, Engine, EngineConfig, ReduceOp, Role, Transport,
};

const FEATURES: usize = 16;
const SAMPLES_PER_RANK: usize = 1024;
const BATCH: usize = 16;
const LEARNING_RATE: f32 = 0.02;
const NOISE: f64 = 0.05;
const CONVERGED_FRACTION: f64 = 0.01;

#[derive(Clone, Debug)]
struct Options {
    world: i32,
    rounds: u32,
    tau: u32,
    algorithm: Algorithm,
    group: String,
    timeout_ms: Option<u32>,
    quiet: bool,
}

fn parse_options() -> Result<Options, String> {
    let mut options = Options {
        world: 4,
        rounds: 20,
        tau: 8,
        algorithm: Algorithm::Co2,
        group: format!("co2-example-rust-{}", std::process::id()),
        timeout_ms: None,
        quiet: false,
    };
    let mut args = std::env::args().skip(1);
    while let Some(arg) = args.next() {
        let mut value = || args.next().ok_or_else(|| format!("{arg} needs a value"));
        match arg.as_str() {
            "--world" => options.world = value()?.parse().map_err(|e| format!("--world: {e}"))?,
            "--rounds" => {
                options.rounds = value()?.parse().map_err(|e| format!("--rounds: {e}"))?
            }
            "--tau" => options.tau = value()?.parse().map_err(|e| format!("--tau: {e}"))?,
            "--group" => options.group = value()?,
            "--timeout-ms" => {
                options.timeout_ms =
                    Some(value()?.parse().map_err(|e| format!("--timeout-ms: {e}"))?)
            }
            "--algorithm" => {
                options.algorithm = match value()?.as_str() {
                    "co2" => Algorithm::Co2,
                    "sync" => Algorithm::Sync,
                    "diloco" => Algorithm::Diloco,
                    "localsgd" => Algorithm::LocalSgd,
                    other => return Err(format!("unknown algorithm {other:?}")),
                }
            }
            "--quiet" => options.quiet = true,
            other => return Err(format!("unknown argument {other:?}")),
        }
    }
    if options.world < 1 || options.tau < 1 {
        return Err("--world and --tau must be >= 1".into());
    }
    Ok(options)
}

/// xorshift64*: the same sequence on every platform, no crates needed.
struct Rng(u64);

impl Rng {
    fn next_u64(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(2685821657736338717)
    }
    fn uniform(&mut self) -> f64 {
        ((self.next_u64() >> 11) as f64 + 0.5) / 9007199254740992.0
    }
    fn normal(&mut self) -> f64 {
        (-2.0 * self.uniform().ln()).sqrt() * (2.0 * std::f64::consts::PI * self.uniform()).cos()
    }
}

/// One rank's data: y = x·w* + b* + noise.
struct Shard {
    x: Vec<[f32; FEATURES]>,
    y: Vec<f32>,
}

fn make_shard(rank: i32) -> Shard {
    let mut truth = Rng(0x9E3779B97F4A7C15);
    let w_true: Vec<f64> = (0..FEATURES).map(|_| truth.normal()).collect();
    let b_true = 0.5;
    let mut rng = Rng(0xC02C02 + 7919 * (rank as u64 + 1));
    let mut shard = Shard {
        x: Vec::with_capacity(SAMPLES_PER_RANK),
        y: Vec::with_capacity(SAMPLES_PER_RANK),
    };
    for _ in 0..SAMPLES_PER_RANK {
        let mut row = [0f32; FEATURES];
        let mut y = b_true + NOISE * rng.normal();
        for (j, x) in row.iter_mut().enumerate() {
            let v = rng.normal();
            *x = v as f32;
            y += w_true[j] * v;
        }
        shard.x.push(row);
        shard.y.push(y as f32);
    }
    shard
}

/// Mean squared error of (w, b) over the shard, in double precision.
fn mse(shard: &Shard, w: &[f32], b: f32) -> f64 {
    let mut sum = 0.0;
    for (row, &y) in shard.x.iter().zip(&shard.y) {
        let pred: f64 = f64::from(b)
            + row
                .iter()
                .zip(w)
                .map(|(x, w)| f64::from(*x) * f64::from(*w))
                .sum::<f64>();
        sum += (pred - f64::from(y)).powi(2);
    }
    sum / shard.y.len() as f64
}

/// Gradient of the minibatch MSE at `params` ([w..., b]) into `grad`.
fn minibatch_gradient(shard: &Shard, start: usize, params: &[f32], grad: &mut [f32]) {
    grad.iter_mut().for_each(|g| *g = 0.0);
    for i in start..start + BATCH {
        let row = &shard.x[i % SAMPLES_PER_RANK];
        let pred = params[FEATURES]
            + row
                .iter()
                .zip(&params[..FEATURES])
                .map(|(x, w)| x * w)
                .sum::<f32>();
        let residual = 2.0 * (pred - shard.y[i % SAMPLES_PER_RANK]) / BATCH as f32;
        for j in 0..FEATURES {
            grad[j] += residual * row[j];
        }
        grad[FEATURES] += residual;
    }
}

/// Trains one rank; returns (initial, final) loss over all shards.
fn run_rank(comm: &Communicator, options: &Options) -> co2::Result<(f64, f64)> {
    let rank = comm.rank()?;
    let shard = make_shard(rank);
    let config = EngineConfig::new()
        .algorithm(options.algorithm)
        .tau(options.tau);
    let mut engine = Engine::new(comm, &config)?;
    engine.alloc_flat(FEATURES + 1)?;
    engine.add_segment("w", 0, FEATURES, Role::Parameter)?;
    engine.add_segment("b", FEATURES, 1, Role::Parameter)?;
    // Rank 0's start is broadcast to every rank at commit.
    let mut init = Rng(42 + rank as u64);
    engine
        .flat_mut()
        .expect("flat storage")
        .iter_mut()
        .for_each(|p| *p = (0.1 * init.normal()) as f32);
    engine.commit()?;

    let mut consensus = vec![0f32; engine.num_elements()?];
    // localsgd keeps no anchor: its consensus is the (collective) average of the ranks' models.
    let kind = if options.algorithm == Algorithm::LocalSgd {
        Consensus::LocalAverage
    } else {
        Consensus::Anchor
    };
    let global_loss = |engine: &mut Engine, consensus: &mut Vec<f32>| -> co2::Result<f64> {
        engine.consensus(kind, consensus)?;
        let mut loss = [mse(&shard, &consensus[..FEATURES], consensus[FEATURES])];
        comm.allreduce(&mut loss, ReduceOp::Avg)?;
        Ok(loss[0])
    };
    let initial = global_loss(&mut engine, &mut consensus)?;
    if rank == 0 && !options.quiet {
        println!("{:>5}  {:>12}", "round", "loss");
        println!("{:>5}  {:>12.6}", 0, initial);
    }

    let mut grad = vec![0f32; FEATURES + 1];
    let mut cursor = 0usize;
    let mut round = 0u32;
    while round < options.rounds {
        let params = engine.flat().expect("flat storage").to_vec();
        minibatch_gradient(&shard, cursor, &params, &mut grad);
        cursor += BATCH;
        if options.algorithm == Algorithm::Sync {
            let (w_grad, b_grad) = grad.split_at_mut(FEATURES);
            engine.reduce_gradients(&mut [w_grad, b_grad])?;
        }
        for (p, g) in engine
            .flat_mut()
            .expect("flat storage")
            .iter_mut()
            .zip(&grad)
        {
            *p -= LEARNING_RATE * g;
        }
        let boundary = engine.step()?;
        // sync has no rounds of its own: report every τ steps all the same.
        let report = boundary
            || (options.algorithm == Algorithm::Sync
                && engine.stats()?.steps % u64::from(options.tau) == 0);
        if report {
            round += 1;
            let loss = global_loss(&mut engine, &mut consensus)?;
            if rank == 0 && !options.quiet {
                println!("{round:>5}  {loss:>12.6}");
            }
        }
    }
    engine.finalize()?;
    let last = global_loss(&mut engine, &mut consensus)?;
    if rank == 0 {
        let stats = engine.stats()?;
        println!(
            "final loss {last:.6} (initial {initial:.6}); {} rounds, {} outer updates, waited {:.3} ms at boundaries, all-reduces took {:.3} ms",
            stats.rounds,
            stats.outer_updates,
            stats.boundary_wait_ns as f64 / 1e6,
            stats.collective_ns as f64 / 1e6
        );
    }
    Ok((initial, last))
}

fn launcher_rank() -> Option<(i32, i32)> {
    let rank = std::env::var("RANK").ok()?.parse().ok()?;
    let world = std::env::var("WORLD_SIZE").ok()?.parse().ok()?;
    Some((rank, world))
}

fn main() -> ExitCode {
    let options = match parse_options() {
        Ok(options) => options,
        Err(message) => {
            eprintln!("error: {message}");
            return ExitCode::from(64);
        }
    };

    let results: Vec<co2::Result<(f64, f64)>> = if let Some((rank, world)) = launcher_rank() {
        if rank == 0 {
            println!("rank {rank} of {world} (from the launcher's RANK/WORLD_SIZE), transport auto, {:?}", options.algorithm);
        }
        let mut config = CommConfig::new()
            .transport(Transport::Auto)
            .rank(rank)
            .world_size(world);
        if let Some(timeout) = options.timeout_ms {
            config = config.timeout_ms(timeout);
        }
        vec![Communicator::new(&config).and_then(|comm| run_rank(&comm, &options))]
    } else {
        println!(
            "{} in-process ranks (local transport), {:?}, tau {}",
            options.world, options.algorithm, options.tau
        );
        let options = Arc::new(options.clone());
        let handles: Vec<_> = (0..options.world)
            .map(|rank| {
                let options = Arc::clone(&options);
                thread::spawn(move || {
                    let mut config = CommConfig::new()
                        .transport(Transport::Local)
                        .rank(rank)
                        .world_size(options.world)
                        .group_name(options.group.clone());
                    if let Some(timeout) = options.timeout_ms {
                        config = config.timeout_ms(timeout);
                    }
                    let comm = Communicator::new(&config)?;
                    let result = run_rank(&comm, &options);
                    if result.is_err() {
                        // Unblock the other ranks, which may wait in a collective for this one.
                        let _ = comm.abort();
                    }
                    result
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("rank thread panicked"))
            .collect()
    };

    let mut status = ExitCode::SUCCESS;
    for (rank, result) in results.iter().enumerate() {
        match result {
            Err(e) => {
                eprintln!("error on rank {rank}: {e}");
                status = ExitCode::from(1);
            }
            Ok((initial, last)) if *last > CONVERGED_FRACTION * initial => {
                eprintln!("error: rank {rank}: final loss {last} is not below {CONVERGED_FRACTION} x initial {initial}");
                if status == ExitCode::SUCCESS {
                    status = ExitCode::from(2);
                }
            }
            Ok(_) => {}
        }
    }
    status
}
