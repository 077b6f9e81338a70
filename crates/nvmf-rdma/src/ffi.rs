//! The C side: the few rdma-core (libibverbs 1.x, librdmacm 1.x) structures and entry points this
//! crate uses, declared by hand from the stable ABI of rdma-core's public headers, and the
//! table of functions resolved with `dlopen` at run time. Only the leading fields a caller of
//! the public API reads are declared for objects the libraries allocate (`ibv_context`,
//! `ibv_qp`, `rdma_cm_id`, ...); structures this crate fills in itself are complete, and their
//! sizes and offsets are pinned by the const assertions at the bottom (checked against
//! rdma-core 44's headers with `offsetof`). `ibv_post_send`, `ibv_post_recv`, `ibv_poll_cq`,
//! `ibv_req_notify_cq`, `ibv_alloc_mw` and `ibv_dealloc_mw` are inline functions in the C
//! header that call through the device's ops table (as does `ibv_post_srq_recv`); [`ops`]
//! does the same.

#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_int, c_void};

// ---- libibverbs ----

pub const IBV_QPT_RC: u32 = 2;
pub const IBV_MW_TYPE_2: u32 = 2;

pub const IBV_WR_RDMA_WRITE: u32 = 0;
pub const IBV_WR_SEND: u32 = 2;
pub const IBV_WR_RDMA_READ: u32 = 4;
pub const IBV_WR_BIND_MW: u32 = 8;
pub const IBV_WR_SEND_WITH_INV: u32 = 9;

pub const IBV_SEND_SIGNALED: u32 = 1 << 1;
pub const IBV_SEND_INLINE: u32 = 1 << 3;

pub const IBV_WC_WITH_INV: u32 = 1 << 3;
/// `IBV_WC_IP_CSUM_OK` in user space, but the kernel's `IB_WC_WITH_INVALIDATE`: soft-RoCE
/// (rdma_rxe) copies its kernel flags into user completions as they are.
pub const IBV_WC_IP_CSUM_OK_OR_KERNEL_INV: u32 = 1 << 2;

pub const IBV_ACCESS_LOCAL_WRITE: u32 = 1;
pub const IBV_ACCESS_REMOTE_WRITE: u32 = 1 << 1;
pub const IBV_ACCESS_REMOTE_READ: u32 = 1 << 2;
pub const IBV_ACCESS_MW_BIND: u32 = 1 << 4;

/// `struct ibv_context_ops`, the part up to `post_recv` (entries this crate does not call are
/// opaque pointers).
#[repr(C)]
pub struct ibv_context_ops {
    _compat0: [*mut c_void; 7],
    pub alloc_mw: Option<unsafe extern "C" fn(*mut ibv_pd, u32) -> *mut ibv_mw>,
    _bind_mw: *mut c_void,
    pub dealloc_mw: Option<unsafe extern "C" fn(*mut ibv_mw) -> c_int>,
    _compat_create_cq: *mut c_void,
    pub poll_cq: unsafe extern "C" fn(*mut ibv_cq, c_int, *mut ibv_wc) -> c_int,
    pub req_notify_cq: unsafe extern "C" fn(*mut ibv_cq, c_int) -> c_int,
    _compat1: [*mut c_void; 7],
    pub post_srq_recv:
        unsafe extern "C" fn(*mut ibv_srq, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
    _compat2: [*mut c_void; 4],
    pub post_send:
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_send_wr, *mut *mut ibv_send_wr) -> c_int,
    pub post_recv:
        unsafe extern "C" fn(*mut ibv_qp, *mut ibv_recv_wr, *mut *mut ibv_recv_wr) -> c_int,
}

/// `struct ibv_context` (leading part; allocated by the library).
#[repr(C)]
pub struct ibv_context {
    pub device: *mut c_void,
    pub ops: ibv_context_ops,
    _ops_rest: [*mut c_void; 5],
    pub cmd_fd: c_int,
    pub async_fd: c_int,
}

/// `struct ibv_async_event` (`element` is the union of the affected object's pointer and a
/// port number).
#[repr(C)]
pub struct ibv_async_event {
    pub element: *mut c_void,
    pub event_type: u32,
}

