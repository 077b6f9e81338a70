//! NVMe/RDMA transport bytes (NVMe RDMA Transport Specification): the
//! RDMA_CM private data a host and a controller exchange when a queue pair
//! connects (connect request, accept, reject and its status codes) with the
//! checks a target makes on a request before it accepts; the keyed SGL data
//! block descriptor (type 4) that tells the target where to RDMA READ or
//! WRITE a command's data; and the RDMA transport specific address subtype
//! (TSAS) of a discovery log entry.
//!
//! Pure layouts and checks: no verbs, no I/O, no allocation.

use core::fmt;
use core::mem::size_of;
use zerocopy::little_endian::U16;
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

use crate::command::{
    SglDescriptor, SGL_SUBTYPE_ADDRESS, SGL_SUBTYPE_INVALIDATE_KEY, SGL_TYPE_KEYED_DATA_BLOCK,
};

/// The port an NVMe/RDMA listener uses unless told otherwise.
pub const RDMA_DEFAULT_PORT: u16 = 4420;
/// RDMA_CM private data record format 1.0, the only one defined (RECFMT 0).
pub const RDMA_CM_RECFMT_1_0: u16 = 0;
/// Fewest entries an admin queue may have over Fabrics (the host asks for
/// exactly this many: HSQSIZE 31, HRQSIZE 32).
pub const ADMIN_QUEUE_MIN_ENTRIES: u32 = 32;
/// Fewest entries an I/O queue may have (SQSIZE is 0's based and 0 is invalid).
pub const IO_QUEUE_MIN_ENTRIES: u32 = 2;
/// Largest length a keyed SGL data block descriptor can carry (24 bits).
pub const KEYED_SGL_MAX_LENGTH: u32 = 0x00ff_ffff;

/// RDMA_CM_REQUEST private data, sent by the host with the RDMA CM
/// connect request of every queue (32 bytes).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct RdmaCmRequest {
    /// Record format: [`RDMA_CM_RECFMT_1_0`].
    pub recfmt: U16,
    /// Queue the connection is for: 0 admin, 1.. I/O.
    pub qid: U16,
    /// Host receive queue size: receive entries the host posts for
    /// completions (1's based; at least HSQSIZE + 1).
    pub hrqsize: U16,
    /// Host send queue size: the queue's SQSIZE, 0's based, the same value
    /// the host then puts in the Fabrics Connect command.
    pub hsqsize: U16,
    /// Controller ID the I/O queue belongs to (0 from hosts that predate
    /// the field; not meaningful for the admin queue).
    pub cntlid: U16,
    pub rsvd10: [u8; 22],
}
const _: () = assert!(size_of::<RdmaCmRequest>() == 32);

/// RDMA_CM_ACCEPT private data, sent by the controller when it accepts a
/// queue (32 bytes).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct RdmaCmAccept {
    /// Record format: [`RDMA_CM_RECFMT_1_0`].
    pub recfmt: U16,
    /// Controller receive queue size: command capsules the controller has
    /// receive entries posted for.
    pub crqsize: U16,
    pub rsvd4: [u8; 28],
}
const _: () = assert!(size_of::<RdmaCmAccept>() == 32);

/// RDMA_CM_REJECT private data, sent by the controller when it refuses a
/// queue (4 bytes).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct RdmaCmReject {
    /// Record format: [`RDMA_CM_RECFMT_1_0`].
    pub recfmt: U16,
    /// Why: an [`RdmaCmStatus`] code.
    pub sts: U16,
}
const _: () = assert!(size_of::<RdmaCmReject>() == 4);

/// NVMe/RDMA connect reject status codes (the STS of [`RdmaCmReject`]).
#[repr(u16)]
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RdmaCmStatus {
    /// The private data is shorter than a connect request.
    InvalidLength = 0x01,
    /// RECFMT is not a record format the controller knows.
    InvalidRecfmt = 0x02,
    /// QID names no queue the controller can create.
    InvalidQid = 0x03,
    /// HSQSIZE is outside what the controller supports for that queue.
    InvalidHsqsize = 0x04,
    /// HRQSIZE is too small for HSQSIZE.
    InvalidHrqsize = 0x05,
    /// The controller is out of resources for another queue.
    NoResources = 0x06,
    /// The host's inbound RDMA READ depth (IRD) cannot be honoured.
    InvalidIrd = 0x07,
    /// The host's outbound RDMA READ depth (ORD) cannot be honoured.
    InvalidOrd = 0x08,
    /// CNTLID names no controller this I/O queue can join.
    InvalidCntlid = 0x09,
}

