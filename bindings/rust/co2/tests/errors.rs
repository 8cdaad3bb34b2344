//! Every error path reachable through the safe API returns `Err` with the right status (and the
//! library's message), and leaves the handles usable where the C API says so.

mod common;

use std::io::{self, Cursor, Read, Write};

use co2::{
    sys, Algorithm, ApplyStep, CommConfig, Communicator, Consensus, Engine, EngineConfig, Param, ReduceOp,
    Role, Status, Transport,
};
use common::{group_name, local_config, run_ranks};

fn single(test: &str) -> Communicator {
    Communicator::new(&local_config(&group_name(test), 0, 1)).unwrap()
}

fn assert_status<T: std::fmt::Debug>(result: co2::Result<T>, status: Status) -> co2::Error {
    let err = result.expect_err("expected an error");
    assert_eq!(err.status(), status, "{err}");
    assert!(!err.message().is_empty(), "{status:?} without a message");
    err
}

#[test]
fn status_codes_round_trip_and_have_texts() {
    let codes: [u32; 22] = [
        sys::CO2_ERR_INVALID_ARGUMENT,
        sys::CO2_ERR_INVALID_STATE,
        sys::CO2_ERR_UNSUPPORTED,
        sys::CO2_ERR_INVALID_CONFIG,
        sys::CO2_ERR_UNKNOWN_ENUM,
        sys::CO2_ERR_DUPLICATE_TENSOR,
        sys::CO2_ERR_OUT_OF_MEMORY,
        sys::CO2_ERR_NONFINITE,
        sys::CO2_ERR_LAYOUT_MISMATCH,
        sys::CO2_ERR_ANCHOR_MISMATCH,
        sys::CO2_ERR_CHECKPOINT_CORRUPT,
        sys::CO2_ERR_CHECKPOINT_MISMATCH,
        sys::CO2_ERR_CALLBACK,
        sys::CO2_ERR_TIMEOUT,
        sys::CO2_MEMBERSHIP_CHANGED,
        sys::CO2_ERR_PEER_LOST,
        sys::CO2_ERR_PEER_TIMEOUT,
        sys::CO2_ERR_COLLECTIVE_MISMATCH,
        sys::CO2_ERR_ABORTED,
        sys::CO2_ERR_TRANSPORT,
        sys::CO2_ERR_RENDEZVOUS,
        sys::CO2_ERR_INTERNAL,
    ];
    let mut texts = std::collections::HashSet::new();
    for code in codes {
        let status = Status::from_code(code as i32);
        assert!(!matches!(status, Status::Other(_)), "code {code} unknown to the crate");
        assert_eq!(status.code(), code as i32);
        assert!(texts.insert(status.description()), "{status:?} shares its text");
        assert_eq!(status.is_communicator_failure(), (100..200).contains(&code));
    }
    // 1.2: an elastic group re-formed. Its own variant, pinned at 50, not a communicator failure.
    assert_eq!(sys::CO2_MEMBERSHIP_CHANGED, 50);
    assert_eq!(Status::from_code(50), Status::MembershipChanged);
    assert_eq!(Status::MembershipChanged.code(), 50);
    assert!(!Status::MembershipChanged.is_communicator_failure());
    assert_eq!(Status::from_code(51), Status::Left);
    assert_eq!(Status::Left.code(), 51);
    assert!(!Status::Left.is_communicator_failure());
    assert_ne!(Status::MembershipChanged.description(), Status::Other(77).description());
    assert_eq!(Status::from_code(77), Status::Other(77));
    assert_eq!(Status::Other(77).code(), 77);
}