/// `struct ibv_pd` (leading part).
#[repr(C)]
pub struct ibv_pd {
    pub context: *mut ibv_context,
}

/// `struct ibv_cq` (leading part).
#[repr(C)]
pub struct ibv_cq {
    pub context: *mut ibv_context,
}

/// `struct ibv_srq` (leading part).
#[repr(C)]
pub struct ibv_srq {
    pub context: *mut ibv_context,
}

/// `struct ibv_srq_init_attr` (with its `struct ibv_srq_attr`).
#[repr(C)]
pub struct ibv_srq_init_attr {
    pub srq_context: *mut c_void,
    pub max_wr: u32,
    pub max_sge: u32,
    pub srq_limit: u32,
}

/// `struct ibv_comp_channel`.
#[repr(C)]
pub struct ibv_comp_channel {
    pub context: *mut ibv_context,
    pub fd: c_int,
    pub refcnt: c_int,
}

/// `struct ibv_qp` (leading part, through `qp_num`).
#[repr(C)]
pub struct ibv_qp {
    pub context: *mut ibv_context,
    pub qp_context: *mut c_void,
    pub pd: *mut ibv_pd,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut c_void,
    pub handle: u32,
    pub qp_num: u32,
}

/// `struct ibv_mr`.
#[repr(C)]
pub struct ibv_mr {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub addr: *mut c_void,
    pub length: usize,
    pub handle: u32,
    pub lkey: u32,
    pub rkey: u32,
}

/// `struct ibv_mw`.
#[repr(C)]
pub struct ibv_mw {
    pub context: *mut ibv_context,
    pub pd: *mut ibv_pd,
    pub rkey: u32,
    pub handle: u32,
    pub mw_type: u32,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_sge {
    pub addr: u64,
    pub length: u32,
    pub lkey: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_mw_bind_info {
    pub mr: *mut ibv_mr,
    pub addr: u64,
    pub length: u64,
    pub mw_access_flags: u32,
}

/// `struct ibv_send_wr`, with its unions laid out as the variants this crate uses: `rdma`
/// (remote_addr, rkey) in `wr`, and `bind_mw` in the last union.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_send_wr {
    pub wr_id: u64,
    pub next: *mut ibv_send_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
    pub opcode: u32,
    pub send_flags: u32,
    /// `imm_data` / `invalidate_rkey`
    pub invalidate_rkey: u32,
    pub remote_addr: u64,
    pub rkey: u32,
    _wr_rest: [u32; 5],
    _qp_type: u32,
    _pad: u32,
    pub bind_mw: *mut ibv_mw,
    pub bind_rkey: u32,
    _pad2: u32,
    pub bind_info: ibv_mw_bind_info,
}

impl Default for ibv_send_wr {
    fn default() -> Self {
        // SAFETY: all-zero is a valid value for this plain C structure (null pointers, 0s).
        unsafe { std::mem::zeroed() }
    }
}

#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_recv_wr {
    pub wr_id: u64,
    pub next: *mut ibv_recv_wr,
    pub sg_list: *mut ibv_sge,
    pub num_sge: c_int,
}

/// `struct ibv_wc`.
#[repr(C)]
#[derive(Clone, Copy, Default, Debug)]
pub struct ibv_wc {
    pub wr_id: u64,
    pub status: u32,
    pub opcode: u32,
    pub vendor_err: u32,
    pub byte_len: u32,
    /// `imm_data` / `invalidated_rkey`
    pub invalidated_rkey: u32,
    pub qp_num: u32,
    pub src_qp: u32,
    pub wc_flags: u32,
    pub pkey_index: u16,
    pub slid: u16,
    pub sl: u8,
    pub dlid_path_bits: u8,
}

#[repr(C)]
#[derive(Clone, Copy, Default)]
pub struct ibv_qp_cap {
    pub max_send_wr: u32,
    pub max_recv_wr: u32,
    pub max_send_sge: u32,
    pub max_recv_sge: u32,
    pub max_inline_data: u32,
}

#[repr(C)]
pub struct ibv_qp_init_attr {
    pub qp_context: *mut c_void,
    pub send_cq: *mut ibv_cq,
    pub recv_cq: *mut ibv_cq,
    pub srq: *mut ibv_srq,
    pub cap: ibv_qp_cap,
    pub qp_type: u32,
    pub sq_sig_all: c_int,
}

