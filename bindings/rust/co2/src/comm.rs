//! `Communicator` and `CommConfig`: a group of ranks and its raw collectives.

use std::ffi::CString;
use std::ptr::{self, NonNull};

use co2_sys as sys;

use crate::enums::{Element, ReduceOp, Transport};
use crate::error::{check, Error, Result, Status};
use crate::request::Request;

/// How to form a group. Starts from the C defaults (`co2_comm_config_init`): transport `Auto`,
/// rank 0 of a group of 1, group name "default", 300 s no-progress timeout, 1 MiB chunks.
#[derive(Clone, Debug)]
pub struct CommConfig {
    raw: sys::co2_comm_config_t,
    group_name: Option<String>,
}

impl Default for CommConfig {
    fn default() -> Self {
        CommConfig::new()
    }
}

impl CommConfig {
    pub fn new() -> CommConfig {
        // SAFETY: an all-zero config is a valid place for the init function to write into.
        let mut raw: sys::co2_comm_config_t = unsafe { std::mem::zeroed() };
        // SAFETY: `raw` is a valid, writable co2_comm_config_t; the call only fails on NULL.
        let status = unsafe { sys::co2_comm_config_init(&mut raw) };
        debug_assert_eq!(status, sys::CO2_OK as i32);
        CommConfig { raw, group_name: None }
    }

    pub fn transport(mut self, transport: Transport) -> Self {
        self.raw.transport = transport.raw();
        self
    }
    /// This rank, in `[0, world_size)`.
    pub fn rank(mut self, rank: i32) -> Self {
        self.raw.rank = rank;
        self
    }
    pub fn world_size(mut self, world_size: i32) -> Self {
        self.raw.world_size = world_size;
        self
    }
    /// Local transport: communicators with equal names form one group.
    pub fn group_name(mut self, name: impl Into<String>) -> Self {
        self.group_name = Some(name.into());
        self
    }
    /// No-progress timeout: a blocked operation fails with `PeerTimeout` when nothing moved for
    /// this long (also the rendezvous timeout).
    pub fn timeout_ms(mut self, timeout_ms: u32) -> Self {
        self.raw.timeout_ms = timeout_ms;
        self
    }
    /// Size of one pipelined chunk of a collective.
    pub fn chunk_bytes(mut self, chunk_bytes: u64) -> Self {
        self.raw.chunk_bytes = chunk_bytes;
        self
    }
    /// CUDA device of an NCCL communicator; `None` (the default): the launcher's local rank,
    /// else the calling thread's current device.
    pub fn device_index(mut self, device_index: Option<i32>) -> Self {
        self.raw.device_index = device_index.unwrap_or(sys::CO2_DEVICE_INDEX_AUTO);
        self
    }

    /// The node (host) this rank is on, for [`Communicator::split_nodes`]; `None` (the
    /// default): the launcher's node (`GROUP_RANK` under co2run / torchrun, `SLURM_NODEID`
    /// under srun), else the host name.
    pub fn node_id(mut self, node_id: Option<i32>) -> Self {
        self.raw.node_id = node_id.unwrap_or(sys::CO2_NODE_ID_AUTO);
        self
    }

    /// Over UCX: bulk connections to each peer (1..=16), messages striped over them, for links
    /// that cap each TCP flow; `None` (the default): `CO2_UCX_CONNECTIONS` where set, else 1.
    /// Every rank must ask for the same number.
    pub fn connections_per_peer(mut self, connections: Option<u32>) -> Self {
        self.raw.connections_per_peer = connections.unwrap_or(sys::CO2_CONNECTIONS_AUTO);
        self
    }

    /// Elastic membership (docs/capi.md, "Elastic membership"). 0 (the default): a lost rank
    /// fails the group (`Status::PeerLost` / `Status::PeerTimeout` on every rank). k >= 1: when a
    /// rank dies, stalls past the timeout or is cut off, the survivors re-form without it while at
    /// least k ranks remain, and the engine call that met the loss returns
    /// [`Status::MembershipChanged`]: the caller re-reads [`Communicator::rank`] /
    /// [`Communicator::size`] (they changed) and keeps training. Every rank must pass the same k;
    /// UCX only (the local transport and NCCL refuse k >= 1 with `Status::Unsupported`), host
    /// tensors with replicated outer state; k < 0 or above the world size is
    /// `Status::InvalidArgument`.
    pub fn elastic_min_ranks(mut self, k: i32) -> Self {
        self.raw.elastic_min_ranks = k;
        self
    }