#[test]
fn communicator_creation_errors() {
    let bad = |config: CommConfig| Communicator::new(&config).map(|_| ());
    let g = group_name("comm-errors");
    assert_status(bad(local_config(&g, 0, 0)), Status::InvalidArgument); // world_size < 1
    assert_status(bad(local_config(&g, 2, 2)), Status::InvalidArgument); // rank out of range
    assert_status(bad(local_config(&g, -1, 2)), Status::InvalidArgument);
    assert_status(bad(local_config(&g, 0, 1).timeout_ms(0)), Status::InvalidArgument);
    assert_status(bad(local_config(&g, 0, 1).chunk_bytes(4)), Status::InvalidArgument);
    let err = assert_status(bad(local_config(&g, 0, 1).connections_per_peer(Some(17))), Status::InvalidArgument);
    assert!(err.message().contains("connections_per_peer"), "{err}");
    // elastic_min_ranks reaches the library: negative is refused, and so is a minimum above the
    // group's size (a builder that dropped the value would create the group).
    let err = assert_status(bad(local_config(&g, 0, 1).elastic_min_ranks(-1)), Status::InvalidArgument);
    assert!(err.message().contains("elastic_min_ranks"), "{err}");
    let err = assert_status(bad(local_config(&g, 0, 1).elastic_min_ranks(2)), Status::InvalidArgument);
    assert!(err.message().contains("elastic_min_ranks"), "{err}");
    assert_status(bad(local_config("", 0, 1)), Status::InvalidArgument); // empty group name
    let err = assert_status(bad(local_config("a\0b", 0, 1)), Status::InvalidArgument);
    assert!(err.message().contains("NUL"), "{err}");
    // Rank 1 never arrives: the rendezvous times out.
    let err = assert_status(bad(local_config(&g, 0, 2).timeout_ms(200)), Status::Rendezvous);
    assert!(err.status().is_communicator_failure());
    // An id that co2_get_unique_id did not make.
    let forged = co2::UniqueId::from_bytes([0x5a; sys::CO2_UNIQUE_ID_BYTES as usize]);
    assert_status(
        Communicator::with_unique_id(&CommConfig::new().transport(Transport::Local), &forged, 0, 1)
            .map(|_| ()),
        Status::InvalidArgument,
    );
}

#[test]
fn raw_collective_errors() {
    let comm = single("raw-errors");
    // Count 0 is a collective without data, as in NCCL and MPI (docs/capi.md).
    let mut empty: [f32; 0] = [];
    comm.allreduce(&mut empty, ReduceOp::Sum).unwrap();
    comm.allreduce_async(Vec::<i32>::new(), ReduceOp::Max).unwrap().wait().unwrap();
    let mut one = [1.0f64];
    assert_status(comm.broadcast(&mut one, 1), Status::InvalidArgument); // root outside the group
    comm.allreduce(&mut one, ReduceOp::Sum).unwrap(); // still usable
    comm.abort().unwrap();
    assert_status(comm.allreduce(&mut one, ReduceOp::Sum), Status::Aborted);
}

#[test]
fn request_wait_timeout_leaves_it_pending() {
    // Rank 1 joins the all-reduce only after rank 0 saw its wait time out.
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    run_ranks(2, &group_name("request-timeout"), |rank, comm| {
        if rank == 0 {
            let mut request = comm.allreduce_async(vec![1.0f32; 5], ReduceOp::Sum).unwrap();
            assert_status(request.wait_timeout(0), Status::Timeout);
            assert!(!request.test().unwrap());
            tx.send(()).unwrap();
            assert_eq!(request.wait().unwrap(), vec![2.0; 5]);
        } else {
            rx.lock().unwrap().recv().unwrap();
            assert_eq!(
                comm.allreduce_async(vec![1.0f32; 5], ReduceOp::Sum).unwrap().wait().unwrap(),
                vec![2.0; 5]
            );
        }
    });
}

#[test]
fn collective_mismatch_and_peer_timeout() {
    // Different counts at the same sequence number: a mismatch on both ranks, not a hang.
    run_ranks(2, &group_name("mismatch"), |rank, comm| {
        let mut x = vec![1.0f32; 4 + rank as usize];
        let err = comm.allreduce(&mut x, ReduceOp::Sum).unwrap_err();
        assert!(matches!(err.status(), Status::CollectiveMismatch | Status::Aborted), "{err}");
        if rank == 0 {
            // The rank that detected it first reports the mismatch itself on one side at least;
            // whichever side, the communicator is unusable afterwards.
            assert!(err.status().is_communicator_failure());
        }
        err.status()
    })
    .iter()
    .find(|s| **s == Status::CollectiveMismatch)
    .expect("at least one rank reports the collective mismatch");

    // Rank 1 never issues the collective: no progress for the timeout.
    let g = group_name("peer-timeout");
    let (tx, rx) = std::sync::mpsc::channel::<()>();
    let rx = std::sync::Mutex::new(rx);
    std::thread::scope(|scope| {
        let g1 = g.clone();
        let rx = &rx;
        scope.spawn(move || {
            let _idle = Communicator::new(&local_config(&g1, 1, 2).timeout_ms(300)).unwrap();
            rx.lock().unwrap().recv().unwrap();
        });
        let comm = Communicator::new(&local_config(&g, 0, 2).timeout_ms(300)).unwrap();
        let mut x = [1.0f32; 3];
        assert_status(comm.allreduce(&mut x, ReduceOp::Sum), Status::PeerTimeout);
        tx.send(()).unwrap();
    });
}