/// `struct ibv_device_attr`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ibv_device_attr {
    pub fw_ver: [c_char; 64],
    pub node_guid: u64,
    pub sys_image_guid: u64,
    pub max_mr_size: u64,
    pub page_size_cap: u64,
    pub vendor_id: u32,
    pub vendor_part_id: u32,
    pub hw_ver: u32,
    pub max_qp: c_int,
    pub max_qp_wr: c_int,
    pub device_cap_flags: u32,
    pub max_sge: c_int,
    pub max_sge_rd: c_int,
    pub max_cq: c_int,
    pub max_cqe: c_int,
    pub max_mr: c_int,
    pub max_pd: c_int,
    pub max_qp_rd_atom: c_int,
    pub max_ee_rd_atom: c_int,
    pub max_res_rd_atom: c_int,
    pub max_qp_init_rd_atom: c_int,
    pub max_ee_init_rd_atom: c_int,
    pub atomic_cap: u32,
    pub max_ee: c_int,
    pub max_rdd: c_int,
    pub max_mw: c_int,
    pub max_raw_ipv6_qp: c_int,
    pub max_raw_ethy_qp: c_int,
    pub max_mcast_grp: c_int,
    pub max_mcast_qp_attach: c_int,
    pub max_total_mcast_qp_attach: c_int,
    pub max_ah: c_int,
    pub max_fmr: c_int,
    pub max_map_per_fmr: c_int,
    pub max_srq: c_int,
    pub max_srq_wr: c_int,
    pub max_srq_sge: c_int,
    pub max_pkeys: u16,
    pub local_ca_ack_delay: u8,
    pub phys_port_cnt: u8,
}

// ---- librdmacm ----

pub const RDMA_PS_TCP: u32 = 0x0106;

/// `struct rdma_event_channel`.
#[repr(C)]
pub struct rdma_event_channel {
    pub fd: c_int,
}

/// `struct rdma_cm_id` (leading part, through the route's source and destination addresses).
#[repr(C)]
pub struct rdma_cm_id {
    pub verbs: *mut ibv_context,
    pub channel: *mut rdma_event_channel,
    pub context: *mut c_void,
    pub qp: *mut ibv_qp,
    /// `route.addr.src_storage`
    pub src_addr: libc::sockaddr_storage,
    /// `route.addr.dst_storage`
    pub dst_addr: libc::sockaddr_storage,
}

/// `struct rdma_conn_param`.
#[repr(C)]
#[derive(Clone, Copy)]
pub struct rdma_conn_param {
    pub private_data: *const c_void,
    pub private_data_len: u8,
    pub responder_resources: u8,
    pub initiator_depth: u8,
    pub flow_control: u8,
    pub retry_count: u8,
    pub rnr_retry_count: u8,
    pub srq: u8,
    pub qp_num: u32,
}

/// `struct rdma_cm_event` (the `conn` member of its parameter union).
#[repr(C)]
pub struct rdma_cm_event {
    pub id: *mut rdma_cm_id,
    pub listen_id: *mut rdma_cm_id,
    pub event: u32,
    pub status: c_int,
    pub conn: rdma_conn_param,
    _ud_rest: [u8; 32],
}

// ---- the function table ----

