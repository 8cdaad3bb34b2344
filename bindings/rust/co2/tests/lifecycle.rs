//! Create / destroy, configs with the C defaults, drop releasing the C handles, thread markers.

mod common;

use co2::{
    sys, Algorithm, ApplyStep, Clip, CommConfig, Communicator, Consensus, Engine, EngineConfig, Penalty,
    ReduceOp, Role, Transport, UniqueId,
};
use common::{group_name, local_config, run_ranks};

#[test]
fn configs_start_from_the_c_defaults() {
    let c = CommConfig::new();
    assert_eq!(c.get_transport(), Some(Transport::Auto));
    assert_eq!((c.get_rank(), c.get_world_size()), (0, 1));
    assert_eq!(c.get_group_name(), None);
    assert_eq!(c.get_timeout_ms(), sys::CO2_DEFAULT_TIMEOUT_MS);
    assert_eq!(c.get_chunk_bytes(), sys::CO2_DEFAULT_CHUNK_BYTES);
    assert_eq!(c.get_connections_per_peer(), None);
    assert_eq!(c.get_elastic_min_ranks(), 0, "not elastic by default");
    assert_eq!(CommConfig::new().elastic_min_ranks(3).get_elastic_min_ranks(), 3);
    assert_eq!(CommConfig::new().elastic_min_ranks(3).elastic_min_ranks(0).get_elastic_min_ranks(), 0);

    let e = EngineConfig::new();
    assert_eq!(e.get_algorithm(), Some(Algorithm::Co2));
    assert_eq!(e.get_tau(), sys::CO2_DEFAULT_TAU);
    assert_eq!(e.get_warmup_sync_rounds(), 0);
    assert_eq!(e.get_outer_lr(), sys::CO2_DEFAULT_OUTER_LR);
    assert_eq!(e.get_outer_momentum(), None, "beta defaults to automatic");
    assert!(!e.get_nesterov());
    assert_eq!(e.get_penalty(), Some(Penalty::None));
    assert_eq!(e.get_penalty_constant(), 1.0);
    assert_eq!(e.get_clip(), Some(Clip::None));
    assert_eq!(e.get_clip_threshold(), sys::CO2_DEFAULT_CLIP_THRESHOLD);
    assert_eq!(e.get_anchor_check_interval(), sys::CO2_DEFAULT_ANCHOR_CHECK_INTERVAL);
    assert_eq!(e.get_inner_lr(), 0.0);
    assert_eq!(e.get_eager(), None, "eager defaults to automatic");
    assert_eq!(EngineConfig::new().eager(Some(true)).get_eager(), Some(true));
    assert_eq!(EngineConfig::new().eager(Some(false)).get_eager(), Some(false));
    assert!(!e.get_shard_outer_state(), "the outer state is replicated by default");
    assert_eq!(e.as_raw().shard_outer_state, 0);
    let sharded = EngineConfig::new().shard_outer_state(true);
    assert!(sharded.get_shard_outer_state());
    assert_eq!(sharded.as_raw().shard_outer_state, 1, "reaches the C struct");
    assert_eq!(sharded.shard_outer_state(false).as_raw().shard_outer_state, 0);
    assert_eq!(e.get_apply_step(), Some(ApplyStep::AtBoundary), "applied at the boundary by default");
    assert_eq!(e.as_raw().apply_step, sys::CO2_DEFAULT_APPLY_STEP as i32);
    let raws = [(ApplyStep::OnArrival, -1), (ApplyStep::Step(3), 3), (ApplyStep::AtBoundary, 0)];
    for (when, raw) in raws {
        let c = EngineConfig::new().apply_step(when);
        assert_eq!(c.as_raw().apply_step, raw, "{when:?} reaches the C struct");
        assert_eq!(c.get_apply_step(), Some(when));
    }
    let step_0 = EngineConfig::new().apply_step(ApplyStep::Step(0));
    assert_eq!(step_0.get_apply_step(), Some(ApplyStep::AtBoundary), "step 0 is the boundary");
    assert_eq!(e.as_raw().reserved2, 0);

    let b = EngineConfig::new().algorithm(Algorithm::Diloco).tau(5).outer_momentum(Some(0.9)).nesterov(true);
    assert_eq!(b.get_algorithm(), Some(Algorithm::Diloco));
    assert_eq!((b.get_tau(), b.get_outer_momentum(), b.get_nesterov()), (5, Some(0.9), true));
    assert_eq!(b.as_raw().size, std::mem::size_of::<sys::co2_engine_config_t>());
}

#[test]
fn version_matches_the_header() {
    let (major, minor, patch) = co2::version().unwrap();
    assert_eq!(
        (major as u32, minor as u32, patch as u32),
        (sys::CO2_VERSION_MAJOR, sys::CO2_VERSION_MINOR, sys::CO2_VERSION_PATCH)
    );
}