#[test]
fn engine_config_errors() {
    let comm = single("config-errors");
    let bad = |config: EngineConfig| Engine::new(&comm, &config).map(|_| ());
    assert_status(bad(EngineConfig::new().tau(0)), Status::InvalidArgument);
    assert_status(bad(EngineConfig::new().outer_lr(-1.0)), Status::InvalidArgument);
    assert_status(bad(EngineConfig::new().outer_lr(f64::NAN)), Status::InvalidArgument);
    assert_status(bad(EngineConfig::new().outer_momentum(Some(1.0))), Status::InvalidArgument);
    assert_status(bad(EngineConfig::new().penalty_constant(0.0)), Status::InvalidArgument);
    assert_status(bad(EngineConfig::new().clip_threshold(-0.5)), Status::InvalidArgument);
    assert_status(bad(EngineConfig::new().inner_lr(-1.0)), Status::InvalidArgument);
    // apply_step: co2 only, and a step too large for the C field is refused, not wrapped.
    let diloco_on_arrival = EngineConfig::new().algorithm(Algorithm::Diloco).apply_step(ApplyStep::OnArrival);
    let e = assert_status(bad(diloco_on_arrival), Status::InvalidArgument);
    assert!(e.message().contains("apply_step"), "{e}");
    assert_status(bad(EngineConfig::new().apply_step(ApplyStep::Step(u32::MAX))), Status::InvalidArgument);
    bad(EngineConfig::new().apply_step(ApplyStep::Step(1 << 30))).unwrap();
    bad(EngineConfig::new()).unwrap();
}

#[test]
fn layout_errors() {
    let comm = single("layout-errors");
    let mut a = vec![0f32; 8];
    // A registration borrows its slice for the engine's life even when it fails: one each.
    let (mut b1, mut b2, mut b3, mut b4) = (vec![0f32; 8], vec![0f32; 8], vec![0f32; 8], vec![0f32; 8]);
    let mut empty: Vec<f32> = Vec::new();
    let mut engine = Engine::new(&comm, &EngineConfig::new()).unwrap();
    assert_status(engine.commit(), Status::InvalidState); // nothing to train
    assert_status(engine.step(), Status::InvalidState); // before commit
    assert_status(engine.num_elements(), Status::InvalidState);
    assert_status(engine.state_size(), Status::InvalidState);
    assert_status(engine.add_segment("s", 0, 1, Role::Parameter), Status::InvalidState); // no flat storage
    assert_status(engine.register_tensor("", &mut b1, Role::Parameter), Status::InvalidArgument);
    assert_status(engine.register_tensor("e", &mut empty, Role::Parameter), Status::InvalidArgument);
    assert_status(engine.register_tensor("n\0ul", &mut b2, Role::Parameter), Status::InvalidArgument);
    engine.register_tensor("a", &mut a, Role::Parameter).unwrap();
    assert_status(engine.register_tensor("a", &mut b3, Role::Parameter), Status::DuplicateTensor);
    assert_status(engine.alloc_flat(0), Status::InvalidArgument);
    engine.alloc_flat(16).unwrap();
    assert_status(engine.alloc_flat(16), Status::InvalidState); // one flat storage per engine
    assert_status(engine.add_segment("s", 10, 7, Role::Parameter), Status::InvalidArgument); // leaves the storage
    engine.add_segment("s", 0, 10, Role::Buffer).unwrap();
    assert_status(engine.add_segment("t", 5, 2, Role::Parameter), Status::DuplicateTensor); // overlaps
    assert_status(engine.add_segment("s", 12, 2, Role::Parameter), Status::DuplicateTensor); // name taken
    engine.commit().unwrap();
    assert_status(engine.commit(), Status::InvalidState);
    assert_status(engine.register_tensor("late", &mut b4, Role::Parameter), Status::InvalidState);
    let mut wrong = vec![0f32; 3];
    assert_status(engine.consensus(Consensus::Anchor, &mut wrong), Status::InvalidArgument);
    let mut right = vec![0f32; engine.num_elements().unwrap()];
    engine.consensus(Consensus::Anchor, &mut right).unwrap();
}