/// Entry points resolved from libibverbs.so.1 and librdmacm.so.1; the libraries stay loaded
/// for the life of the process (the table lives in a `static`).
pub struct Lib {
    _ibverbs: libloading::Library,
    _rdmacm: libloading::Library,
    pub ibv_get_device_list: unsafe extern "C" fn(*mut c_int) -> *mut *mut c_void,
    pub ibv_free_device_list: unsafe extern "C" fn(*mut *mut c_void),
    pub ibv_alloc_pd: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_pd,
    pub ibv_dealloc_pd: unsafe extern "C" fn(*mut ibv_pd) -> c_int,
    pub ibv_reg_mr: unsafe extern "C" fn(*mut ibv_pd, *mut c_void, usize, c_int) -> *mut ibv_mr,
    pub ibv_dereg_mr: unsafe extern "C" fn(*mut ibv_mr) -> c_int,
    pub ibv_create_comp_channel: unsafe extern "C" fn(*mut ibv_context) -> *mut ibv_comp_channel,
    pub ibv_destroy_comp_channel: unsafe extern "C" fn(*mut ibv_comp_channel) -> c_int,
    pub ibv_create_cq: unsafe extern "C" fn(
        *mut ibv_context,
        c_int,
        *mut c_void,
        *mut ibv_comp_channel,
        c_int,
    ) -> *mut ibv_cq,
    pub ibv_destroy_cq: unsafe extern "C" fn(*mut ibv_cq) -> c_int,
    pub ibv_get_cq_event:
        unsafe extern "C" fn(*mut ibv_comp_channel, *mut *mut ibv_cq, *mut *mut c_void) -> c_int,
    pub ibv_ack_cq_events: unsafe extern "C" fn(*mut ibv_cq, u32),
    pub ibv_wc_status_str: unsafe extern "C" fn(u32) -> *const c_char,
    pub ibv_query_device: unsafe extern "C" fn(*mut ibv_context, *mut ibv_device_attr) -> c_int,
    pub ibv_create_srq: unsafe extern "C" fn(*mut ibv_pd, *mut ibv_srq_init_attr) -> *mut ibv_srq,
    pub ibv_destroy_srq: unsafe extern "C" fn(*mut ibv_srq) -> c_int,
    pub ibv_get_async_event: unsafe extern "C" fn(*mut ibv_context, *mut ibv_async_event) -> c_int,
    pub ibv_ack_async_event: unsafe extern "C" fn(*mut ibv_async_event),
    pub rdma_create_event_channel: unsafe extern "C" fn() -> *mut rdma_event_channel,
    pub rdma_destroy_event_channel: unsafe extern "C" fn(*mut rdma_event_channel),
    pub rdma_create_id: unsafe extern "C" fn(
        *mut rdma_event_channel,
        *mut *mut rdma_cm_id,
        *mut c_void,
        u32,
    ) -> c_int,
    pub rdma_destroy_id: unsafe extern "C" fn(*mut rdma_cm_id) -> c_int,
    pub rdma_bind_addr: unsafe extern "C" fn(*mut rdma_cm_id, *const libc::sockaddr) -> c_int,
    pub rdma_listen: unsafe extern "C" fn(*mut rdma_cm_id, c_int) -> c_int,
    pub rdma_resolve_addr: unsafe extern "C" fn(
        *mut rdma_cm_id,
        *const libc::sockaddr,
        *const libc::sockaddr,
        c_int,
    ) -> c_int,
    pub rdma_resolve_route: unsafe extern "C" fn(*mut rdma_cm_id, c_int) -> c_int,
    pub rdma_create_qp:
        unsafe extern "C" fn(*mut rdma_cm_id, *mut ibv_pd, *mut ibv_qp_init_attr) -> c_int,
    pub rdma_destroy_qp: unsafe extern "C" fn(*mut rdma_cm_id),
    pub rdma_connect: unsafe extern "C" fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int,
    pub rdma_accept: unsafe extern "C" fn(*mut rdma_cm_id, *mut rdma_conn_param) -> c_int,
    pub rdma_reject: unsafe extern "C" fn(*mut rdma_cm_id, *const c_void, u8) -> c_int,
    pub rdma_disconnect: unsafe extern "C" fn(*mut rdma_cm_id) -> c_int,
    pub rdma_get_cm_event:
        unsafe extern "C" fn(*mut rdma_event_channel, *mut *mut rdma_cm_event) -> c_int,
    pub rdma_ack_cm_event: unsafe extern "C" fn(*mut rdma_cm_event) -> c_int,
    pub rdma_migrate_id: unsafe extern "C" fn(*mut rdma_cm_id, *mut rdma_event_channel) -> c_int,
    pub rdma_get_src_port: unsafe extern "C" fn(*mut rdma_cm_id) -> u16,
}