#[test]
fn communicator_and_engine_create_and_destroy() {
    let group = group_name("create");
    let comm = Communicator::new(&local_config(&group, 0, 1)).unwrap();
    assert_eq!((comm.rank().unwrap(), comm.size().unwrap()), (0, 1));
    let mut values = vec![1.0f32, 2.0, 3.0];
    {
        let mut engine = Engine::new(&comm, &EngineConfig::new().tau(2)).unwrap();
        let id = engine.register_tensor("w", &mut values, Role::Parameter).unwrap();
        engine.commit().unwrap();
        assert_eq!(engine.num_elements().unwrap(), 3);
        engine.tensor_mut(id)[0] = 5.0;
        assert!(!engine.step().unwrap());
        assert!(engine.step().unwrap(), "the second step of tau = 2 is a boundary");
        engine.finalize().unwrap();
        let stats = engine.stats().unwrap();
        assert_eq!((stats.steps, stats.rounds, stats.world_size), (2, 1, 1));
    }
    // The engine's borrow ended with it: the caller's slice is readable again.
    assert!(values.iter().all(|v| v.is_finite()));
    drop(comm);
}

#[test]
fn dropping_every_handle_frees_the_group_name() {
    // The local transport reserves a group name until every member was destroyed: forming the
    // same group again proves that Drop released the communicators and the engines that kept
    // them alive, including an engine dropped with an all-reduce in flight.
    let group = group_name("drop");
    for _ in 0..3 {
        run_ranks(2, &group, |_, comm| {
            let mut engine = Engine::new(&comm, &EngineConfig::new().tau(1)).unwrap();
            engine.alloc_flat(64).unwrap();
            engine.add_segment("all", 0, 64, Role::Parameter).unwrap();
            engine.commit().unwrap();
            assert!(engine.step().unwrap()); // boundary 0: its all-reduce is now in flight
            let request = comm.allreduce_async(vec![1.0f64; 10], ReduceOp::Sum).unwrap();
            drop(request); // waits for completion
            drop(engine); // waits for the engine's all-reduce
        });
    }
}

#[test]
fn async_request_returns_its_buffer() {
    let group = group_name("async");
    let results = run_ranks(3, &group, |rank, comm| {
        let mut request = comm.allreduce_async(vec![rank as i64 + 1; 7], ReduceOp::Sum).unwrap();
        let _ = request.test().unwrap();
        let summed = request.wait().unwrap();
        let root_values = if rank == 2 { vec![2.5f32; 3] } else { vec![0.0; 3] };
        let broadcast = comm.broadcast_async(root_values, 2).unwrap().wait().unwrap();
        (summed, broadcast)
    });
    for (summed, broadcast) in results {
        assert_eq!(summed, vec![6i64; 7]);
        assert_eq!(broadcast, vec![2.5f32; 3]);
    }
}

#[test]
fn unique_id_groups() {
    let id = UniqueId::new().unwrap();
    let copy = UniqueId::from_bytes(id.as_bytes());
    let sizes = std::thread::scope(|scope| {
        let handles: Vec<_> = (0..2)
            .map(|rank| {
                scope.spawn(move || {
                    let comm = Communicator::with_unique_id(
                        &CommConfig::new().transport(Transport::Local),
                        &copy,
                        rank,
                        2,
                    )
                    .unwrap();
                    let mut x = [rank as f32 + 1.0];
                    comm.allreduce(&mut x, ReduceOp::Max).unwrap();
                    (comm.size().unwrap(), x[0])
                })
            })
            .collect();
        handles.into_iter().map(|h| h.join().unwrap()).collect::<Vec<_>>()
    });
    assert_eq!(sizes, vec![(2, 2.0), (2, 2.0)]);
}

#[test]
fn split_forms_nodes_and_lanes() {
    let results = run_ranks(4, &group_name("split"), |rank, world| {
        let (node, local) = (rank / 2, rank % 2);
        let nodes = world.split(Some(node as u32), local, None).unwrap().unwrap();
        let lanes = world.split(Some(local as u32), node, None).unwrap().unwrap();
        assert!(world.split(None, 0, None).unwrap().is_none());
        let (mut in_node, mut in_lane) = ([rank as i64], [rank as i64]);
        nodes.allreduce(&mut in_node, ReduceOp::Sum).unwrap();
        lanes.allreduce(&mut in_lane, ReduceOp::Sum).unwrap();
        (nodes.rank().unwrap(), lanes.rank().unwrap(), in_node[0], in_lane[0])
    });
    assert_eq!(results, vec![(0, 0, 1, 2), (1, 0, 1, 4), (0, 1, 5, 2), (1, 1, 5, 4)]);
}