#[test]
fn param_errors_change_nothing() {
    let comm = single("param-errors");
    let mut engine = Engine::new(&comm, &EngineConfig::new()).unwrap();
    engine.set_param(Param::OuterLr, 0.5).unwrap();
    assert_status(engine.set_param(Param::OuterLr, -0.1), Status::InvalidArgument);
    assert_status(engine.set_param(Param::OuterLr, f64::INFINITY), Status::InvalidArgument);
    assert_status(engine.set_param(Param::OuterMomentum, 1.0), Status::InvalidArgument);
    assert_status(engine.set_param(Param::Tau, 0.0), Status::InvalidArgument);
    assert_status(engine.set_param(Param::Tau, 2.5), Status::InvalidArgument);
    assert_status(engine.set_param(Param::ClipThreshold, 0.0), Status::InvalidArgument);
    assert_eq!(engine.get_param(Param::OuterLr).unwrap(), 0.5);
    engine.set_param(Param::Tau, 7.0).unwrap();
    assert_eq!(engine.get_param(Param::Tau).unwrap(), 7.0);
}

#[test]
fn reduce_gradients_checks_lengths_the_c_api_cannot() {
    let comm = single("grad-errors");
    let mut a = vec![0f32; 4];
    let mut b = vec![0f32; 2];
    let mut c = vec![0f32; 3];
    let mut engine = Engine::new(&comm, &EngineConfig::new().algorithm(Algorithm::Sync)).unwrap();
    engine.register_tensor("a", &mut a, Role::Parameter).unwrap();
    engine.register_tensor("stats", &mut c, Role::Buffer).unwrap(); // not a gradient slot
    engine.register_tensor("b", &mut b, Role::Parameter).unwrap();
    let (mut ga, mut gb, mut short) = (vec![1f32; 4], vec![2f32; 2], vec![0f32; 1]);
    assert_status(engine.reduce_gradients(&mut [&mut ga, &mut gb]), Status::InvalidState); // before commit
    engine.commit().unwrap();
    assert_status(engine.reduce_gradients(&mut [&mut ga]), Status::InvalidArgument);
    let err = assert_status(engine.reduce_gradients(&mut [&mut ga, &mut short]), Status::InvalidArgument);
    assert!(err.message().contains("gradient 1"), "{err}");
    engine.reduce_gradients(&mut [&mut ga, &mut gb]).unwrap();
    assert_eq!((ga, gb), (vec![1f32; 4], vec![2f32; 2]), "one rank: the average is itself");
}

#[test]
fn nonfinite_average_is_reported_on_every_rank() {
    // diloco averages at the boundary itself: a NaN on rank 1 fails that boundary everywhere.
    let statuses = run_ranks(2, &group_name("nonfinite"), |rank, comm| {
        let mut w = vec![0.5f32; 6];
        let mut engine =
            Engine::new(&comm, &EngineConfig::new().algorithm(Algorithm::Diloco).tau(1)).unwrap();
        let id = engine.register_tensor("w", &mut w, Role::Parameter).unwrap();
        engine.commit().unwrap();
        engine.step().unwrap();
        if rank == 1 {
            engine.tensor_mut(id)[2] = f32::NAN;
        }
        let err = assert_status(engine.step(), Status::NonFinite);
        engine.step().unwrap(); // training may continue
        assert!(engine.tensor(id).iter().all(|x| x.is_finite()));
        assert_eq!(engine.stats().unwrap().nonfinite_rounds, 1);
        err.status()
    });
    assert_eq!(statuses, vec![Status::NonFinite; 2]);
}