impl RdmaCmStatus {
    /// Every status, in code order.
    pub const ALL: [RdmaCmStatus; 9] = [
        RdmaCmStatus::InvalidLength,
        RdmaCmStatus::InvalidRecfmt,
        RdmaCmStatus::InvalidQid,
        RdmaCmStatus::InvalidHsqsize,
        RdmaCmStatus::InvalidHrqsize,
        RdmaCmStatus::NoResources,
        RdmaCmStatus::InvalidIrd,
        RdmaCmStatus::InvalidOrd,
        RdmaCmStatus::InvalidCntlid,
    ];

    /// The wire code.
    pub const fn code(self) -> u16 {
        self as u16
    }

    /// The status with this wire code, if it is one.
    pub fn from_code(code: u16) -> Option<RdmaCmStatus> {
        RdmaCmStatus::ALL.into_iter().find(|s| s.code() == code)
    }

    /// A short description for logs.
    pub const fn describe(self) -> &'static str {
        match self {
            RdmaCmStatus::InvalidLength => "invalid private data length",
            RdmaCmStatus::InvalidRecfmt => "invalid record format (RECFMT)",
            RdmaCmStatus::InvalidQid => "invalid queue ID (QID)",
            RdmaCmStatus::InvalidHsqsize => "invalid host send queue size (HSQSIZE)",
            RdmaCmStatus::InvalidHrqsize => "invalid host receive queue size (HRQSIZE)",
            RdmaCmStatus::NoResources => "no resources",
            RdmaCmStatus::InvalidIrd => "invalid IRD",
            RdmaCmStatus::InvalidOrd => "invalid ORD",
            RdmaCmStatus::InvalidCntlid => "invalid controller ID (CNTLID)",
        }
    }

    /// The reject private data that carries this status.
    pub fn reject(self) -> RdmaCmReject {
        RdmaCmReject {
            recfmt: U16::new(RDMA_CM_RECFMT_1_0),
            sts: U16::new(self.code()),
        }
    }
}

impl fmt::Display for RdmaCmStatus {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({:#04x})", self.describe(), self.code())
    }
}

/// What the target admits on an RDMA connect request: the transport's
/// queue limits (SPDK's `max_aq_depth`, `max_queue_depth` and
/// `max_io_qpairs_per_ctrlr`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaQueueLimits {
    /// Most entries of an admin queue.
    pub max_admin_entries: u32,
    /// Most entries of an I/O queue.
    pub max_io_entries: u32,
    /// Highest I/O queue ID (I/O queues per controller).
    pub max_io_queues: u16,
}

/// A connect request that passed [`parse_connect_request`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ConnectRequest {
    pub qid: u16,
    /// Host receive queue size (1's based).
    pub hrqsize: u16,
    /// Host send queue size (0's based; the Connect command's SQSIZE).
    pub hsqsize: u16,
    /// Controller ID the host named (0: none given).
    pub cntlid: u16,
}

impl ConnectRequest {
    /// Whether this is the admin queue.
    pub fn is_admin(&self) -> bool {
        self.qid == 0
    }

    /// Queue entries the host will use: HSQSIZE + 1. Also the number of
    /// receive entries the target posts (CRQSIZE), so that every command the
    /// host may have outstanding has a buffer waiting.
    pub fn entries(&self) -> u32 {
        u32::from(self.hsqsize) + 1
    }

    /// Whether the Fabrics Connect command that follows on this queue agrees
    /// with the private data: same queue, same SQSIZE.
    pub fn matches_connect(&self, qid: u16, sqsize: u16) -> bool {
        self.qid == qid && self.hsqsize == sqsize
    }

    /// For an I/O queue that names a controller (CNTLID other than 0):
    /// [`RdmaCmStatus::InvalidCntlid`] unless `exists(cntlid)`. The admin
    /// queue and a CNTLID of 0 (hosts that predate the field) always pass.
    pub fn check_cntlid(&self, exists: impl FnOnce(u16) -> bool) -> Result<(), RdmaCmStatus> {
        if self.is_admin() || self.cntlid == 0 || exists(self.cntlid) {
            Ok(())
        } else {
            Err(RdmaCmStatus::InvalidCntlid)
        }
    }