    pub fn get_transport(&self) -> Option<Transport> {
        Transport::from_raw(self.raw.transport)
    }
    pub fn get_rank(&self) -> i32 {
        self.raw.rank
    }
    pub fn get_world_size(&self) -> i32 {
        self.raw.world_size
    }
    pub fn get_group_name(&self) -> Option<&str> {
        self.group_name.as_deref()
    }
    pub fn get_timeout_ms(&self) -> u32 {
        self.raw.timeout_ms
    }
    pub fn get_chunk_bytes(&self) -> u64 {
        self.raw.chunk_bytes
    }
    pub fn get_device_index(&self) -> Option<i32> {
        (self.raw.device_index >= 0).then_some(self.raw.device_index)
    }

    pub fn get_node_id(&self) -> Option<i32> {
        (self.raw.node_id >= 0).then_some(self.raw.node_id)
    }

    pub fn get_connections_per_peer(&self) -> Option<u32> {
        (self.raw.connections_per_peer != sys::CO2_CONNECTIONS_AUTO).then_some(self.raw.connections_per_peer)
    }

    /// 0: not elastic (the default).
    pub fn get_elastic_min_ranks(&self) -> i32 {
        self.raw.elastic_min_ranks
    }

    /// The C struct plus the C string its `group_name` points into (keep both alive together).
    fn to_raw(&self) -> Result<(sys::co2_comm_config_t, Option<CString>)> {
        let name = match &self.group_name {
            Some(name) => Some(
                CString::new(name.as_str())
                    .map_err(|_| Error::new(Status::InvalidArgument, "group_name contains a NUL byte"))?,
            ),
            None => None,
        };
        let mut raw = self.raw;
        raw.group_name = name.as_ref().map_or(ptr::null(), |n| n.as_ptr());
        Ok((raw, name))
    }
}

/// Opaque group identifier (NCCL style): made by one rank, sent to the others by the caller's
/// own means (MPI, a launcher's store), passed to `Communicator::with_unique_id` by every rank.
#[derive(Clone, Copy)]
pub struct UniqueId(sys::co2_unique_id_t);

impl UniqueId {
    pub fn new() -> Result<UniqueId> {
        // SAFETY: zeroed bytes are a valid co2_unique_id_t to overwrite.
        let mut id: sys::co2_unique_id_t = unsafe { std::mem::zeroed() };
        // SAFETY: `id` is valid and writable.
        check(unsafe { sys::co2_get_unique_id(&mut id) })?;
        Ok(UniqueId(id))
    }

    pub fn as_bytes(&self) -> [u8; sys::CO2_UNIQUE_ID_BYTES as usize] {
        self.0.internal.map(|c| c as u8)
    }

    /// Rebuilds an id received from another rank. Any bytes are accepted here; the library
    /// rejects ids it did not produce when the communicator is created.
    pub fn from_bytes(bytes: [u8; sys::CO2_UNIQUE_ID_BYTES as usize]) -> UniqueId {
        UniqueId(sys::co2_unique_id_t { internal: bytes.map(|b| b as std::os::raw::c_char) })
    }
}

impl std::fmt::Debug for UniqueId {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("UniqueId(..)")
    }
}

/// One rank's membership in a group. Dropping it releases this handle's reference
/// (`co2_comm_destroy`); engines and requests created on it keep the group alive.
pub struct Communicator {
    raw: NonNull<sys::co2_comm>,
}

// SAFETY: the handle is a reference-counted C++ object that is not tied to the thread that
// created it (docs/capi.md, Threading: nothing in the communicator API is thread-affine).
unsafe impl Send for Communicator {}
// Not Sync: collective submission is thread-compatible, not thread-safe (docs/capi.md,
// Threading): two threads submitting on one communicator would issue collectives in an order
// that differs from rank to rank. Aborting from another thread, the one cross-thread use the C
// API allows, goes through `abort_handle()`.

/// Aborts a communicator from any thread while its owner may be blocked in a collective
/// (`co2_comm_abort` is the one communicator call that is safe concurrently with others).
/// Borrowed from the [`Communicator`], so it cannot outlive it.
#[derive(Clone, Copy)]
pub struct AbortHandle<'a> {
    raw: NonNull<sys::co2_comm>,
    _comm: std::marker::PhantomData<&'a Communicator>,
}

// SAFETY: the only call it offers is co2_comm_abort, which is thread-safe by contract, on a
// handle that stays valid while the borrowed Communicator lives.
unsafe impl Send for AbortHandle<'_> {}
// SAFETY: as for Send: abort may run from several threads at once.
unsafe impl Sync for AbortHandle<'_> {}