#[test]
fn layout_and_anchor_mismatch() {
    run_ranks(2, &group_name("layout-mismatch"), |rank, comm| {
        let mut w = vec![0f32; 5 + rank as usize];
        let mut engine = Engine::new(&comm, &EngineConfig::new()).unwrap();
        engine.register_tensor("w", &mut w, Role::Parameter).unwrap();
        assert_status(engine.commit(), Status::LayoutMismatch);
    });
    // Ranks that change the outer lr differently end with different anchors; synchronize
    // compares the checksums.
    run_ranks(2, &group_name("anchor-mismatch"), |rank, comm| {
        let mut w = vec![1f32; 5];
        let mut engine =
            Engine::new(&comm, &EngineConfig::new().algorithm(Algorithm::Diloco).tau(1)).unwrap();
        let id = engine.register_tensor("w", &mut w, Role::Parameter).unwrap();
        engine.commit().unwrap();
        engine.set_param(Param::OuterLr, if rank == 0 { 1.0 } else { 0.5 }).unwrap();
        for _ in 0..2 {
            engine.tensor_mut(id).iter_mut().for_each(|x| *x -= 0.25);
            engine.step().unwrap();
        }
        assert_status(engine.synchronize(), Status::AnchorMismatch);
    });
}

struct FailingWriter;
impl Write for FailingWriter {
    fn write(&mut self, _: &[u8]) -> io::Result<usize> {
        Err(io::Error::other("disk full"))
    }
    fn flush(&mut self) -> io::Result<()> {
        Ok(())
    }
}

struct PanickingReader;
impl Read for PanickingReader {
    fn read(&mut self, _: &mut [u8]) -> io::Result<usize> {
        panic!("a reader that panics must not unwind into C");
    }
}

#[test]
fn checkpoint_errors() {
    let comm = single("checkpoint-errors");
    let mut w = vec![0.25f32; 10];
    let mut engine = Engine::new(&comm, &EngineConfig::new().tau(2)).unwrap();
    let id = engine.register_tensor("w", &mut w, Role::Parameter).unwrap();
    let mut blob = Vec::new();
    assert_status(engine.save(Some(&mut blob)), Status::InvalidState); // before commit
    engine.commit().unwrap();
    for _ in 0..4 {
        engine.tensor_mut(id).iter_mut().for_each(|x| *x *= 0.5);
        engine.step().unwrap();
    }
    engine.save(Some(&mut blob)).unwrap();
    assert_eq!(blob.len(), engine.state_size().unwrap());
    engine.save::<Vec<u8>>(None).unwrap(); // a rank that does not write

    let err = assert_status(engine.save(Some(&mut FailingWriter)), Status::Callback);
    assert!(err.message().contains("disk full"), "{err}");
    let err = assert_status(engine.load(&mut Cursor::new(&blob[..blob.len() / 2])), Status::Callback);
    assert!(err.message().contains("reader"), "{err}");
    let err = assert_status(engine.load(&mut PanickingReader), Status::Callback);
    assert!(err.message().contains("panicked"), "{err}");

    let mut corrupt = blob.clone();
    let middle = corrupt.len() / 2;
    corrupt[middle] ^= 0x40;
    assert_status(engine.load(&mut Cursor::new(&corrupt)), Status::CheckpointCorrupt);

    // A blob of another layout.
    let other_comm = single("checkpoint-other");
    let mut v = vec![0f32; 11];
    let mut other = Engine::new(&other_comm, &EngineConfig::new().tau(2)).unwrap();
    other.register_tensor("w", &mut v, Role::Parameter).unwrap();
    other.commit().unwrap();
    assert_status(other.load(&mut Cursor::new(&blob)), Status::CheckpointMismatch);

    // The failed loads changed nothing: the good blob still loads, and round-trips.
    engine.load(&mut Cursor::new(&blob)).unwrap();
    let mut again = Vec::new();
    engine.save(Some(&mut again)).unwrap();
    assert_eq!(again, blob);
}