    /// The accept private data for this request (CRQSIZE = HSQSIZE + 1).
    pub fn accept(&self) -> RdmaCmAccept {
        let mut a = RdmaCmAccept::new_zeroed();
        a.recfmt.set(RDMA_CM_RECFMT_1_0);
        // Fits: parse_connect_request refused HSQSIZE 0xFFFF.
        a.crqsize
            .set(self.entries().min(u32::from(u16::MAX)) as u16);
        a
    }
}

/// Checks the private data of an RDMA CM connect request: long enough,
/// RECFMT 0, a QID within `limits`, HSQSIZE giving at least the minimum
/// number of entries for that kind of queue and at most the limit, and
/// HRQSIZE at least HSQSIZE + 1 (the host must be able to receive a
/// completion for every command it may send). On failure the status to put
/// in the reject comes back.
pub fn parse_connect_request(
    private_data: &[u8],
    limits: &RdmaQueueLimits,
) -> Result<ConnectRequest, RdmaCmStatus> {
    let head = private_data
        .get(..size_of::<RdmaCmRequest>())
        .ok_or(RdmaCmStatus::InvalidLength)?;
    let r = RdmaCmRequest::ref_from_bytes(head).map_err(|_| RdmaCmStatus::InvalidLength)?;
    if r.recfmt.get() != RDMA_CM_RECFMT_1_0 {
        return Err(RdmaCmStatus::InvalidRecfmt);
    }
    let req = ConnectRequest {
        qid: r.qid.get(),
        hrqsize: r.hrqsize.get(),
        hsqsize: r.hsqsize.get(),
        cntlid: r.cntlid.get(),
    };
    if req.qid > limits.max_io_queues {
        return Err(RdmaCmStatus::InvalidQid);
    }
    let (min, max) = if req.is_admin() {
        (ADMIN_QUEUE_MIN_ENTRIES, limits.max_admin_entries)
    } else {
        (IO_QUEUE_MIN_ENTRIES, limits.max_io_entries)
    };
    let entries = req.entries();
    if entries < min || entries > max || req.hsqsize == u16::MAX {
        return Err(RdmaCmStatus::InvalidHsqsize);
    }
    if u32::from(req.hrqsize) < entries {
        return Err(RdmaCmStatus::InvalidHrqsize);
    }
    Ok(req)
}

/// The RDMA READ depth to use for a queue: the smallest of what the host
/// can serve (`host_initiator_depth` from its connect parameters), what the
/// local device supports and the target's own limit.
/// [`RdmaCmStatus::InvalidIrd`] when the host allows none: the target
/// could never fetch write data; [`RdmaCmStatus::NoResources`] when the
/// local side allows none.
pub fn negotiate_read_depth(
    host_initiator_depth: u8,
    device_max: u8,
    target_max: u8,
) -> Result<u8, RdmaCmStatus> {
    if host_initiator_depth == 0 {
        return Err(RdmaCmStatus::InvalidIrd);
    }
    match host_initiator_depth.min(device_max).min(target_max) {
        0 => Err(RdmaCmStatus::NoResources),
        d => Ok(d),
    }
}

/// A keyed SGL data block descriptor (SGL type 4): a region of host memory
/// the target reaches with RDMA READ or WRITE.
///
/// Bytes 0..8 address, 8..11 length (24 bits), 11..15 key, 15 the
/// descriptor id (type 4, subtype 0 "address" or Fh "invalidate key": the
/// host asks the target to invalidate the key remotely with its response).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct KeyedSgl {
    /// Remote (host) virtual address.
    pub address: u64,
    /// Length in bytes (at most [`KEYED_SGL_MAX_LENGTH`]).
    pub length: u32,
    /// Remote key (rkey) of the host's memory region.
    pub key: u32,
    /// Send the response with Send with Invalidate of `key`.
    pub invalidate: bool,
}

/// Why a descriptor is not a usable keyed SGL data block.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum KeyedSglError {
    /// The descriptor type is not 4 (keyed data block).
    #[error("SGL descriptor type {0:#x} is not a keyed data block (4)")]
    NotKeyed(u8),
    /// The subtype is neither 0 (address) nor Fh (invalidate key).
    #[error("keyed SGL subtype {0:#x} is neither address (0) nor invalidate key (0xf)")]
    BadSubtype(u8),
    /// Encoding only: the length does not fit 24 bits.
    #[error("keyed SGL length {0} does not fit 24 bits")]
    LengthTooLarge(u32),
}

