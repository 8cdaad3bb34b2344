pub const CO2_VERSION_MAJOR: u32 = 1;
pub const CO2_VERSION_MINOR: u32 = 2;
pub const CO2_VERSION_PATCH: u32 = 0;
pub const CO2_ABI_VERSION: u32 = 3;
pub const CO2_DEFAULT_TIMEOUT_MS: u32 = 300000;
pub const CO2_DEVICE_INDEX_AUTO: i32 = -1;
pub const CO2_NODE_ID_AUTO: i32 = -1;
pub const CO2_CONNECTIONS_AUTO: u32 = 0;
pub const CO2_MAX_CONNECTIONS: u32 = 16;
pub const CO2_UNIQUE_ID_BYTES: u32 = 128;
pub const CO2_SPLIT_NONE: i32 = -1;
pub const CO2_DEFAULT_TAU: u32 = 12;
pub const CO2_DEFAULT_OUTER_LR: f64 = 1.0;
pub const CO2_OUTER_MOMENTUM_AUTO: f64 = -1.0;
pub const CO2_DEFAULT_CLIP_THRESHOLD: f64 = 1.0;
pub const CO2_DEFAULT_ANCHOR_CHECK_INTERVAL: u32 = 100;
pub const CO2_EAGER_AUTO: i32 = -1;
pub const CO2_DEFAULT_EAGER: i32 = -1;
pub const CO2_DEFAULT_ERROR_FEEDBACK: u32 = 1;
pub const CO2_APPLY_AT_BOUNDARY: u32 = 0;
pub const CO2_APPLY_ON_ARRIVAL: i32 = -1;
pub const CO2_DEFAULT_APPLY_STEP: u32 = 0;
pub const CO2_HIERARCHY_FLAT: u32 = 0;
pub const CO2_HIERARCHY_NODES: u32 = 1;
pub type __int32_t = ::std::os::raw::c_int;
pub type __uint32_t = ::std::os::raw::c_uint;
pub type __int64_t = ::std::os::raw::c_long;
pub type __uint64_t = ::std::os::raw::c_ulong;
pub type co2_status_t = i32;
pub const CO2_OK: _bindgen_ty_1 = 0;
pub const CO2_ERR_INVALID_ARGUMENT: _bindgen_ty_1 = 1;
pub const CO2_ERR_INVALID_STATE: _bindgen_ty_1 = 2;
pub const CO2_ERR_UNSUPPORTED: _bindgen_ty_1 = 3;
pub const CO2_ERR_INVALID_CONFIG: _bindgen_ty_1 = 4;
pub const CO2_ERR_UNKNOWN_ENUM: _bindgen_ty_1 = 5;
pub const CO2_ERR_DUPLICATE_TENSOR: _bindgen_ty_1 = 6;
pub const CO2_ERR_OUT_OF_MEMORY: _bindgen_ty_1 = 7;
pub const CO2_ERR_NONFINITE: _bindgen_ty_1 = 20;
pub const CO2_ERR_LAYOUT_MISMATCH: _bindgen_ty_1 = 21;
pub const CO2_ERR_ANCHOR_MISMATCH: _bindgen_ty_1 = 22;
pub const CO2_ERR_CHECKPOINT_CORRUPT: _bindgen_ty_1 = 23;
pub const CO2_ERR_CHECKPOINT_MISMATCH: _bindgen_ty_1 = 24;
pub const CO2_ERR_CALLBACK: _bindgen_ty_1 = 25;
pub const CO2_ERR_TIMEOUT: _bindgen_ty_1 = 40;
pub const CO2_MEMBERSHIP_CHANGED: _bindgen_ty_1 = 50;
pub const CO2_LEFT: _bindgen_ty_1 = 51;
pub const CO2_ERR_PEER_LOST: _bindgen_ty_1 = 100;
pub const CO2_ERR_PEER_TIMEOUT: _bindgen_ty_1 = 101;
pub const CO2_ERR_COLLECTIVE_MISMATCH: _bindgen_ty_1 = 102;
pub const CO2_ERR_ABORTED: _bindgen_ty_1 = 103;
pub const CO2_ERR_TRANSPORT: _bindgen_ty_1 = 104;
pub const CO2_ERR_RENDEZVOUS: _bindgen_ty_1 = 105;
pub const CO2_ERR_INTERNAL: _bindgen_ty_1 = 199;
pub type _bindgen_ty_1 = ::std::os::raw::c_uint;
extern "C" {
    pub fn co2_status_string(status: co2_status_t) -> *const ::std::os::raw::c_char;
}
extern "C" {
    pub fn co2_last_error_message() -> *const ::std::os::raw::c_char;
}
extern "C" {
    pub fn co2_get_version(
        major: *mut ::std::os::raw::c_int,
        minor: *mut ::std::os::raw::c_int,
        patch: *mut ::std::os::raw::c_int,
    ) -> co2_status_t;
}
pub type co2_dtype_t = i32;
pub const CO2_DTYPE_FP32: _bindgen_ty_2 = 0;
pub const CO2_DTYPE_BF16: _bindgen_ty_2 = 1;
pub const CO2_DTYPE_FP16: _bindgen_ty_2 = 2;
pub const CO2_DTYPE_FP64: _bindgen_ty_2 = 3;
pub const CO2_DTYPE_INT32: _bindgen_ty_2 = 4;
pub const CO2_DTYPE_INT64: _bindgen_ty_2 = 5;
pub type _bindgen_ty_2 = ::std::os::raw::c_uint;
pub type co2_device_kind_t = i32;
pub const CO2_DEVICE_HOST: _bindgen_ty_3 = 0;
pub const CO2_DEVICE_CUDA: _bindgen_ty_3 = 1;
pub type _bindgen_ty_3 = ::std::os::raw::c_uint;
pub type co2_reduce_op_t = i32;
pub const CO2_REDUCE_SUM: _bindgen_ty_4 = 0;
pub const CO2_REDUCE_AVG: _bindgen_ty_4 = 1;
pub const CO2_REDUCE_MIN: _bindgen_ty_4 = 2;
pub const CO2_REDUCE_MAX: _bindgen_ty_4 = 3;
pub type _bindgen_ty_4 = ::std::os::raw::c_uint;
pub type co2_transport_kind_t = i32;
pub const CO2_TRANSPORT_AUTO: _bindgen_ty_5 = 0;
pub const CO2_TRANSPORT_LOCAL: _bindgen_ty_5 = 1;
pub const CO2_TRANSPORT_UCX: _bindgen_ty_5 = 2;
pub const CO2_TRANSPORT_NCCL: _bindgen_ty_5 = 3;
pub type _bindgen_ty_5 = ::std::os::raw::c_uint;
pub type co2_algorithm_t = i32;
pub const CO2_ALGO_CO2: _bindgen_ty_6 = 0;
pub const CO2_ALGO_SYNC: _bindgen_ty_6 = 1;
pub const CO2_ALGO_LOCALSGD: _bindgen_ty_6 = 2;
pub const CO2_ALGO_DILOCO: _bindgen_ty_6 = 3;
pub type _bindgen_ty_6 = ::std::os::raw::c_uint;
pub type co2_penalty_t = i32;
pub const CO2_PENALTY_NONE: _bindgen_ty_7 = 0;
pub const CO2_PENALTY_CONSTANT: _bindgen_ty_7 = 1;
pub const CO2_PENALTY_GAP: _bindgen_ty_7 = 2;
pub type _bindgen_ty_7 = ::std::os::raw::c_uint;
pub type co2_clip_t = i32;
pub const CO2_CLIP_NONE: _bindgen_ty_8 = 0;
pub const CO2_CLIP_VALUE: _bindgen_ty_8 = 1;
pub const CO2_CLIP_NORM: _bindgen_ty_8 = 2;
pub type _bindgen_ty_8 = ::std::os::raw::c_uint;
pub type co2_tensor_role_t = i32;
pub const CO2_ROLE_PARAMETER: _bindgen_ty_9 = 0;
pub const CO2_ROLE_BUFFER: _bindgen_ty_9 = 1;
pub const CO2_ROLE_EXCLUDED: _bindgen_ty_9 = 2;
pub type _bindgen_ty_9 = ::std::os::raw::c_uint;
pub type co2_param_t = i32;
pub const CO2_PARAM_OUTER_LR: _bindgen_ty_10 = 0;
pub const CO2_PARAM_OUTER_MOMENTUM: _bindgen_ty_10 = 1;
pub const CO2_PARAM_TAU: _bindgen_ty_10 = 2;
pub const CO2_PARAM_CLIP_THRESHOLD: _bindgen_ty_10 = 3;
pub const CO2_PARAM_PENALTY_CONSTANT: _bindgen_ty_10 = 4;
pub const CO2_PARAM_INNER_LR: _bindgen_ty_10 = 5;
pub const CO2_PARAM_ANCHOR_CHECK_INTERVAL: _bindgen_ty_10 = 6;
pub type _bindgen_ty_10 = ::std::os::raw::c_uint;
pub type co2_consensus_t = i32;
pub const CO2_CONSENSUS_ANCHOR: _bindgen_ty_11 = 0;
pub const CO2_CONSENSUS_LOCAL_AVERAGE: _bindgen_ty_11 = 1;
pub type _bindgen_ty_11 = ::std::os::raw::c_uint;
pub type co2_wire_format_t = i32;
pub const CO2_WIRE_FP32: _bindgen_ty_12 = 0;
pub const CO2_WIRE_BF16: _bindgen_ty_12 = 1;
pub const CO2_WIRE_INT8: _bindgen_ty_12 = 2;
pub const CO2_WIRE_FP4: _bindgen_ty_12 = 3;
pub type _bindgen_ty_12 = ::std::os::raw::c_uint;
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct co2_comm {
    _unused: [u8; 0],
}
pub type co2_comm_t = *mut co2_comm;
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct co2_engine {
    _unused: [u8; 0],
}
pub type co2_engine_t = *mut co2_engine;
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct co2_request {
    _unused: [u8; 0],
}
pub type co2_request_t = *mut co2_request;
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct co2_comm_config {
    pub size: usize,
    pub version: u32,
    pub transport: co2_transport_kind_t,
    pub rank: i32,
    pub world_size: i32,
    pub group_name: *const ::std::os::raw::c_char,
    pub timeout_ms: u32,
    pub reserved0: u32,
    pub chunk_bytes: u64,
    pub device_index: i32,
    pub reserved1: u32,
    pub node_id: i32,
    pub reserved2: u32,
    pub connections_per_peer: u32,
    pub reserved3: u32,
    pub elastic_min_ranks: i32,
    pub reserved4: u32,
}
#[test]
fn bindgen_test_layout_co2_comm_config() {
    assert_eq!(
        ::std::mem::size_of::<co2_comm_config>(),
        80usize,
        concat!("Size of: ", stringify!(co2_comm_config))
    );
    assert_eq!(
        ::std::mem::align_of::<co2_comm_config>(),
        8usize,
        concat!("Alignment of ", stringify!(co2_comm_config))
    );
    fn test_field_size() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).size) as usize - ptr as usize
            },
            0usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(size)
            )
        );
    }
    test_field_size();
    fn test_field_version() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).version) as usize - ptr as usize
            },
            8usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(version)
            )
        );
    }
    test_field_version();
    fn test_field_transport() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).transport) as usize - ptr as usize
            },
            12usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(transport)
            )
        );
    }
    test_field_transport();
    fn test_field_rank() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).rank) as usize - ptr as usize
            },
            16usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(rank)
            )
        );
    }
    test_field_rank();
    fn test_field_world_size() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).world_size) as usize - ptr as usize
            },
            20usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(world_size)
            )
        );
    }
    test_field_world_size();
    fn test_field_group_name() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).group_name) as usize - ptr as usize
            },
            24usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(group_name)
            )
        );
    }
    test_field_group_name();
    fn test_field_timeout_ms() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).timeout_ms) as usize - ptr as usize
            },
            32usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(timeout_ms)
            )
        );
    }
    test_field_timeout_ms();
    fn test_field_reserved0() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).reserved0) as usize - ptr as usize
            },
            36usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(reserved0)
            )
        );
    }
    test_field_reserved0();
    fn test_field_chunk_bytes() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).chunk_bytes) as usize - ptr as usize
            },
            40usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(chunk_bytes)
            )
        );
    }
    test_field_chunk_bytes();
    fn test_field_device_index() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).device_index) as usize - ptr as usize
            },
            48usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(device_index)
            )
        );
    }
    test_field_device_index();
    fn test_field_reserved1() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).reserved1) as usize - ptr as usize
            },
            52usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(reserved1)
            )
        );
    }
    test_field_reserved1();
    fn test_field_node_id() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).node_id) as usize - ptr as usize
            },
            56usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(node_id)
            )
        );
    }
    test_field_node_id();
    fn test_field_reserved2() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).reserved2) as usize - ptr as usize
            },
            60usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(reserved2)
            )
        );
    }
    test_field_reserved2();
    fn test_field_connections_per_peer() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).connections_per_peer) as usize - ptr as usize
            },
            64usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(connections_per_peer)
            )
        );
    }
    test_field_connections_per_peer();
    fn test_field_reserved3() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).reserved3) as usize - ptr as usize
            },
            68usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(reserved3)
            )
        );
    }
    test_field_reserved3();
    fn test_field_elastic_min_ranks() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).elastic_min_ranks) as usize - ptr as usize
            },
            72usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(elastic_min_ranks)
            )
        );
    }
    test_field_elastic_min_ranks();
    fn test_field_reserved4() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_comm_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).reserved4) as usize - ptr as usize
            },
            76usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_comm_config),
                "::",
                stringify!(reserved4)
            )
        );
    }
    test_field_reserved4();
}
pub type co2_comm_config_t = co2_comm_config;
extern "C" {
    pub fn co2_comm_config_init(config: *mut co2_comm_config_t) -> co2_status_t;
}
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct co2_unique_id {
    pub internal: [::std::os::raw::c_char; 128usize],
}
#[test]
fn bindgen_test_layout_co2_unique_id() {
    assert_eq!(
        ::std::mem::size_of::<co2_unique_id>(),
        128usize,
        concat!("Size of: ", stringify!(co2_unique_id))
    );
    assert_eq!(
        ::std::mem::align_of::<co2_unique_id>(),
        1usize,
        concat!("Alignment of ", stringify!(co2_unique_id))
    );
    fn test_field_internal() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_unique_id>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).internal) as usize - ptr as usize
            },
            0usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_unique_id),
                "::",
                stringify!(internal)
            )
        );
    }
    test_field_internal();
}
pub type co2_unique_id_t = co2_unique_id;
extern "C" {
    pub fn co2_get_unique_id(out_id: *mut co2_unique_id_t) -> co2_status_t;
}
extern "C" {
    pub fn co2_comm_create(
        config: *const co2_comm_config_t,
        out_comm: *mut co2_comm_t,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_comm_create_with_id(
        config: *const co2_comm_config_t,
        id: *const co2_unique_id_t,
        rank: i32,
        world_size: i32,
        out_comm: *mut co2_comm_t,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_comm_split(
        parent: co2_comm_t,
        color: i32,
        key: i32,
        config: *const co2_comm_config_t,
        out_comm: *mut co2_comm_t,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_comm_split_nodes(
        parent: co2_comm_t,
        config: *const co2_comm_config_t,
        intra_node: *mut co2_comm_t,
        inter_node: *mut co2_comm_t,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_comm_rank(comm: co2_comm_t, out_rank: *mut i32) -> co2_status_t;
}
extern "C" {
    pub fn co2_comm_size(comm: co2_comm_t, out_size: *mut i32) -> co2_status_t;
}
extern "C" {
    pub fn co2_comm_abort(comm: co2_comm_t) -> co2_status_t;
}
extern "C" {
    pub fn co2_comm_destroy(comm: co2_comm_t) -> co2_status_t;
}
extern "C" {
    pub fn co2_allreduce(
        comm: co2_comm_t,
        buffer: *mut ::std::os::raw::c_void,
        count: usize,
        dtype: co2_dtype_t,
        op: co2_reduce_op_t,
        stream: *mut ::std::os::raw::c_void,
        out_request: *mut co2_request_t,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_broadcast(
        comm: co2_comm_t,
        buffer: *mut ::std::os::raw::c_void,
        count: usize,
        dtype: co2_dtype_t,
        root: i32,
        stream: *mut ::std::os::raw::c_void,
        out_request: *mut co2_request_t,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_request_test(
        request: co2_request_t,
        out_done: *mut ::std::os::raw::c_int,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_request_wait(request: co2_request_t, timeout_ms: i64) -> co2_status_t;
}
extern "C" {
    pub fn co2_request_free(request: co2_request_t) -> co2_status_t;
}
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct co2_engine_config {
    pub size: usize,
    pub version: u32,
    pub algorithm: co2_algorithm_t,
    pub tau: u32,
    pub warmup_sync_rounds: u32,
    pub outer_lr: f64,
    pub outer_momentum: f64,
    pub nesterov: i32,
    pub penalty: co2_penalty_t,
    pub penalty_constant: f64,
    pub clip: co2_clip_t,
    pub anchor_check_interval: u32,
    pub clip_threshold: f64,
    pub inner_lr: f64,
    pub state_dtype: co2_dtype_t,
    pub reserved0: i32,
    pub eager: i32,
    pub reserved1: i32,
    pub wire_format: co2_wire_format_t,
    pub error_feedback: i32,
    pub shard_outer_state: i32,
    pub hierarchy: i32,
    pub apply_step: i32,
    pub reserved2: i32,
}
#[test]
fn bindgen_test_layout_co2_engine_config() {
    assert_eq!(
        ::std::mem::size_of::<co2_engine_config>(),
        120usize,
        concat!("Size of: ", stringify!(co2_engine_config))
    );
    assert_eq!(
        ::std::mem::align_of::<co2_engine_config>(),
        8usize,
        concat!("Alignment of ", stringify!(co2_engine_config))
    );
    fn test_field_size() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).size) as usize - ptr as usize
            },
            0usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(size)
            )
        );
    }
    test_field_size();
    fn test_field_version() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).version) as usize - ptr as usize
            },
            8usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(version)
            )
        );
    }
    test_field_version();
    fn test_field_algorithm() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).algorithm) as usize - ptr as usize
            },
            12usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(algorithm)
            )
        );
    }
    test_field_algorithm();
    fn test_field_tau() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).tau) as usize - ptr as usize
            },
            16usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(tau)
            )
        );
    }
    test_field_tau();
    fn test_field_warmup_sync_rounds() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).warmup_sync_rounds) as usize - ptr as usize
            },
            20usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(warmup_sync_rounds)
            )
        );
    }
    test_field_warmup_sync_rounds();
    fn test_field_outer_lr() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).outer_lr) as usize - ptr as usize
            },
            24usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(outer_lr)
            )
        );
    }
    test_field_outer_lr();
    fn test_field_outer_momentum() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).outer_momentum) as usize - ptr as usize
            },
            32usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(outer_momentum)
            )
        );
    }
    test_field_outer_momentum();
    fn test_field_nesterov() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).nesterov) as usize - ptr as usize
            },
            40usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(nesterov)
            )
        );
    }
    test_field_nesterov();
    fn test_field_penalty() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).penalty) as usize - ptr as usize
            },
            44usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(penalty)
            )
        );
    }
    test_field_penalty();
    fn test_field_penalty_constant() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).penalty_constant) as usize - ptr as usize
            },
            48usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(penalty_constant)
            )
        );
    }
    test_field_penalty_constant();
    fn test_field_clip() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).clip) as usize - ptr as usize
            },
            56usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(clip)
            )
        );
    }
    test_field_clip();
    fn test_field_anchor_check_interval() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).anchor_check_interval) as usize - ptr as usize
            },
            60usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(anchor_check_interval)
            )
        );
    }
    test_field_anchor_check_interval();
    fn test_field_clip_threshold() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).clip_threshold) as usize - ptr as usize
            },
            64usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(clip_threshold)
            )
        );
    }
    test_field_clip_threshold();
    fn test_field_inner_lr() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).inner_lr) as usize - ptr as usize
            },
            72usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(inner_lr)
            )
        );
    }
    test_field_inner_lr();
    fn test_field_state_dtype() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).state_dtype) as usize - ptr as usize
            },
            80usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(state_dtype)
            )
        );
    }
    test_field_state_dtype();
    fn test_field_reserved0() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).reserved0) as usize - ptr as usize
            },
            84usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(reserved0)
            )
        );
    }
    test_field_reserved0();
    fn test_field_eager() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).eager) as usize - ptr as usize
            },
            88usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(eager)
            )
        );
    }
    test_field_eager();
    fn test_field_reserved1() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).reserved1) as usize - ptr as usize
            },
            92usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(reserved1)
            )
        );
    }
    test_field_reserved1();
    fn test_field_wire_format() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).wire_format) as usize - ptr as usize
            },
            96usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(wire_format)
            )
        );
    }
    test_field_wire_format();
    fn test_field_error_feedback() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).error_feedback) as usize - ptr as usize
            },
            100usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(error_feedback)
            )
        );
    }
    test_field_error_feedback();
    fn test_field_shard_outer_state() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).shard_outer_state) as usize - ptr as usize
            },
            104usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(shard_outer_state)
            )
        );
    }
    test_field_shard_outer_state();
    fn test_field_hierarchy() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).hierarchy) as usize - ptr as usize
            },
            108usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(hierarchy)
            )
        );
    }
    test_field_hierarchy();
    fn test_field_apply_step() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).apply_step) as usize - ptr as usize
            },
            112usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(apply_step)
            )
        );
    }
    test_field_apply_step();
    fn test_field_reserved2() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_config>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).reserved2) as usize - ptr as usize
            },
            116usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_config),
                "::",
                stringify!(reserved2)
            )
        );
    }
    test_field_reserved2();
}
pub type co2_engine_config_t = co2_engine_config;
extern "C" {
    pub fn co2_engine_config_init(config: *mut co2_engine_config_t) -> co2_status_t;
}
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct co2_tensor {
    pub size: usize,
    pub name: *const ::std::os::raw::c_char,
    pub data: *mut ::std::os::raw::c_void,
    pub count: usize,
    pub dtype: co2_dtype_t,
    pub device: co2_device_kind_t,
    pub device_index: i32,
    pub role: co2_tensor_role_t,
}
#[test]
fn bindgen_test_layout_co2_tensor() {
    assert_eq!(
        ::std::mem::size_of::<co2_tensor>(),
        48usize,
        concat!("Size of: ", stringify!(co2_tensor))
    );
    assert_eq!(
        ::std::mem::align_of::<co2_tensor>(),
        8usize,
        concat!("Alignment of ", stringify!(co2_tensor))
    );
    fn test_field_size() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_tensor>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).size) as usize - ptr as usize
            },
            0usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_tensor),
                "::",
                stringify!(size)
            )
        );
    }
    test_field_size();
    fn test_field_name() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_tensor>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).name) as usize - ptr as usize
            },
            8usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_tensor),
                "::",
                stringify!(name)
            )
        );
    }
    test_field_name();
    fn test_field_data() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_tensor>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).data) as usize - ptr as usize
            },
            16usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_tensor),
                "::",
                stringify!(data)
            )
        );
    }
    test_field_data();
    fn test_field_count() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_tensor>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).count) as usize - ptr as usize
            },
            24usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_tensor),
                "::",
                stringify!(count)
            )
        );
    }
    test_field_count();
    fn test_field_dtype() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_tensor>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).dtype) as usize - ptr as usize
            },
            32usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_tensor),
                "::",
                stringify!(dtype)
            )
        );
    }
    test_field_dtype();
    fn test_field_device() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_tensor>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).device) as usize - ptr as usize
            },
            36usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_tensor),
                "::",
                stringify!(device)
            )
        );
    }
    test_field_device();
    fn test_field_device_index() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_tensor>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).device_index) as usize - ptr as usize
            },
            40usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_tensor),
                "::",
                stringify!(device_index)
            )
        );
    }
    test_field_device_index();
    fn test_field_role() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_tensor>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).role) as usize - ptr as usize
            },
            44usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_tensor),
                "::",
                stringify!(role)
            )
        );
    }
    test_field_role();
}
pub type co2_tensor_t = co2_tensor;
extern "C" {
    pub fn co2_tensor_init(tensor: *mut co2_tensor_t) -> co2_status_t;
}
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct co2_segment {
    pub size: usize,
    pub name: *const ::std::os::raw::c_char,
    pub offset: usize,
    pub count: usize,
    pub role: co2_tensor_role_t,
    pub reserved0: i32,
}
#[test]
fn bindgen_test_layout_co2_segment() {
    assert_eq!(
        ::std::mem::size_of::<co2_segment>(),
        40usize,
        concat!("Size of: ", stringify!(co2_segment))
    );
    assert_eq!(
        ::std::mem::align_of::<co2_segment>(),
        8usize,
        concat!("Alignment of ", stringify!(co2_segment))
    );
    fn test_field_size() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_segment>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).size) as usize - ptr as usize
            },
            0usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_segment),
                "::",
                stringify!(size)
            )
        );
    }
    test_field_size();
    fn test_field_name() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_segment>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).name) as usize - ptr as usize
            },
            8usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_segment),
                "::",
                stringify!(name)
            )
        );
    }
    test_field_name();
    fn test_field_offset() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_segment>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).offset) as usize - ptr as usize
            },
            16usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_segment),
                "::",
                stringify!(offset)
            )
        );
    }
    test_field_offset();
    fn test_field_count() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_segment>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).count) as usize - ptr as usize
            },
            24usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_segment),
                "::",
                stringify!(count)
            )
        );
    }
    test_field_count();
    fn test_field_role() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_segment>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).role) as usize - ptr as usize
            },
            32usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_segment),
                "::",
                stringify!(role)
            )
        );
    }
    test_field_role();
    fn test_field_reserved0() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_segment>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).reserved0) as usize - ptr as usize
            },
            36usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_segment),
                "::",
                stringify!(reserved0)
            )
        );
    }
    test_field_reserved0();
}
pub type co2_segment_t = co2_segment;
extern "C" {
    pub fn co2_segment_init(segment: *mut co2_segment_t) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_create(
        comm: co2_comm_t,
        config: *const co2_engine_config_t,
        out_engine: *mut co2_engine_t,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_destroy(engine: co2_engine_t) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_register_tensor(
        engine: co2_engine_t,
        tensor: *const co2_tensor_t,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_alloc_flat(
        engine: co2_engine_t,
        count: usize,
        dtype: co2_dtype_t,
        device: co2_device_kind_t,
        device_index: i32,
        out_data: *mut *mut ::std::os::raw::c_void,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_adopt_flat(
        engine: co2_engine_t,
        data: *mut ::std::os::raw::c_void,
        count: usize,
        dtype: co2_dtype_t,
        device: co2_device_kind_t,
        device_index: i32,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_add_segment(
        engine: co2_engine_t,
        segment: *const co2_segment_t,
    ) -> co2_status_t;
}
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct co2_allocator {
    pub size: usize,
    pub user: *mut ::std::os::raw::c_void,
    pub allocate: ::std::option::Option<
        unsafe extern "C" fn(
            user: *mut ::std::os::raw::c_void,
            bytes: usize,
            device_index: i32,
            stream: *mut ::std::os::raw::c_void,
        ) -> *mut ::std::os::raw::c_void,
    >,
    pub release: ::std::option::Option<
        unsafe extern "C" fn(
            user: *mut ::std::os::raw::c_void,
            ptr: *mut ::std::os::raw::c_void,
            bytes: usize,
            device_index: i32,
            stream: *mut ::std::os::raw::c_void,
        ),
    >,
}
#[test]
fn bindgen_test_layout_co2_allocator() {
    assert_eq!(
        ::std::mem::size_of::<co2_allocator>(),
        32usize,
        concat!("Size of: ", stringify!(co2_allocator))
    );
    assert_eq!(
        ::std::mem::align_of::<co2_allocator>(),
        8usize,
        concat!("Alignment of ", stringify!(co2_allocator))
    );
    fn test_field_size() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_allocator>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).size) as usize - ptr as usize
            },
            0usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_allocator),
                "::",
                stringify!(size)
            )
        );
    }
    test_field_size();
    fn test_field_user() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_allocator>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).user) as usize - ptr as usize
            },
            8usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_allocator),
                "::",
                stringify!(user)
            )
        );
    }
    test_field_user();
    fn test_field_allocate() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_allocator>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).allocate) as usize - ptr as usize
            },
            16usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_allocator),
                "::",
                stringify!(allocate)
            )
        );
    }
    test_field_allocate();
    fn test_field_release() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_allocator>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).release) as usize - ptr as usize
            },
            24usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_allocator),
                "::",
                stringify!(release)
            )
        );
    }
    test_field_release();
}
pub type co2_allocator_t = co2_allocator;
extern "C" {
    pub fn co2_engine_set_allocator(
        engine: co2_engine_t,
        allocator: *const co2_allocator_t,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_commit(engine: co2_engine_t) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_step(
        engine: co2_engine_t,
        stream: *mut ::std::os::raw::c_void,
        out_boundary: *mut ::std::os::raw::c_int,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_reduce_gradients(
        engine: co2_engine_t,
        grads: *const *mut ::std::os::raw::c_void,
        num_grads: usize,
        stream: *mut ::std::os::raw::c_void,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_synchronize(engine: co2_engine_t) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_finalize(engine: co2_engine_t) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_leave(engine: co2_engine_t) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_consensus(
        engine: co2_engine_t,
        kind: co2_consensus_t,
        out: *mut f32,
        count: usize,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_num_elements(engine: co2_engine_t, out_count: *mut usize) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_set_param(engine: co2_engine_t, key: co2_param_t, value: f64)
        -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_get_param(
        engine: co2_engine_t,
        key: co2_param_t,
        out_value: *mut f64,
    ) -> co2_status_t;
}
#[repr(C)]
#[derive(Debug, Copy, Clone)]
pub struct co2_engine_stats {
    pub size: usize,
    pub version: u32,
    pub world_size: i32,
    pub steps: u64,
    pub rounds: u64,
    pub outer_updates: u64,
    pub bytes_reduced: u64,
    pub collective_ns: u64,
    pub boundary_wait_ns: u64,
    pub last_boundary_wait_ns: u64,
    pub nonfinite_rounds: u64,
    pub nonfinite_local: u64,
    pub anchor_checks: u64,
    pub resolved_outer_momentum: f64,
    pub last_penalty_min: f64,
    pub last_penalty_max: f64,
    pub last_clip_scale_min: f64,
    pub last_clip_fraction: f64,
    pub step_time_ns: u64,
    pub allreduce_time_ns: u64,
    pub advised_tau: u32,
    pub reserved0: u32,
    pub last_collective_ns: u64,
    pub last_round_ns: u64,
    pub hidden_fraction: f64,
    pub last_hidden_fraction: f64,
    pub rank_step_time_ns: u64,
    pub rank_allreduce_time_ns: u64,
    pub wire_bytes_last_round: u64,
    pub wire_bytes_total: u64,
    pub outer_state_bytes: u64,
    pub arrival_updates: u64,
    pub last_apply_step: u32,
    pub reserved1: u32,
}
#[test]
fn bindgen_test_layout_co2_engine_stats() {
    assert_eq!(
        ::std::mem::size_of::<co2_engine_stats>(),
        248usize,
        concat!("Size of: ", stringify!(co2_engine_stats))
    );
    assert_eq!(
        ::std::mem::align_of::<co2_engine_stats>(),
        8usize,
        concat!("Alignment of ", stringify!(co2_engine_stats))
    );
    fn test_field_size() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).size) as usize - ptr as usize
            },
            0usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(size)
            )
        );
    }
    test_field_size();
    fn test_field_version() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).version) as usize - ptr as usize
            },
            8usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(version)
            )
        );
    }
    test_field_version();
    fn test_field_world_size() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).world_size) as usize - ptr as usize
            },
            12usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(world_size)
            )
        );
    }
    test_field_world_size();
    fn test_field_steps() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).steps) as usize - ptr as usize
            },
            16usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(steps)
            )
        );
    }
    test_field_steps();
    fn test_field_rounds() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).rounds) as usize - ptr as usize
            },
            24usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(rounds)
            )
        );
    }
    test_field_rounds();
    fn test_field_outer_updates() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).outer_updates) as usize - ptr as usize
            },
            32usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(outer_updates)
            )
        );
    }
    test_field_outer_updates();
    fn test_field_bytes_reduced() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).bytes_reduced) as usize - ptr as usize
            },
            40usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(bytes_reduced)
            )
        );
    }
    test_field_bytes_reduced();
    fn test_field_collective_ns() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).collective_ns) as usize - ptr as usize
            },
            48usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(collective_ns)
            )
        );
    }
    test_field_collective_ns();
    fn test_field_boundary_wait_ns() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).boundary_wait_ns) as usize - ptr as usize
            },
            56usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(boundary_wait_ns)
            )
        );
    }
    test_field_boundary_wait_ns();
    fn test_field_last_boundary_wait_ns() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).last_boundary_wait_ns) as usize - ptr as usize
            },
            64usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(last_boundary_wait_ns)
            )
        );
    }
    test_field_last_boundary_wait_ns();
    fn test_field_nonfinite_rounds() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).nonfinite_rounds) as usize - ptr as usize
            },
            72usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(nonfinite_rounds)
            )
        );
    }
    test_field_nonfinite_rounds();
    fn test_field_nonfinite_local() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).nonfinite_local) as usize - ptr as usize
            },
            80usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(nonfinite_local)
            )
        );
    }
    test_field_nonfinite_local();
    fn test_field_anchor_checks() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).anchor_checks) as usize - ptr as usize
            },
            88usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(anchor_checks)
            )
        );
    }
    test_field_anchor_checks();
    fn test_field_resolved_outer_momentum() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).resolved_outer_momentum) as usize - ptr as usize
            },
            96usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(resolved_outer_momentum)
            )
        );
    }
    test_field_resolved_outer_momentum();
    fn test_field_last_penalty_min() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).last_penalty_min) as usize - ptr as usize
            },
            104usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(last_penalty_min)
            )
        );
    }
    test_field_last_penalty_min();
    fn test_field_last_penalty_max() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).last_penalty_max) as usize - ptr as usize
            },
            112usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(last_penalty_max)
            )
        );
    }
    test_field_last_penalty_max();
    fn test_field_last_clip_scale_min() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).last_clip_scale_min) as usize - ptr as usize
            },
            120usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(last_clip_scale_min)
            )
        );
    }
    test_field_last_clip_scale_min();
    fn test_field_last_clip_fraction() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).last_clip_fraction) as usize - ptr as usize
            },
            128usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(last_clip_fraction)
            )
        );
    }
    test_field_last_clip_fraction();
    fn test_field_step_time_ns() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).step_time_ns) as usize - ptr as usize
            },
            136usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(step_time_ns)
            )
        );
    }
    test_field_step_time_ns();
    fn test_field_allreduce_time_ns() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).allreduce_time_ns) as usize - ptr as usize
            },
            144usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(allreduce_time_ns)
            )
        );
    }
    test_field_allreduce_time_ns();
    fn test_field_advised_tau() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).advised_tau) as usize - ptr as usize
            },
            152usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(advised_tau)
            )
        );
    }
    test_field_advised_tau();
    fn test_field_reserved0() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).reserved0) as usize - ptr as usize
            },
            156usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(reserved0)
            )
        );
    }
    test_field_reserved0();
    fn test_field_last_collective_ns() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).last_collective_ns) as usize - ptr as usize
            },
            160usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(last_collective_ns)
            )
        );
    }
    test_field_last_collective_ns();
    fn test_field_last_round_ns() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).last_round_ns) as usize - ptr as usize
            },
            168usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(last_round_ns)
            )
        );
    }
    test_field_last_round_ns();
    fn test_field_hidden_fraction() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).hidden_fraction) as usize - ptr as usize
            },
            176usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(hidden_fraction)
            )
        );
    }
    test_field_hidden_fraction();
    fn test_field_last_hidden_fraction() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).last_hidden_fraction) as usize - ptr as usize
            },
            184usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(last_hidden_fraction)
            )
        );
    }
    test_field_last_hidden_fraction();
    fn test_field_rank_step_time_ns() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).rank_step_time_ns) as usize - ptr as usize
            },
            192usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(rank_step_time_ns)
            )
        );
    }
    test_field_rank_step_time_ns();
    fn test_field_rank_allreduce_time_ns() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).rank_allreduce_time_ns) as usize - ptr as usize
            },
            200usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(rank_allreduce_time_ns)
            )
        );
    }
    test_field_rank_allreduce_time_ns();
    fn test_field_wire_bytes_last_round() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).wire_bytes_last_round) as usize - ptr as usize
            },
            208usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(wire_bytes_last_round)
            )
        );
    }
    test_field_wire_bytes_last_round();
    fn test_field_wire_bytes_total() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).wire_bytes_total) as usize - ptr as usize
            },
            216usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(wire_bytes_total)
            )
        );
    }
    test_field_wire_bytes_total();
    fn test_field_outer_state_bytes() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).outer_state_bytes) as usize - ptr as usize
            },
            224usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(outer_state_bytes)
            )
        );
    }
    test_field_outer_state_bytes();
    fn test_field_arrival_updates() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).arrival_updates) as usize - ptr as usize
            },
            232usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(arrival_updates)
            )
        );
    }
    test_field_arrival_updates();
    fn test_field_last_apply_step() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).last_apply_step) as usize - ptr as usize
            },
            240usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(last_apply_step)
            )
        );
    }
    test_field_last_apply_step();
    fn test_field_reserved1() {
        assert_eq!(
            unsafe {
                let uninit = ::std::mem::MaybeUninit::<co2_engine_stats>::uninit();
                let ptr = uninit.as_ptr();
                ::std::ptr::addr_of!((*ptr).reserved1) as usize - ptr as usize
            },
            244usize,
            concat!(
                "Offset of field: ",
                stringify!(co2_engine_stats),
                "::",
                stringify!(reserved1)
            )
        );
    }
    test_field_reserved1();
}
pub type co2_engine_stats_t = co2_engine_stats;
extern "C" {
    pub fn co2_engine_stats_init(stats: *mut co2_engine_stats_t) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_get_stats(
        engine: co2_engine_t,
        out_stats: *mut co2_engine_stats_t,
    ) -> co2_status_t;
}
pub type co2_write_fn = ::std::option::Option<
    unsafe extern "C" fn(
        user: *mut ::std::os::raw::c_void,
        data: *const ::std::os::raw::c_void,
        length: usize,
    ) -> ::std::os::raw::c_int,
>;
pub type co2_read_fn = ::std::option::Option<
    unsafe extern "C" fn(
        user: *mut ::std::os::raw::c_void,
        data: *mut ::std::os::raw::c_void,
        length: usize,
    ) -> ::std::os::raw::c_int,
>;
extern "C" {
    pub fn co2_engine_save(
        engine: co2_engine_t,
        write: co2_write_fn,
        user: *mut ::std::os::raw::c_void,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_state_size(engine: co2_engine_t, out_bytes: *mut usize) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_save_portable(
        engine: co2_engine_t,
        write: co2_write_fn,
        user: *mut ::std::os::raw::c_void,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_portable_state_size(
        engine: co2_engine_t,
        out_bytes: *mut usize,
    ) -> co2_status_t;
}
extern "C" {
    pub fn co2_engine_load(
        engine: co2_engine_t,
        read: co2_read_fn,
        user: *mut ::std::os::raw::c_void,
    ) -> co2_status_t;
}