#[test]
fn split_nodes_from_node_ids() {
    // Ranks 0, 2 on node id 10 (node 0: it holds rank 0), ranks 1, 3 on node id 11.
    let results = run_ranks(4, &group_name("split_nodes"), |rank, world| {
        let config = CommConfig::new().node_id(Some(10 + rank % 2));
        let (intra, inter) = world.split_nodes(Some(&config)).unwrap();
        let (mut in_node, mut in_lane) = ([rank as i64], [rank as i64]);
        intra.allreduce(&mut in_node, ReduceOp::Sum).unwrap();
        inter.allreduce(&mut in_lane, ReduceOp::Sum).unwrap();
        let unequal = match world.split_nodes(Some(&CommConfig::new().node_id(Some(i32::from(rank == 3))))) {
            Ok(_) => panic!("nodes of 3 and 1 ranks were accepted"),
            Err(error) => error,
        };
        assert_eq!(unequal.status(), co2::Status::InvalidArgument);
        assert!(unequal.message().contains("has 3 ranks"), "{}", unequal.message());
        (intra.rank().unwrap(), intra.size().unwrap(), inter.rank().unwrap(), in_node[0], in_lane[0])
    });
    assert_eq!(results, vec![(0, 2, 0, 2, 1), (0, 2, 1, 4, 1), (1, 2, 0, 2, 5), (1, 2, 1, 4, 5)]);
}

#[test]
fn abort_from_another_thread_unblocks_a_collective() {
    // Only rank 0 of a 2-rank group issues the all-reduce, so it blocks; a watchdog thread
    // aborts it through an AbortHandle (the Communicator itself is not Sync). Rank 1 is
    // held by this thread and never takes part.
    let group = group_name("abort");
    let (ready_tx, ready_rx) = std::sync::mpsc::channel::<()>();
    let (done_tx, done_rx) = std::sync::mpsc::channel::<()>();
    let (comm_tx, comm_rx) = std::sync::mpsc::channel::<Communicator>();
    let g = group.clone();
    let peer = std::thread::spawn(move || {
        let comm = Communicator::new(&local_config(&g, 0, 2)).unwrap();
        comm_tx.send(comm).unwrap();
    });
    let _peer1 = Communicator::new(&local_config(&group, 1, 2)).unwrap();
    peer.join().unwrap();
    let comm = comm_rx.recv().unwrap(); // a Communicator moves between threads (Send)
    std::thread::scope(|scope| {
        let aborter = comm.abort_handle();
        scope.spawn(move || {
            ready_rx.recv().unwrap();
            std::thread::sleep(std::time::Duration::from_millis(50));
            aborter.abort().unwrap();
        });
        ready_tx.send(()).unwrap();
        let mut x = [1.0f32; 4];
        let err = comm.allreduce(&mut x, ReduceOp::Sum).unwrap_err();
        assert_eq!(err.status(), co2::Status::Aborted, "{err}");
        assert!(err.status().is_communicator_failure());
        done_tx.send(()).unwrap();
    });
    drop(done_rx);
}

// What may cross threads, checked at compile time (the reasons are on the impls).
#[allow(dead_code)]
fn thread_markers() {
    fn send<T: Send>() {}
    fn sync<T: Sync>() {}
    send::<Communicator>();
    send::<co2::AbortHandle<'static>>();
    sync::<co2::AbortHandle<'static>>();
    send::<Engine<'static>>();
    send::<co2::Request<f32>>();
    send::<co2::Error>();
    sync::<co2::Error>();
}

// Communicator must not be Sync while submission is not thread-safe (issue 12): this compiles
// only if it is not. Were it Sync, both impls below would apply and the call would be ambiguous.
#[allow(dead_code)]
fn communicator_is_not_sync() {
    trait AmbiguousIfSync<A> {
        fn check() {}
    }
    impl<T: ?Sized> AmbiguousIfSync<()> for T {}
    struct IsSync;
    impl<T: ?Sized + Sync> AmbiguousIfSync<IsSync> for T {}
    <Communicator as AmbiguousIfSync<_>>::check();
}