impl Lib {
    /// Loads both libraries by these file names and resolves every entry point; Err names the
    /// library or symbol that is missing.
    pub fn load(ibverbs: &str, rdmacm: &str) -> Result<Lib, String> {
        // SAFETY: loading rdma-core's libraries runs only their (side-effect free) constructors.
        let iv = unsafe { libloading::Library::new(ibverbs) }
            .map_err(|e| format!("cannot load {ibverbs}: {e}"))?;
        // SAFETY: as above.
        let cm = unsafe { libloading::Library::new(rdmacm) }
            .map_err(|e| format!("cannot load {rdmacm}: {e}"))?;
        macro_rules! sym {
            ($lib:expr, $libname:expr, $name:ident) => {{
                // SAFETY: the declared type is the C prototype of this rdma-core entry point.
                let s = unsafe { $lib.get(concat!(stringify!($name), "\0").as_bytes()) }
                    .map_err(|e| format!("{} has no {}: {e}", $libname, stringify!($name)))?;
                *s
            }};
        }
        Ok(Lib {
            ibv_get_device_list: sym!(iv, ibverbs, ibv_get_device_list),
            ibv_free_device_list: sym!(iv, ibverbs, ibv_free_device_list),
            ibv_alloc_pd: sym!(iv, ibverbs, ibv_alloc_pd),
            ibv_dealloc_pd: sym!(iv, ibverbs, ibv_dealloc_pd),
            ibv_reg_mr: sym!(iv, ibverbs, ibv_reg_mr),
            ibv_dereg_mr: sym!(iv, ibverbs, ibv_dereg_mr),
            ibv_create_comp_channel: sym!(iv, ibverbs, ibv_create_comp_channel),
            ibv_destroy_comp_channel: sym!(iv, ibverbs, ibv_destroy_comp_channel),
            ibv_create_cq: sym!(iv, ibverbs, ibv_create_cq),
            ibv_destroy_cq: sym!(iv, ibverbs, ibv_destroy_cq),
            ibv_get_cq_event: sym!(iv, ibverbs, ibv_get_cq_event),
            ibv_ack_cq_events: sym!(iv, ibverbs, ibv_ack_cq_events),
            ibv_wc_status_str: sym!(iv, ibverbs, ibv_wc_status_str),
            ibv_query_device: sym!(iv, ibverbs, ibv_query_device),
            ibv_create_srq: sym!(iv, ibverbs, ibv_create_srq),
            ibv_destroy_srq: sym!(iv, ibverbs, ibv_destroy_srq),
            ibv_get_async_event: sym!(iv, ibverbs, ibv_get_async_event),
            ibv_ack_async_event: sym!(iv, ibverbs, ibv_ack_async_event),
            rdma_create_event_channel: sym!(cm, rdmacm, rdma_create_event_channel),
            rdma_destroy_event_channel: sym!(cm, rdmacm, rdma_destroy_event_channel),
            rdma_create_id: sym!(cm, rdmacm, rdma_create_id),
            rdma_destroy_id: sym!(cm, rdmacm, rdma_destroy_id),
            rdma_bind_addr: sym!(cm, rdmacm, rdma_bind_addr),
            rdma_listen: sym!(cm, rdmacm, rdma_listen),
            rdma_resolve_addr: sym!(cm, rdmacm, rdma_resolve_addr),
            rdma_resolve_route: sym!(cm, rdmacm, rdma_resolve_route),
            rdma_create_qp: sym!(cm, rdmacm, rdma_create_qp),
            rdma_destroy_qp: sym!(cm, rdmacm, rdma_destroy_qp),
            rdma_connect: sym!(cm, rdmacm, rdma_connect),
            rdma_accept: sym!(cm, rdmacm, rdma_accept),
            rdma_reject: sym!(cm, rdmacm, rdma_reject),
            rdma_disconnect: sym!(cm, rdmacm, rdma_disconnect),
            rdma_get_cm_event: sym!(cm, rdmacm, rdma_get_cm_event),
            rdma_ack_cm_event: sym!(cm, rdmacm, rdma_ack_cm_event),
            rdma_migrate_id: sym!(cm, rdmacm, rdma_migrate_id),
            rdma_get_src_port: sym!(cm, rdmacm, rdma_get_src_port),
            _ibverbs: iv,
            _rdmacm: cm,
        })
    }
}