impl KeyedSgl {
    /// Reads a keyed data block descriptor (e.g. a command's DPTR).
    pub fn decode(d: &SglDescriptor) -> Result<KeyedSgl, KeyedSglError> {
        if d.sgl_type() != SGL_TYPE_KEYED_DATA_BLOCK {
            return Err(KeyedSglError::NotKeyed(d.sgl_type()));
        }
        let invalidate = match d.subtype() {
            SGL_SUBTYPE_ADDRESS => false,
            SGL_SUBTYPE_INVALIDATE_KEY => true,
            other => return Err(KeyedSglError::BadSubtype(other)),
        };
        Ok(KeyedSgl {
            address: d.address(),
            length: d.keyed_length(),
            key: d.keyed_key(),
            invalidate,
        })
    }

    /// Reads the first 16 bytes of `b` as a keyed descriptor; `None` when
    /// `b` is shorter.
    pub fn decode_bytes(b: &[u8]) -> Option<Result<KeyedSgl, KeyedSglError>> {
        let d = SglDescriptor::ref_from_bytes(b.get(..size_of::<SglDescriptor>())?).ok()?;
        Some(KeyedSgl::decode(d))
    }

    /// The descriptor for this region.
    pub fn encode(&self) -> Result<SglDescriptor, KeyedSglError> {
        if self.length > KEYED_SGL_MAX_LENGTH {
            return Err(KeyedSglError::LengthTooLarge(self.length));
        }
        Ok(SglDescriptor::keyed(
            self.address,
            self.length,
            self.key,
            self.invalidate,
        ))
    }
}

/// RDMA QP service type of a TSAS: reliable connected (the only one NVMe/RDMA uses).
pub const RDMA_QPTYPE_RELIABLE_CONNECTED: u8 = 1;
/// RDMA QP service type of a TSAS: reliable datagram.
pub const RDMA_QPTYPE_RELIABLE_DATAGRAM: u8 = 2;
/// RDMA provider type of a TSAS: not specified.
pub const RDMA_PRTYPE_NOT_SPECIFIED: u8 = 1;
/// RDMA provider type of a TSAS: InfiniBand.
pub const RDMA_PRTYPE_IB: u8 = 2;
/// RDMA provider type of a TSAS: RoCE (v1).
pub const RDMA_PRTYPE_ROCE: u8 = 3;
/// RDMA provider type of a TSAS: RoCE v2.
pub const RDMA_PRTYPE_ROCEV2: u8 = 4;
/// RDMA provider type of a TSAS: iWARP.
pub const RDMA_PRTYPE_IWARP: u8 = 5;
/// RDMA connection management service of a TSAS: the RDMA CM (IP addressing).
pub const RDMA_CMS_RDMA_CM: u8 = 1;

/// The RDMA transport specific address subtype: the `tsas` bytes of a
/// discovery log entry whose TRTYPE is RDMA (256 bytes).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct RdmaTsas {
    /// `RDMA_QPTYPE_*`.
    pub qptype: u8,
    /// `RDMA_PRTYPE_*`.
    pub prtype: u8,
    /// `RDMA_CMS_*`.
    pub cms: u8,
    pub rsvd3: [u8; 5],
    /// Partition key (InfiniBand addressing only; 0 otherwise).
    pub pkey: U16,
    pub rsvd10: [u8; 246],
}
const _: () = assert!(size_of::<RdmaTsas>() == 256);

impl RdmaTsas {
    /// A TSAS with these fields, the rest zero.
    pub fn new(qptype: u8, prtype: u8, cms: u8, pkey: u16) -> RdmaTsas {
        let mut t = RdmaTsas::new_zeroed();
        t.qptype = qptype;
        t.prtype = prtype;
        t.cms = cms;
        t.pkey.set(pkey);
        t
    }

    /// What an IP-addressed NVMe/RDMA listener advertises (as the Linux
    /// target and SPDK do): reliable connected, provider not specified,
    /// RDMA CM, no partition key.
    pub fn rdma_cm() -> RdmaTsas {
        RdmaTsas::new(
            RDMA_QPTYPE_RELIABLE_CONNECTED,
            RDMA_PRTYPE_NOT_SPECIFIED,
            RDMA_CMS_RDMA_CM,
            0,
        )
    }

