//! A multi-rank run through the safe crate gives bitwise the results of the same run made
//! through the raw C API (co2-sys, the calls a C program makes), for every algorithm.

mod common;

use std::ffi::CString;
use std::ptr;

use co2::{sys, Algorithm, Clip, Consensus, Engine, EngineConfig, Penalty, Role};
use common::{bits, group_name, run_ranks};

const WORLD: i32 = 3;
const SIZES: [usize; 2] = [37, 5]; // two trained tensors
const BUFFER: usize = 3; // one averaged buffer (BatchNorm statistics, say)
const STEPS: usize = 17; // not a multiple of tau: finalize has steps to fold in

/// The "framework": a deterministic inner step, different on every rank.
fn inner_step(
    rank: i32,
    step: usize,
    params: &mut [&mut [f32]],
    buffer: &mut [f32],
    grads: Option<&mut [Vec<f32>]>,
) {
    let lr = 0.1f32;
    let mut grads = grads;
    for (t, tensor) in params.iter_mut().enumerate() {
        for (i, p) in tensor.iter_mut().enumerate() {
            let target = ((rank as f32 + 1.0) * (i as f32 + 1.0) * 0.01).sin() + t as f32;
            let noise = (((step * 31 + i * 7 + t) % 13) as f32 - 6.0) * 1e-3;
            let g = (*p - target) + noise;
            match grads.as_deref_mut() {
                Some(out) => out[t][i] = g,
                None => *p -= lr * g,
            }
        }
    }
    for (i, b) in buffer.iter_mut().enumerate() {
        *b = 0.5 * *b + (rank as f32) * 0.25 + i as f32 + step as f32 * 0.01;
    }
}

fn apply_grads(params: &mut [&mut [f32]], grads: &[Vec<f32>]) {
    for (tensor, grad) in params.iter_mut().zip(grads) {
        for (p, g) in tensor.iter_mut().zip(grad) {
            *p -= 0.1 * g;
        }
    }
}

fn initial(rank: i32) -> (Vec<f32>, Vec<f32>, Vec<f32>) {
    let f =
        |n: usize, k: f32| (0..n).map(|i| ((i as f32 + k) * 0.37 + rank as f32).cos()).collect::<Vec<f32>>();
    (f(SIZES[0], 1.0), f(SIZES[1], 2.0), f(BUFFER, 3.0))
}

fn config(algorithm: Algorithm) -> EngineConfig {
    EngineConfig::new()
        .algorithm(algorithm)
        .tau(3)
        .outer_lr(0.8)
        .outer_momentum(Some(0.5))
        .nesterov(true)
        .penalty(Penalty::Gap)
        .clip(Clip::Value)
        .clip_threshold(0.5)
        .anchor_check_interval(2)
}

/// What a run leaves behind, per rank: final tensors, consensus, step/round/update counters.
type Outcome = (Vec<u32>, Vec<u32>, Vec<u32>, Vec<u32>, (u64, u64, u64, u64));

fn safe_run(algorithm: Algorithm, group: &str) -> Vec<Outcome> {
    run_ranks(WORLD, group, |rank, comm| {
        let (mut a, mut b, mut buf) = initial(rank);
        let mut engine = Engine::new(&comm, &config(algorithm)).unwrap();
        let ta = engine.register_tensor("a", &mut a, Role::Parameter).unwrap();
        let tb = engine.register_tensor("b", &mut b, Role::Parameter).unwrap();
        let tbuf = engine.register_tensor("stats", &mut buf, Role::Buffer).unwrap();
        engine.commit().unwrap();
        let mut grads = vec![vec![0f32; SIZES[0]], vec![0f32; SIZES[1]]];
        for step in 0..STEPS {
            let mut pa = engine.tensor(ta).to_vec();
            let mut pb = engine.tensor(tb).to_vec();
            let mut pbuf = engine.tensor(tbuf).to_vec();
            if algorithm == Algorithm::Sync {
                inner_step(rank, step, &mut [&mut pa, &mut pb], &mut pbuf, Some(&mut grads));
                let (ga, gb) = grads.split_at_mut(1);
                engine.reduce_gradients(&mut [&mut ga[0], &mut gb[0]]).unwrap();
                apply_grads(&mut [&mut pa, &mut pb], &grads);
            } else {
                inner_step(rank, step, &mut [&mut pa, &mut pb], &mut pbuf, None);
            }
            engine.tensor_mut(ta).copy_from_slice(&pa);
            engine.tensor_mut(tb).copy_from_slice(&pb);
            engine.tensor_mut(tbuf).copy_from_slice(&pbuf);
            engine.step().unwrap();
        }
        engine.finalize().unwrap();
        let mut consensus = vec![0f32; engine.num_elements().unwrap()];
        engine.consensus(Consensus::LocalAverage, &mut consensus).unwrap();
        let s = engine.stats().unwrap();
        let out = (
            bits(engine.tensor(ta)),
            bits(engine.tensor(tb)),
            bits(engine.tensor(tbuf)),
            bits(&consensus),
            (s.steps, s.rounds, s.outer_updates, s.outer_state_bytes),
        );
        drop(engine);
        out
    })
}