/// Sharded outer state and hierarchical co2 through the safe wrapper: 4 ranks (hierarchical: 2
/// nodes of 2 by node id, gradients averaged inside the node), every rank ends with the same
/// anchor bit for bit and holds less outer state than the replicated 3 model copies.
#[test]
fn sharded_and_hierarchical_engines_train_one_model() {
    for hierarchical in [false, true] {
        let group = group_name(if hierarchical { "hierarchical" } else { "sharded" });
        let anchors: Vec<(Vec<u32>, f64)> = std::thread::scope(|scope| {
            let handles: Vec<_> = (0..4)
                .map(|rank| {
                    let group = group.clone();
                    scope.spawn(move || {
                        let comm = Communicator::new(&local_config(&group, rank, 4).node_id(Some(rank / 2))).unwrap();
                        let config = EngineConfig::new().tau(2).outer_momentum(Some(0.5)).eager(Some(false));
                        let config = if hierarchical { config.hierarchical(true) } else { config.shard_outer_state(true) };
                        let mut w = vec![0.25f32; 1001];
                        let mut engine = Engine::new(&comm, &config).unwrap();
                        let tw = engine.register_tensor("w", &mut w, Role::Parameter).unwrap();
                        engine.commit().unwrap();
                        for step in 0..9 {
                            let mut g: Vec<f32> = (0..1001).map(|i| ((i + step * 7 + rank as usize * 13) % 17) as f32 * 0.01).collect();
                            if hierarchical {
                                engine.reduce_gradients(&mut [&mut g]).unwrap();
                            }
                            for (p, d) in engine.tensor_mut(tw).iter_mut().zip(&g) {
                                *p -= 0.1 * d;
                            }
                            engine.step().unwrap();
                        }
                        engine.finalize().unwrap();
                        let mut anchor = vec![0f32; engine.num_elements().unwrap()];
                        engine.consensus(Consensus::Anchor, &mut anchor).unwrap();
                        let copies = engine.stats().unwrap().outer_state_bytes as f64 / (4.0 * 1001.0);
                        (anchor.iter().map(|v| v.to_bits()).collect(), copies)
                    })
                })
                .collect();
            handles.into_iter().map(|h| h.join().expect("rank thread panicked")).collect()
        });
        for (anchor, copies) in &anchors {
            assert_eq!(anchor, &anchors[0].0, "hierarchical {hierarchical}: the ranks' anchors differ");
            assert!(*copies < 3.0, "hierarchical {hierarchical}: {copies} model copies of outer state");
        }
    }
}

/// co2 applying its average on arrival through the safe wrapper: 2 ranks, τ = 6. Every round
/// after the first has an average in flight, applied between boundaries at a step the ranks
/// agree on (`OnArrival`) or the one asked for (`Step(k)`), and the ranks end on one anchor.
/// Each step takes 2 ms, as a training step would: steps of a few hundred nanoseconds
/// end the round before the local all-reduce (about 0.1 ms) arrives, and `OnArrival` then
/// rightly applies it at the boundary.
#[test]
fn apply_step_applies_the_average_between_boundaries() {
    for when in [ApplyStep::OnArrival, ApplyStep::Step(4), ApplyStep::AtBoundary] {
        let group = group_name("apply-step");
        let results = run_ranks(2, &group, |rank, comm| {
            let config = EngineConfig::new().tau(6).outer_momentum(Some(0.5)).apply_step(when);
            let mut w = vec![0.5f32; 64];
            let mut engine = Engine::new(&comm, &config).unwrap();
            let tw = engine.register_tensor("w", &mut w, Role::Parameter).unwrap();
            engine.commit().unwrap();
            // 10 rounds: OnArrival applies at the boundary until the ranks agreed on measured
            // step and all-reduce times (about three rounds), then mid-round.
            for step in 0..60 {
                for (i, p) in engine.tensor_mut(tw).iter_mut().enumerate() {
                    *p -= 0.01 * ((i + step + rank as usize * 5) % 7) as f32;
                }
                std::thread::sleep(std::time::Duration::from_millis(5));
                engine.step().unwrap();
            }
            let stats = engine.stats().unwrap();  // before finalize, which applies at a boundary
            engine.finalize().unwrap();
            let mut anchor = vec![0f32; engine.num_elements().unwrap()];
            engine.consensus(Consensus::Anchor, &mut anchor).unwrap();
            (common::bits(&anchor), stats)
        });
        for (anchor, stats) in &results {
            assert_eq!(anchor, &results[0].0, "{when:?}: the ranks' anchors differ");
            match when {
                ApplyStep::AtBoundary => {
                    assert_eq!(stats.arrival_updates, 0, "{when:?}: {stats:?}");
                    assert_eq!(stats.last_apply_step, 0, "{when:?}: {stats:?}");
                }
                ApplyStep::Step(k) => {
                    // Rounds 2 to 10 each apply the previous round's average at step k.
                    assert_eq!(stats.arrival_updates, 9, "{when:?}: {stats:?}");
                    assert_eq!(stats.last_apply_step, k, "{when:?}: {stats:?}");
                }
                ApplyStep::OnArrival => {
                    assert!(stats.arrival_updates >= 1, "{when:?}: {stats:?}");
                    assert!((1..6).contains(&stats.last_apply_step), "{when:?}: {stats:?}");
                }
            }
        }
        assert_eq!(results[0].1.arrival_updates, results[1].1.arrival_updates, "{when:?}: the ranks agree");
        assert_eq!(results[0].1.last_apply_step, results[1].1.last_apply_step, "{when:?}: the ranks agree");
    }
}