impl AbortHandle<'_> {
    /// Fails every pending and future operation of the communicator and its peers with
    /// `Aborted`.
    pub fn abort(&self) -> Result<()> {
        // SAFETY: valid handle (the Communicator is borrowed); abort is thread-safe.
        check(unsafe { sys::co2_comm_abort(self.raw.as_ptr()) })
    }
}

impl Communicator {
    /// Collective over the group: blocks until all `world_size` ranks joined (each rank on its
    /// own thread for the local transport), or fails with `Rendezvous` after the timeout.
    pub fn new(config: &CommConfig) -> Result<Communicator> {
        let (raw_config, _name) = config.to_raw()?;
        let mut comm: sys::co2_comm_t = ptr::null_mut();
        // SAFETY: raw_config and the name it points to live until the call returns.
        check(unsafe { sys::co2_comm_create(&raw_config, &mut comm) })?;
        Ok(Communicator::from_created(comm))
    }

    /// NCCL-style creation: `rank` and `world_size` override the config's.
    pub fn with_unique_id(
        config: &CommConfig,
        id: &UniqueId,
        rank: i32,
        world_size: i32,
    ) -> Result<Communicator> {
        let (raw_config, _name) = config.to_raw()?;
        let mut comm: sys::co2_comm_t = ptr::null_mut();
        // SAFETY: all pointers are valid for the duration of the call.
        check(unsafe { sys::co2_comm_create_with_id(&raw_config, &id.0, rank, world_size, &mut comm) })?;
        Ok(Communicator::from_created(comm))
    }

    /// Collective over this group: the ranks passing the same `color` form a new communicator,
    /// ranked by (`key`, this rank); `color` `None` joins none and returns `Ok(None)`. The new
    /// groups use this one's kind of transport and its timeout and chunk size, unless `config`
    /// gives them (its rank, world size and group name are ignored).
    pub fn split(&self, color: Option<u32>, key: i32, config: Option<&CommConfig>) -> Result<Option<Communicator>> {
        let color = match color {
            Some(c) => i32::try_from(c).map_err(|_| Error::new(Status::InvalidArgument, "color does not fit an i32"))?,
            None => sys::CO2_SPLIT_NONE,
        };
        let raw_config = config.map(|c| c.to_raw()).transpose()?;
        let config_ptr = raw_config.as_ref().map_or(ptr::null(), |(raw, _name)| raw as *const _);
        let mut comm: sys::co2_comm_t = ptr::null_mut();
        // SAFETY: valid handle; the config (and the name it points to) live until the call returns.
        check(unsafe { sys::co2_comm_split(self.as_raw(), color, key, config_ptr, &mut comm) })?;
        Ok(NonNull::new(comm).map(|raw| Communicator { raw }))
    }

    /// Collective over this group: `(intra, inter)` for hierarchical training. `intra`: the
    /// ranks of this rank's node, ranked by rank here (its rank is the local index); `inter`:
    /// the ranks with this local index on every node, ranked by node (its rank is the node
    /// index; nodes are numbered by their lowest rank). The node: `config`'s `node_id` if set,
    /// else the one this group was made with, else the launcher's, else the host name. Nodes
    /// of different sizes fail with `InvalidArgument` on every rank. `config` as for `split`.
    pub fn split_nodes(&self, config: Option<&CommConfig>) -> Result<(Communicator, Communicator)> {
        let raw_config = config.map(|c| c.to_raw()).transpose()?;
        let config_ptr = raw_config.as_ref().map_or(ptr::null(), |(raw, _name)| raw as *const _);
        let (mut intra, mut inter): (sys::co2_comm_t, sys::co2_comm_t) = (ptr::null_mut(), ptr::null_mut());
        // SAFETY: valid handle and outputs; the config lives until the call returns.
        check(unsafe { sys::co2_comm_split_nodes(self.as_raw(), config_ptr, &mut intra, &mut inter) })?;
        Ok((Communicator::from_created(intra), Communicator::from_created(inter)))
    }

    fn from_created(comm: sys::co2_comm_t) -> Communicator {
        Communicator { raw: NonNull::new(comm).expect("co2_comm_create returned OK and a NULL handle") }
    }

    /// The raw handle, for calls this crate does not wrap. It stays owned by `self`.
    pub fn as_raw(&self) -> sys::co2_comm_t {
        self.raw.as_ptr()
    }

    pub fn rank(&self) -> Result<i32> {
        let mut rank = -1;
        // SAFETY: valid handle and output.
        check(unsafe { sys::co2_comm_rank(self.as_raw(), &mut rank) })?;
        Ok(rank)
    }