fn ok(status: sys::co2_status_t) {
    assert_eq!(status, sys::CO2_OK as i32, "C call failed");
}

/// The same run as a C program makes it: raw handles, raw pointers, INIT-equivalent structs.
fn c_run(algorithm: Algorithm, group: &str) -> Vec<Outcome> {
    let cfg = *config(algorithm).as_raw();
    std::thread::scope(|scope| {
        let handles: Vec<_> = (0..WORLD)
            .map(|rank| {
                scope.spawn(move || unsafe {
                    let (mut a, mut b, mut buf) = initial(rank);
                    let name = CString::new(group).unwrap();
                    let mut cc: sys::co2_comm_config_t = std::mem::zeroed();
                    ok(sys::co2_comm_config_init(&mut cc));
                    cc.transport = sys::CO2_TRANSPORT_LOCAL as i32;
                    cc.rank = rank;
                    cc.world_size = WORLD;
                    cc.group_name = name.as_ptr();
                    cc.timeout_ms = 30_000;
                    let mut comm: sys::co2_comm_t = ptr::null_mut();
                    ok(sys::co2_comm_create(&cc, &mut comm));
                    let mut engine: sys::co2_engine_t = ptr::null_mut();
                    ok(sys::co2_engine_create(comm, &cfg, &mut engine));
                    let names = [
                        CString::new("a").unwrap(),
                        CString::new("b").unwrap(),
                        CString::new("stats").unwrap(),
                    ];
                    let tensors: [(*mut f32, usize, u32); 3] = [
                        (a.as_mut_ptr(), a.len(), sys::CO2_ROLE_PARAMETER),
                        (b.as_mut_ptr(), b.len(), sys::CO2_ROLE_PARAMETER),
                        (buf.as_mut_ptr(), buf.len(), sys::CO2_ROLE_BUFFER),
                    ];
                    for (name, (data, count, role)) in names.iter().zip(tensors) {
                        let mut t = sys::co2_tensor_t::init();
                        t.name = name.as_ptr();
                        t.data = data.cast();
                        t.count = count;
                        t.role = role as i32;
                        ok(sys::co2_engine_register_tensor(engine, &t));
                    }
                    ok(sys::co2_engine_commit(engine));
                    let mut grads = vec![vec![0f32; SIZES[0]], vec![0f32; SIZES[1]]];
                    for step in 0..STEPS {
                        let pa = std::slice::from_raw_parts_mut(tensors[0].0, tensors[0].1);
                        let pb = std::slice::from_raw_parts_mut(tensors[1].0, tensors[1].1);
                        let pbuf = std::slice::from_raw_parts_mut(tensors[2].0, tensors[2].1);
                        if algorithm == Algorithm::Sync {
                            inner_step(rank, step, &mut [pa, pb], pbuf, Some(&mut grads));
                            let mut ptrs: Vec<*mut std::os::raw::c_void> =
                                grads.iter_mut().map(|g| g.as_mut_ptr().cast()).collect();
                            ok(sys::co2_engine_reduce_gradients(
                                engine,
                                ptrs.as_mut_ptr(),
                                2,
                                ptr::null_mut(),
                            ));
                            let pa = std::slice::from_raw_parts_mut(tensors[0].0, tensors[0].1);
                            let pb = std::slice::from_raw_parts_mut(tensors[1].0, tensors[1].1);
                            apply_grads(&mut [pa, pb], &grads);
                        } else {
                            inner_step(rank, step, &mut [pa, pb], pbuf, None);
                        }
                        ok(sys::co2_engine_step(engine, ptr::null_mut(), ptr::null_mut()));
                    }
                    ok(sys::co2_engine_finalize(engine));
                    let mut n = 0usize;
                    ok(sys::co2_engine_num_elements(engine, &mut n));
                    let mut consensus = vec![0f32; n];
                    ok(sys::co2_engine_consensus(
                        engine,
                        sys::CO2_CONSENSUS_LOCAL_AVERAGE as i32,
                        consensus.as_mut_ptr(),
                        n,
                    ));
                    let mut s = sys::co2_engine_stats_t::init();
                    ok(sys::co2_engine_get_stats(engine, &mut s));
                    ok(sys::co2_engine_destroy(engine));
                    ok(sys::co2_comm_destroy(comm));
                    (bits(&a), bits(&b), bits(&buf), bits(&consensus), (s.steps, s.rounds, s.outer_updates, s.outer_state_bytes))
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect()
    })
}

fn check_algorithm(algorithm: Algorithm) {
    let name = format!("{algorithm:?}").to_lowercase();
    let safe = safe_run(algorithm, &group_name(&format!("safe-{name}")));
    let c = c_run(algorithm, &group_name(&format!("c-{name}")));
    assert_eq!(safe.len(), WORLD as usize);
    for rank in 0..WORLD as usize {
        assert_eq!(safe[rank], c[rank], "{algorithm:?}: rank {rank} differs from the C API run");
        assert_eq!(safe[rank].4 .0, STEPS as u64);
        // The run trained something: the result is not the committed start.
        let (a0, _, _) = initial(0);
        assert_ne!(safe[rank].0, bits(&a0), "{algorithm:?}: parameters never moved");
    }
    // finalize leaves every rank with the same model.
    for rank in 1..WORLD as usize {
        assert_eq!(safe[rank].0, safe[0].0, "{algorithm:?}: rank {rank} ends with another model");
        assert_eq!(safe[rank].3, safe[0].3);
    }
}

#[test]
fn co2_matches_the_c_api_bitwise() {
    check_algorithm(Algorithm::Co2);
}

#[test]
fn diloco_matches_the_c_api_bitwise() {
    check_algorithm(Algorithm::Diloco);
}

#[test]
fn localsgd_matches_the_c_api_bitwise() {
    check_algorithm(Algorithm::LocalSgd);
}

#[test]
fn sync_matches_the_c_api_bitwise() {
    check_algorithm(Algorithm::Sync);
}

/// Flat storage (runtime-owned and adopted) trains exactly like registered tensors.
#[test]
fn flat_storage_matches_registered_tensors() {
    let n = SIZES[0] + SIZES[1];
    let run = |mode: u8| {
        run_ranks(WORLD, &group_name(&format!("flat-{mode}")), |rank, comm| {
            let (a, b, _) = initial(rank);
            let mut adopted = vec![0f32; n + 4];
            let mut engine = Engine::new(&comm, &EngineConfig::new().tau(2)).unwrap();
            match mode {
                0 => engine.alloc_flat(n + 4).unwrap(),
                _ => engine.adopt_flat(&mut adopted).unwrap(),
            }
            let sa = engine.add_segment("a", 0, SIZES[0], Role::Parameter).unwrap();
            let sb = engine.add_segment("b", SIZES[0] + 4, SIZES[1], Role::Parameter).unwrap();
            engine.segment_mut(sa).copy_from_slice(&a);
            engine.segment_mut(sb).copy_from_slice(&b);
            engine.commit().unwrap();
            for step in 0..STEPS {
                let mut pa = engine.segment(sa).to_vec();
                let mut pb = engine.segment(sb).to_vec();
                inner_step(rank, step, &mut [&mut pa, &mut pb], &mut [], None);
                engine.segment_mut(sa).copy_from_slice(&pa);
                engine.segment_mut(sb).copy_from_slice(&pb);
                engine.step().unwrap();
            }
            engine.finalize().unwrap();
            let gap = engine.flat().unwrap()[SIZES[0]..SIZES[0] + 4].to_vec();
            assert_eq!(gap, vec![0.0; 4], "gaps between segments are never touched");
            (bits(engine.segment(sa)), bits(engine.segment(sb)))
        })
    };
    assert_eq!(run(0), run(1));
}

#[test]
fn consensus_anchor_equals_parameters_after_finalize() {
    run_ranks(2, &group_name("anchor"), |rank, comm| {
        let mut w = vec![rank as f32; 9];
        let mut engine = Engine::new(&comm, &EngineConfig::new().tau(2)).unwrap();
        let id = engine.register_tensor("w", &mut w, Role::Parameter).unwrap();
        engine.commit().unwrap();
        assert_eq!(engine.tensor(id), &[0.0; 9], "commit copies rank 0's values");
        for _ in 0..4 {
            engine.tensor_mut(id).iter_mut().for_each(|x| *x += rank as f32 + 1.0);
            engine.step().unwrap();
        }
        engine.finalize().unwrap();
        let mut anchor = vec![0f32; 9];
        engine.consensus(Consensus::Anchor, &mut anchor).unwrap();
        assert_eq!(bits(&anchor), bits(engine.tensor(id)));
    });
}