    /// Reads the TSAS bytes of a discovery log entry.
    pub fn from_bytes(tsas: &[u8; 256]) -> RdmaTsas {
        RdmaTsas::read_from_bytes(tsas).expect("256 bytes")
    }

    /// The 256 bytes to put in a discovery log entry.
    pub fn to_bytes(&self) -> [u8; 256] {
        let mut out = [0u8; 256];
        out.copy_from_slice(self.as_bytes());
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    const LIMITS: RdmaQueueLimits = RdmaQueueLimits {
        max_admin_entries: 128,
        max_io_entries: 128,
        max_io_queues: 127,
    };

    fn req(recfmt: u16, qid: u16, hrqsize: u16, hsqsize: u16, cntlid: u16) -> [u8; 32] {
        let mut r = RdmaCmRequest::new_zeroed();
        r.recfmt.set(recfmt);
        r.qid.set(qid);
        r.hrqsize.set(hrqsize);
        r.hsqsize.set(hsqsize);
        r.cntlid.set(cntlid);
        let mut out = [0u8; 32];
        out.copy_from_slice(r.as_bytes());
        out
    }

    #[test]
    fn private_data_layout() {
        assert_eq!(offset_of!(RdmaCmRequest, recfmt), 0);
        assert_eq!(offset_of!(RdmaCmRequest, qid), 2);
        assert_eq!(offset_of!(RdmaCmRequest, hrqsize), 4);
        assert_eq!(offset_of!(RdmaCmRequest, hsqsize), 6);
        assert_eq!(offset_of!(RdmaCmRequest, cntlid), 8);
        assert_eq!(offset_of!(RdmaCmRequest, rsvd10), 10);
        assert_eq!(offset_of!(RdmaCmAccept, crqsize), 2);
        assert_eq!(offset_of!(RdmaCmReject, sts), 2);
        // Little-endian on the wire.
        let b = req(0, 0x0102, 0x0304, 0x0506, 0x0708);
        assert_eq!(&b[..10], &[0, 0, 2, 1, 4, 3, 6, 5, 8, 7]);
        assert_eq!(
            RdmaCmStatus::InvalidHrqsize.reject().as_bytes(),
            &[0, 0, 5, 0]
        );
    }

    #[test]
    fn status_codes() {
        let codes: Vec<u16> = RdmaCmStatus::ALL.iter().map(|s| s.code()).collect();
        assert_eq!(codes, (1..=9).collect::<Vec<u16>>());
        assert_eq!(RdmaCmStatus::InvalidLength.code(), 0x01);
        assert_eq!(RdmaCmStatus::InvalidRecfmt.code(), 0x02);
        assert_eq!(RdmaCmStatus::InvalidQid.code(), 0x03);
        assert_eq!(RdmaCmStatus::InvalidHsqsize.code(), 0x04);
        assert_eq!(RdmaCmStatus::InvalidHrqsize.code(), 0x05);
        assert_eq!(RdmaCmStatus::NoResources.code(), 0x06);
        assert_eq!(RdmaCmStatus::InvalidIrd.code(), 0x07);
        assert_eq!(RdmaCmStatus::InvalidOrd.code(), 0x08);
        assert_eq!(RdmaCmStatus::InvalidCntlid.code(), 0x09);
        for s in RdmaCmStatus::ALL {
            assert_eq!(RdmaCmStatus::from_code(s.code()), Some(s));
        }
        assert_eq!(RdmaCmStatus::from_code(0), None);
        assert_eq!(RdmaCmStatus::from_code(10), None);
        assert_eq!(
            RdmaCmStatus::InvalidQid.to_string(),
            "invalid queue ID (QID) (0x03)"
        );
    }

    #[test]
    fn what_linux_hosts_send_is_accepted() {
        // Admin queue: HRQSIZE 32, HSQSIZE 31, no CNTLID.
        let a = parse_connect_request(&req(0, 0, 32, 31, 0), &LIMITS).unwrap();
        assert!(a.is_admin());
        assert_eq!(a.entries(), 32);
        assert_eq!(a.accept().crqsize.get(), 32);
        assert_eq!(a.accept().as_bytes()[..4], [0, 0, 32, 0]);
        assert!(a.matches_connect(0, 31));
        assert!(!a.matches_connect(0, 30));
        assert!(!a.matches_connect(1, 31));
        // I/O queue 3 of controller 5, 128 entries.
        let io = parse_connect_request(&req(0, 3, 128, 127, 5), &LIMITS).unwrap();
        assert_eq!(
            io,
            ConnectRequest {
                qid: 3,
                hrqsize: 128,
                hsqsize: 127,
                cntlid: 5
            }
        );
        assert_eq!(io.accept().crqsize.get(), 128);
        // Longer private data (the CM pads it) is fine.
        let mut long = [0u8; 56];
        long[..32].copy_from_slice(&req(0, 1, 2, 1, 0));
        assert!(parse_connect_request(&long, &LIMITS).is_ok());
    }

    #[test]
    fn bad_requests_get_the_right_reject() {
        let p = |b: &[u8]| parse_connect_request(b, &LIMITS).unwrap_err();
        assert_eq!(p(&[]), RdmaCmStatus::InvalidLength);
        assert_eq!(p(&req(0, 0, 32, 31, 0)[..31]), RdmaCmStatus::InvalidLength);
        assert_eq!(p(&req(1, 0, 32, 31, 0)), RdmaCmStatus::InvalidRecfmt);
        assert_eq!(p(&req(0x100, 0, 32, 31, 0)), RdmaCmStatus::InvalidRecfmt);
        assert_eq!(p(&req(0, 128, 32, 31, 0)), RdmaCmStatus::InvalidQid);
        assert_eq!(p(&req(0, 0xffff, 32, 31, 0)), RdmaCmStatus::InvalidQid);
        // Admin queue below the Fabrics minimum of 32 entries, or above the limit.
        assert_eq!(p(&req(0, 0, 32, 30, 0)), RdmaCmStatus::InvalidHsqsize);
        assert_eq!(p(&req(0, 0, 200, 128, 0)), RdmaCmStatus::InvalidHsqsize);
        // I/O queue of one entry (SQSIZE 0), above the limit, or 0xFFFF.
        assert_eq!(p(&req(0, 1, 1, 0, 0)), RdmaCmStatus::InvalidHsqsize);
        assert_eq!(p(&req(0, 1, 200, 128, 0)), RdmaCmStatus::InvalidHsqsize);
        assert_eq!(
            p(&req(0, 1, 0xffff, 0xffff, 0)),
            RdmaCmStatus::InvalidHsqsize
        );
        // HRQSIZE smaller than HSQSIZE + 1.
        assert_eq!(p(&req(0, 0, 31, 31, 0)), RdmaCmStatus::InvalidHrqsize);
        assert_eq!(p(&req(0, 2, 0, 63, 0)), RdmaCmStatus::InvalidHrqsize);
        // Limits at the edges.
        assert!(parse_connect_request(&req(0, 127, 128, 127, 1), &LIMITS).is_ok());
        assert!(parse_connect_request(&req(0, 0, 128, 127, 0), &LIMITS).is_ok());
        assert!(parse_connect_request(&req(0, 1, 2, 1, 0), &LIMITS).is_ok());
        let big = RdmaQueueLimits {
            max_admin_entries: 4096,
            max_io_entries: 65536,
            max_io_queues: 65534,
        };
        let r = parse_connect_request(&req(0, 65534, 0xffff, 0xfffe, 9), &big).unwrap();
        assert_eq!(r.accept().crqsize.get(), 0xffff);
    }

    #[test]
    fn cntlid_and_read_depth() {
        let io = parse_connect_request(&req(0, 1, 32, 31, 7), &LIMITS).unwrap();
        assert_eq!(io.check_cntlid(|c| c == 7), Ok(()));
        assert_eq!(
            io.check_cntlid(|c| c == 8),
            Err(RdmaCmStatus::InvalidCntlid)
        );
        let old_host = parse_connect_request(&req(0, 1, 32, 31, 0), &LIMITS).unwrap();
        assert_eq!(old_host.check_cntlid(|_| false), Ok(()));
        let admin = parse_connect_request(&req(0, 0, 32, 31, 0xffff), &LIMITS).unwrap();
        assert_eq!(admin.check_cntlid(|_| false), Ok(()));

        assert_eq!(
            negotiate_read_depth(0, 16, 16),
            Err(RdmaCmStatus::InvalidIrd)
        );
        assert_eq!(negotiate_read_depth(4, 16, 16), Ok(4));
        assert_eq!(negotiate_read_depth(255, 16, 128), Ok(16));
        assert_eq!(negotiate_read_depth(255, 16, 8), Ok(8));
        assert_eq!(
            negotiate_read_depth(8, 0, 8),
            Err(RdmaCmStatus::NoResources)
        );
    }

    #[test]
    fn keyed_sgl_layout_and_round_trip() {
        let k = KeyedSgl {
            address: 0x1122_3344_5566_7788,
            length: 0x00ab_cdef,
            key: 0xdead_beef,
            invalidate: false,
        };
        let d = k.encode().unwrap();
        let b = d.as_bytes();
        assert_eq!(&b[0..8], &0x1122_3344_5566_7788u64.to_le_bytes());
        assert_eq!(&b[8..11], &[0xef, 0xcd, 0xab]);
        assert_eq!(&b[11..15], &0xdead_beefu32.to_le_bytes());
        assert_eq!(b[15], 0x40);
        assert_eq!(KeyedSgl::decode(&d), Ok(k));
        assert_eq!(KeyedSgl::decode_bytes(b), Some(Ok(k)));
        assert_eq!(KeyedSgl::decode_bytes(&b[..15]), None);

        let inv = KeyedSgl {
            invalidate: true,
            ..k
        };
        let d = inv.encode().unwrap();
        assert_eq!(d.as_bytes()[15], 0x4f);
        assert_eq!(KeyedSgl::decode(&d), Ok(inv));

        let max = KeyedSgl {
            length: KEYED_SGL_MAX_LENGTH,
            ..k
        };
        assert_eq!(KeyedSgl::decode(&max.encode().unwrap()), Ok(max));
        assert_eq!(
            KeyedSgl {
                length: 1 << 24,
                ..k
            }
            .encode(),
            Err(KeyedSglError::LengthTooLarge(1 << 24))
        );
    }

    #[test]
    fn keyed_sgl_refuses_other_descriptors() {
        assert_eq!(
            KeyedSgl::decode(&SglDescriptor::transport(4096)),
            Err(KeyedSglError::NotKeyed(5))
        );
        assert_eq!(
            KeyedSgl::decode(&SglDescriptor::in_capsule(0, 512)),
            Err(KeyedSglError::NotKeyed(0))
        );
        let mut d = SglDescriptor::keyed(0x1000, 512, 9, false);
        d.id = 0x41;
        assert_eq!(KeyedSgl::decode(&d), Err(KeyedSglError::BadSubtype(1)));
        d.id = 0x4a;
        assert_eq!(KeyedSgl::decode(&d), Err(KeyedSglError::BadSubtype(0xa)));
    }

    #[test]
    fn tsas_layout() {
        assert_eq!(offset_of!(RdmaTsas, qptype), 0);
        assert_eq!(offset_of!(RdmaTsas, prtype), 1);
        assert_eq!(offset_of!(RdmaTsas, cms), 2);
        assert_eq!(offset_of!(RdmaTsas, pkey), 8);
        let t = RdmaTsas::rdma_cm();
        let b = t.to_bytes();
        assert_eq!(&b[..10], &[1, 1, 1, 0, 0, 0, 0, 0, 0, 0]);
        assert!(b[10..].iter().all(|&x| x == 0));
        assert_eq!(RdmaTsas::from_bytes(&b), t);
        let ib = RdmaTsas::new(
            RDMA_QPTYPE_RELIABLE_CONNECTED,
            RDMA_PRTYPE_IB,
            RDMA_CMS_RDMA_CM,
            0xffff,
        );
        assert_eq!(&ib.to_bytes()[..10], &[1, 2, 1, 0, 0, 0, 0, 0, 0xff, 0xff]);
        assert_eq!(
            [
                RDMA_PRTYPE_NOT_SPECIFIED,
                RDMA_PRTYPE_IB,
                RDMA_PRTYPE_ROCE,
                RDMA_PRTYPE_ROCEV2,
                RDMA_PRTYPE_IWARP
            ],
            [1, 2, 3, 4, 5]
        );
        assert_eq!(RDMA_QPTYPE_RELIABLE_DATAGRAM, 2);
        assert_eq!(crate::log::TRTYPE_RDMA, 1);
    }
}