/// The ops table of the device an object belongs to.
///
/// # Safety
/// `ctx` is a live `ibv_context` of libibverbs.
pub unsafe fn ops<'a>(ctx: *mut ibv_context) -> &'a ibv_context_ops {
    &(*ctx).ops
}

// Layout checks against rdma-core 44's headers (x86-64 and every LP64 target).
const _: () = {
    use std::mem::{offset_of, size_of};
    assert!(size_of::<ibv_send_wr>() == 128);
    assert!(offset_of!(ibv_send_wr, opcode) == 28);
    assert!(offset_of!(ibv_send_wr, send_flags) == 32);
    assert!(offset_of!(ibv_send_wr, invalidate_rkey) == 36);
    assert!(offset_of!(ibv_send_wr, remote_addr) == 40);
    assert!(offset_of!(ibv_send_wr, rkey) == 48);
    assert!(offset_of!(ibv_send_wr, bind_mw) == 80);
    assert!(offset_of!(ibv_send_wr, bind_rkey) == 88);
    assert!(offset_of!(ibv_send_wr, bind_info) == 96);
    assert!(size_of::<ibv_mw_bind_info>() == 32);
    assert!(size_of::<ibv_recv_wr>() == 32);
    assert!(size_of::<ibv_sge>() == 16);
    assert!(size_of::<ibv_wc>() == 48);
    assert!(offset_of!(ibv_wc, byte_len) == 20);
    assert!(offset_of!(ibv_wc, invalidated_rkey) == 24);
    assert!(offset_of!(ibv_wc, wc_flags) == 36);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, alloc_mw) == 64);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, dealloc_mw) == 80);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, poll_cq) == 96);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, req_notify_cq) == 104);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_srq_recv) == 168);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_send) == 208);
    assert!(size_of::<ibv_srq_init_attr>() == 24);
    assert!(offset_of!(ibv_context, async_fd) == 268);
    assert!(size_of::<ibv_async_event>() == 16);
    assert!(offset_of!(ibv_async_event, event_type) == 8);
    assert!(offset_of!(ibv_context, ops) + offset_of!(ibv_context_ops, post_recv) == 216);
    assert!(offset_of!(ibv_qp, qp_num) == 52);
    assert!(offset_of!(ibv_mr, lkey) == 36);
    assert!(offset_of!(ibv_mr, rkey) == 40);
    assert!(offset_of!(ibv_mw, rkey) == 16);
    assert!(offset_of!(ibv_comp_channel, fd) == 8);
    assert!(offset_of!(ibv_qp_init_attr, cap) == 32);
    assert!(offset_of!(ibv_qp_init_attr, qp_type) == 52);
    assert!(size_of::<ibv_qp_init_attr>() == 64);
    assert!(offset_of!(rdma_cm_id, context) == 16);
    assert!(offset_of!(rdma_cm_id, qp) == 24);
    assert!(offset_of!(rdma_cm_id, src_addr) == 32);
    assert!(offset_of!(rdma_cm_id, dst_addr) == 160);
    assert!(size_of::<ibv_device_attr>() == 232);
    assert!(offset_of!(ibv_device_attr, max_mr_size) == 80);
    assert!(offset_of!(ibv_device_attr, max_qp_wr) == 112);
    assert!(offset_of!(ibv_device_attr, max_sge) == 120);
    assert!(offset_of!(ibv_device_attr, max_cqe) == 132);
    assert!(offset_of!(ibv_device_attr, max_qp_rd_atom) == 144);
    assert!(offset_of!(ibv_device_attr, max_qp_init_rd_atom) == 156);
    assert!(offset_of!(ibv_device_attr, max_mw) == 176);
    assert!(offset_of!(ibv_device_attr, max_srq) == 212);
    assert!(offset_of!(ibv_device_attr, max_srq_wr) == 216);
    assert!(size_of::<rdma_conn_param>() == 24);
    assert!(offset_of!(rdma_conn_param, responder_resources) == 9);
    assert!(offset_of!(rdma_conn_param, qp_num) == 16);
    assert!(size_of::<rdma_cm_event>() == 80);
    assert!(offset_of!(rdma_cm_event, event) == 16);
    assert!(offset_of!(rdma_cm_event, conn) == 24);
};