    pub fn size(&self) -> Result<i32> {
        let mut size = -1;
        // SAFETY: valid handle and output.
        check(unsafe { sys::co2_comm_size(self.as_raw(), &mut size) })?;
        Ok(size)
    }

    /// A handle that aborts this communicator from another thread (the Communicator itself
    /// is not `Sync`).
    pub fn abort_handle(&self) -> AbortHandle<'_> {
        AbortHandle { raw: self.raw, _comm: std::marker::PhantomData }
    }

    /// Fails every pending and future operation of this communicator and its peers with
    /// `Aborted`. From another thread, use [`Communicator::abort_handle`].
    pub fn abort(&self) -> Result<()> {
        // SAFETY: valid handle; abort is thread-safe.
        check(unsafe { sys::co2_comm_abort(self.as_raw()) })
    }

    /// Blocking in-place all-reduce (collective). The result is bit-identical on every rank.
    pub fn allreduce<T: Element>(&self, buffer: &mut [T], op: ReduceOp) -> Result<()> {
        // SAFETY: the buffer is borrowed mutably until the request is freed below, which waits
        // for completion.
        let request = unsafe { self.post_allreduce(buffer.as_mut_ptr(), buffer.len(), op) }?;
        // SAFETY: a request just posted; freed exactly once, here.
        unsafe { wait_and_free(request) }
    }

    /// Blocking in-place broadcast from `root` (collective).
    pub fn broadcast<T: Element>(&self, buffer: &mut [T], root: i32) -> Result<()> {
        // SAFETY: as in allreduce.
        let request = unsafe { self.post_broadcast(buffer.as_mut_ptr(), buffer.len(), root) }?;
        // SAFETY: as in allreduce.
        unsafe { wait_and_free(request) }
    }

    /// Asynchronous all-reduce: the request owns `buffer` until it completes (so a forgotten
    /// request leaks the buffer instead of freeing memory the collective still writes).
    pub fn allreduce_async<T: Element>(&self, mut buffer: Vec<T>, op: ReduceOp) -> Result<Request<T>> {
        // SAFETY: the heap block of `buffer` moves into the Request and stays put until freed.
        let request = unsafe { self.post_allreduce(buffer.as_mut_ptr(), buffer.len(), op) }?;
        Ok(Request::new(request, buffer))
    }

    /// Asynchronous broadcast from `root`; see `allreduce_async`.
    pub fn broadcast_async<T: Element>(&self, mut buffer: Vec<T>, root: i32) -> Result<Request<T>> {
        // SAFETY: as in allreduce_async.
        let request = unsafe { self.post_broadcast(buffer.as_mut_ptr(), buffer.len(), root) }?;
        Ok(Request::new(request, buffer))
    }

    /// Posts an in-place all-reduce of `len` elements at `data`.
    ///
    /// # Safety
    /// `data` must stay valid and unaliased until the returned request completes and is freed.
    unsafe fn post_allreduce<T: Element>(
        &self,
        data: *mut T,
        len: usize,
        op: ReduceOp,
    ) -> Result<sys::co2_request_t> {
        let mut request: sys::co2_request_t = ptr::null_mut();
        check(sys::co2_allreduce(
            self.as_raw(),
            data.cast(),
            len,
            T::DTYPE,
            op.raw(),
            ptr::null_mut(),
            &mut request,
        ))?;
        Ok(request)
    }

    /// Posts an in-place broadcast of `len` elements at `data` from `root`.
    ///
    /// # Safety
    /// As for `post_allreduce`.
    unsafe fn post_broadcast<T: Element>(
        &self,
        data: *mut T,
        len: usize,
        root: i32,
    ) -> Result<sys::co2_request_t> {
        let mut request: sys::co2_request_t = ptr::null_mut();
        check(sys::co2_broadcast(
            self.as_raw(),
            data.cast(),
            len,
            T::DTYPE,
            root,
            ptr::null_mut(),
            &mut request,
        ))?;
        Ok(request)
    }
}

/// Waits for a request without a caller timeout (bounded by the communicator's no-progress
/// timeout), then frees it, returning the wait's status.
unsafe fn wait_and_free(request: sys::co2_request_t) -> Result<()> {
    let waited = check(sys::co2_request_wait(request, -1));
    sys::co2_request_free(request);
    waited
}

impl Drop for Communicator {
    fn drop(&mut self) {
        // SAFETY: the handle is owned and released exactly once. The status is only ever
        // INTERNAL, which a destructor cannot report.
        unsafe { sys::co2_comm_destroy(self.as_raw()) };
    }
}
