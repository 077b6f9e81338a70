//! NVMe/TCP PDUs: the header layouts for every PDU type, a zero-copy decoder
//! (`decode`) that validates a PDU and borrows its header and data from the
//! receive buffer, and encoders that append PDUs to a send buffer.
//!
//! # Framing
//!
//! Every PDU starts with an 8-byte common header (type, flags, header length
//! HLEN, data offset PDO, total length PLEN), followed by the rest of the
//! type-specific header (HLEN bytes in all), an optional 4-byte header digest
//! (CRC32C of the HLEN header bytes), optional padding up to PDO, the data, and
//! an optional 4-byte data digest (CRC32C of the data). Digests are present
//! when negotiated in ICReq/ICResp and flagged per PDU with `HDGSTF`/`DDGSTF`.
//! ICReq, ICResp and the termination requests never carry digests.
//!
//! ```text
//! | CH (8) | PSH (hlen-8) | HDGST (0/4) | PAD | DATA | DDGST (0/4) |
//! 0                       hlen                pdo           plen-ddgst  plen
//! ```
//!
//! # Decoding
//!
//! `decode(buf, opts)` looks at the front of `buf` and returns
//! `Decoded::Incomplete { need }` while fewer than `need` bytes are buffered
//! (`need` is a total buffer length, not a count of extra bytes), or
//! `Decoded::Pdu { len, pdu }` once a whole PDU of `len` bytes is there: the
//! caller consumes `len` bytes afterwards. The common header is validated as
//! soon as its 8 bytes arrive, so a bad peer is rejected before we wait for a
//! (possibly huge) PLEN. Errors are fatal for the connection: a `PduError`
//! carries the Fatal Error Status and Field Error Index to put in the
//! termination request the caller sends before closing.
//!
//! A *data digest* mismatch is not fatal: the PDU is still returned, with
//! `data_digest_ok: false` in its variant, and the target completes the
//! command with `Status::TRANSIENT_TRANSPORT_ERROR` (or the host fails the
//! I/O). A *header digest* mismatch is fatal (FES 0x03).
//!
//! # Encoding
//!
//! Encoders append to a `Vec<u8>` (they only allocate if the vector lacks
//! spare capacity, so a preallocated send buffer makes them allocation-free).
//! Data PDUs are written in two steps so the payload is copied only once:
//! `encode_c2h_data_header` / `encode_h2c_data_header` append the header,
//! header digest and padding; the caller then appends exactly `datal` bytes
//! (e.g. straight from the I/O buffer) and calls `append_data_digest`, or
//! uses `append_data` to do both.

use crate::command::Command;
use crate::completion::Completion;
use crate::digest::{crc32c, DIGEST_LEN};
use crate::opcode::UnknownValue;
use core::mem::size_of;
use thiserror::Error;
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, FromZeros, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Common header flag: a header digest follows the header.
pub const HDGSTF: u8 = 0x01;
/// Common header flag: a data digest follows the data.
pub const DDGSTF: u8 = 0x02;
/// H2CData/C2HData flag: last data PDU of the command's transfer.
pub const DATA_LAST: u8 = 0x04;
/// C2HData flag: the command succeeded; no CapsuleResp will follow.
/// Only valid together with `DATA_LAST`.
pub const DATA_SUCCESS: u8 = 0x08;

/// Fatal Error Status: a header field is invalid (FEI = its byte offset).
pub const FES_INVALID_HEADER_FIELD: u16 = 0x01;
/// Fatal Error Status: PDU not expected in the current state.
pub const FES_PDU_SEQUENCE_ERROR: u16 = 0x02;
/// Fatal Error Status: header digest mismatch.
pub const FES_HEADER_DIGEST_ERROR: u16 = 0x03;
/// Fatal Error Status: data offset/length outside the command's buffer.
pub const FES_DATA_OUT_OF_RANGE: u16 = 0x04;
/// Fatal Error Status: more data than the negotiated limit.
pub const FES_DATA_LIMIT_EXCEEDED: u16 = 0x05;
/// Fatal Error Status: an ICReq/ICResp parameter is not supported (FEI = offset).
pub const FES_UNSUPPORTED_PARAMETER: u16 = 0x06;

/// ICReq/ICResp `dgst` bit: header digests enabled.
pub const DGST_HDGST_ENABLE: u8 = 0x01;
/// ICReq/ICResp `dgst` bit: data digests enabled.
pub const DGST_DDGST_ENABLE: u8 = 0x02;
/// PDU format version 1.0, the only one defined.
pub const PFV_1_0: u16 = 0;
/// A termination request carries at most this many bytes of the bad PDU header.
pub const TERM_REQ_MAX_DATA: usize = 128;

/// Which end of the connection we are: decides which PDU types may be received.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Role {
    /// We are the controller: we receive ICReq, H2CTermReq, CapsuleCmd, H2CData.
    Target,
    /// We are the host: we receive ICResp, C2HTermReq, CapsuleResp, C2HData, R2T.
    Host,
}

/// NVMe/TCP PDU types (common header byte 0).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
#[repr(u8)]
pub enum PduType {
    IcReq = 0x00,
    IcResp = 0x01,
    H2CTermReq = 0x02,
    C2HTermReq = 0x03,
    CapsuleCmd = 0x04,
    CapsuleResp = 0x05,
    H2CData = 0x06,
    C2HData = 0x07,
    R2T = 0x09,
}

impl TryFrom<u8> for PduType {
    type Error = UnknownValue;
    fn try_from(v: u8) -> Result<Self, UnknownValue> {
        Ok(match v {
            0x00 => PduType::IcReq,
            0x01 => PduType::IcResp,
            0x02 => PduType::H2CTermReq,
            0x03 => PduType::C2HTermReq,
            0x04 => PduType::CapsuleCmd,
            0x05 => PduType::CapsuleResp,
            0x06 => PduType::H2CData,
            0x07 => PduType::C2HData,
            0x09 => PduType::R2T,
            value => {
                return Err(UnknownValue {
                    kind: "PDU type",
                    value,
                })
            }
        })
    }
}

impl PduType {
    /// Every PDU type.
    pub const ALL: [PduType; 9] = [
        PduType::IcReq,
        PduType::IcResp,
        PduType::H2CTermReq,
        PduType::C2HTermReq,
        PduType::CapsuleCmd,
        PduType::CapsuleResp,
        PduType::H2CData,
        PduType::C2HData,
        PduType::R2T,
    ];

    /// The fixed header length (HLEN) of this type.
    pub const fn hlen(self) -> usize {
        match self {
            PduType::IcReq | PduType::IcResp => 128,
            PduType::CapsuleCmd => 72,
            PduType::H2CTermReq
            | PduType::C2HTermReq
            | PduType::CapsuleResp
            | PduType::H2CData
            | PduType::C2HData
            | PduType::R2T => 24,
        }
    }

    /// Which side sends this type.
    pub const fn sender(self) -> Role {
        match self {
            PduType::IcReq | PduType::H2CTermReq | PduType::CapsuleCmd | PduType::H2CData => {
                Role::Host
            }
            PduType::IcResp
            | PduType::C2HTermReq
            | PduType::CapsuleResp
            | PduType::C2HData
            | PduType::R2T => Role::Target,
        }
    }

    /// True if this type can carry a header digest (all but IC and TermReq).
    pub const fn can_have_hdgst(self) -> bool {
        !matches!(
            self,
            PduType::IcReq | PduType::IcResp | PduType::H2CTermReq | PduType::C2HTermReq
        )
    }

    /// True if this type can carry data protected by a data digest.
    pub const fn can_have_ddgst(self) -> bool {
        matches!(
            self,
            PduType::CapsuleCmd | PduType::H2CData | PduType::C2HData
        )
    }
}

/// The 8-byte common header at the start of every PDU.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct CommonHeader {
    pub pdu_type: u8,
    pub flags: u8,
    /// Header length (fixed per type, excludes the header digest).
    pub hlen: u8,
    /// Offset of the data from the start of the PDU (0 if no data).
    pub pdo: u8,
    /// Total PDU length including digests and padding.
    pub plen: U32,
}
const _: () = assert!(size_of::<CommonHeader>() == 8);

impl CommonHeader {
    /// A common header with the given fields.
    pub fn new(ty: PduType, flags: u8, pdo: u8, plen: u32) -> Self {
        CommonHeader {
            pdu_type: ty as u8,
            flags,
            hlen: ty.hlen() as u8,
            pdo,
            plen: U32::new(plen),
        }
    }
    /// The PDU type, if known.
    pub fn ty(&self) -> Result<PduType, UnknownValue> {
        PduType::try_from(self.pdu_type)
    }
    pub fn flags(&self) -> u8 {
        self.flags
    }
    pub fn hlen(&self) -> u8 {
        self.hlen
    }
    pub fn pdo(&self) -> u8 {
        self.pdo
    }
    pub fn plen(&self) -> u32 {
        self.plen.get()
    }
}

/// Initialize Connection Request (host → controller), 128 bytes.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct IcReq {
    pub ch: CommonHeader,
    /// PDU format version (0).
    pub pfv: U16,
    /// Host PDU data alignment: the controller must start C2H data at a
    /// multiple of (hpda + 1) × 4 bytes.
    pub hpda: u8,
    /// Requested digests (`DGST_HDGST_ENABLE`, `DGST_DDGST_ENABLE`).
    pub dgst: u8,
    /// Maximum outstanding R2Ts per command, 0-based.
    pub maxr2t: U32,
    pub rsvd: [u8; 112],
}
const _: () = assert!(size_of::<IcReq>() == 128);

impl IcReq {
    pub fn pfv(&self) -> u16 {
        self.pfv.get()
    }
    pub fn hpda(&self) -> u8 {
        self.hpda
    }
    pub fn hdgst_enabled(&self) -> bool {
        self.dgst & DGST_HDGST_ENABLE != 0
    }
    pub fn ddgst_enabled(&self) -> bool {
        self.dgst & DGST_DDGST_ENABLE != 0
    }
    pub fn maxr2t(&self) -> u32 {
        self.maxr2t.get()
    }
}

/// Initialize Connection Response (controller → host), 128 bytes.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct IcResp {
    pub ch: CommonHeader,
    /// PDU format version (0).
    pub pfv: U16,
    /// Controller PDU data alignment for H2C data, in (cpda + 1) × 4 bytes.
    pub cpda: u8,
    /// Digests enabled for this connection.
    pub dgst: u8,
    /// Maximum data bytes in one H2CData PDU.
    pub maxh2cdata: U32,
    pub rsvd: [u8; 112],
}
const _: () = assert!(size_of::<IcResp>() == 128);

impl IcResp {
    pub fn pfv(&self) -> u16 {
        self.pfv.get()
    }
    pub fn cpda(&self) -> u8 {
        self.cpda
    }
    pub fn hdgst_enabled(&self) -> bool {
        self.dgst & DGST_HDGST_ENABLE != 0
    }
    pub fn ddgst_enabled(&self) -> bool {
        self.dgst & DGST_DDGST_ENABLE != 0
    }
    pub fn maxh2cdata(&self) -> u32 {
        self.maxh2cdata.get()
    }
}

/// H2CTermReq / C2HTermReq header, 24 bytes. The data that follows (up to
/// 128 bytes) is the header of the PDU that caused the error.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct TermReqHeader {
    pub ch: CommonHeader,
    /// Fatal error status (`FES_*`).
    pub fes: U16,
    /// Fatal error information (for FES 0x01 / 0x06: byte offset of the bad field).
    pub fei: U32,
    pub rsvd: [u8; 10],
}
const _: () = assert!(size_of::<TermReqHeader>() == 24);

impl TermReqHeader {
    pub fn fes(&self) -> u16 {
        self.fes.get()
    }
    pub fn fei(&self) -> u32 {
        self.fei.get()
    }
}

/// Command capsule header: common header + the 64-byte SQE, 72 bytes.
/// In-capsule data (e.g. Connect data, small writes) may follow.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct CapsuleCmdHeader {
    pub ch: CommonHeader,
    pub cmd: Command,
}
const _: () = assert!(size_of::<CapsuleCmdHeader>() == 72);

/// Response capsule: common header + the 16-byte CQE, 24 bytes.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct CapsuleRespHeader {
    pub ch: CommonHeader,
    pub cqe: Completion,
}
const _: () = assert!(size_of::<CapsuleRespHeader>() == 24);

/// H2CData / C2HData header, 24 bytes.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct DataHeader {
    pub ch: CommonHeader,
    /// Command capsule CID this data belongs to.
    pub cccid: U16,
    /// Transfer tag from the R2T (H2CData); reserved in C2HData.
    pub ttag: U16,
    /// Offset of this data within the command's whole transfer.
    pub datao: U32,
    /// Number of data bytes in this PDU.
    pub datal: U32,
    pub rsvd: [u8; 4],
}
const _: () = assert!(size_of::<DataHeader>() == 24);

impl DataHeader {
    pub fn cccid(&self) -> u16 {
        self.cccid.get()
    }
    pub fn ttag(&self) -> u16 {
        self.ttag.get()
    }
    pub fn datao(&self) -> u32 {
        self.datao.get()
    }
    pub fn datal(&self) -> u32 {
        self.datal.get()
    }
    pub fn flags(&self) -> u8 {
        self.ch.flags
    }
    /// `DATA_LAST` is set.
    pub fn last(&self) -> bool {
        self.ch.flags & DATA_LAST != 0
    }
    /// `DATA_SUCCESS` is set (C2HData only).
    pub fn success(&self) -> bool {
        self.ch.flags & DATA_SUCCESS != 0
    }
}

/// Ready to Transfer (controller → host), 24 bytes: asks the host to send
/// `r2tl` bytes starting at offset `r2to` in H2CData PDUs tagged `ttag`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct R2tHeader {
    pub ch: CommonHeader,
    pub cccid: U16,
    pub ttag: U16,
    pub r2to: U32,
    pub r2tl: U32,
    pub rsvd: [u8; 4],
}
const _: () = assert!(size_of::<R2tHeader>() == 24);

impl R2tHeader {
    pub fn cccid(&self) -> u16 {
        self.cccid.get()
    }
    pub fn ttag(&self) -> u16 {
        self.ttag.get()
    }
    pub fn r2to(&self) -> u32 {
        self.r2to.get()
    }
    pub fn r2tl(&self) -> u32 {
        self.r2tl.get()
    }
}

// ---------------------------------------------------------------------------
// Decoder
// ---------------------------------------------------------------------------

/// Connection parameters the decoder needs.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DecodeOpts {
    /// Header digests were negotiated: PDUs that can carry one must set
    /// `HDGSTF` and carry it, and it is verified.
    pub hdgst: bool,
    /// Data digests were negotiated: PDUs with data must set `DDGSTF` and
    /// carry one, and it is verified.
    pub ddgst: bool,
    /// Largest data payload accepted in one PDU (in-capsule data, H2CData or
    /// C2HData). A target typically uses max(in-capsule size, MAXH2CDATA).
    pub max_data_len: u32,
    /// Which side we are.
    pub role: Role,
}

impl DecodeOpts {
    /// Options before ICReq/ICResp: no digests, a 128 KiB data limit.
    pub fn new(role: Role) -> Self {
        DecodeOpts {
            hdgst: false,
            ddgst: false,
            max_data_len: 128 * 1024,
            role,
        }
    }
}

impl Default for DecodeOpts {
    fn default() -> Self {
        DecodeOpts::new(Role::Target)
    }
}

/// A fatal protocol error: the connection must be terminated with a
/// TermReq carrying `fes` and `fei` (see `encode_term_req`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Error)]
#[error("{msg} (fes {fes:#04x}, fei {fei})")]
pub struct PduError {
    /// Fatal Error Status (`FES_*`).
    pub fes: u16,
    /// Fatal Error Information: byte offset of the bad field for FES 0x01.
    pub fei: u32,
    /// Short description for logs.
    pub msg: &'static str,
}

impl PduError {
    pub const fn new(fes: u16, fei: u32, msg: &'static str) -> Self {
        PduError { fes, fei, msg }
    }
    pub fn fes(&self) -> u16 {
        self.fes
    }
    pub fn fei(&self) -> u32 {
        self.fei
    }
}

/// Result of looking at the front of a receive buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Decoded<'a> {
    /// Not enough bytes yet: wait until the buffer holds at least `need` bytes.
    Incomplete { need: usize },
    /// A complete, valid PDU occupying `buf[..len]`.
    Pdu { len: usize, pdu: Pdu<'a> },
}

/// A decoded PDU, borrowing its header and data from the receive buffer.
///
/// `data` is the payload only (no padding, no digests). `data_digest_ok` is
/// false when a data digest was present and did not match; it is true when
/// the digest matched or no data digest was carried.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Pdu<'a> {
    IcReq(&'a IcReq),
    IcResp(&'a IcResp),
    H2CTermReq {
        hdr: &'a TermReqHeader,
        /// Header of the PDU that caused the error (may be empty).
        data: &'a [u8],
    },
    C2HTermReq {
        hdr: &'a TermReqHeader,
        data: &'a [u8],
    },
    CapsuleCmd {
        hdr: &'a CapsuleCmdHeader,
        /// In-capsule data (empty if none).
        data: &'a [u8],
        data_digest_ok: bool,
    },
    CapsuleResp(&'a CapsuleRespHeader),
    H2CData {
        hdr: &'a DataHeader,
        data: &'a [u8],
        data_digest_ok: bool,
    },
    C2HData {
        hdr: &'a DataHeader,
        data: &'a [u8],
        data_digest_ok: bool,
    },
    R2T(&'a R2tHeader),
}

impl<'a> Pdu<'a> {
    /// The PDU's type.
    pub fn pdu_type(&self) -> PduType {
        match self {
            Pdu::IcReq(_) => PduType::IcReq,
            Pdu::IcResp(_) => PduType::IcResp,
            Pdu::H2CTermReq { .. } => PduType::H2CTermReq,
            Pdu::C2HTermReq { .. } => PduType::C2HTermReq,
            Pdu::CapsuleCmd { .. } => PduType::CapsuleCmd,
            Pdu::CapsuleResp(_) => PduType::CapsuleResp,
            Pdu::H2CData { .. } => PduType::H2CData,
            Pdu::C2HData { .. } => PduType::C2HData,
            Pdu::R2T(_) => PduType::R2T,
        }
    }

    /// The common header.
    pub fn common(&self) -> &'a CommonHeader {
        match *self {
            Pdu::IcReq(h) => &h.ch,
            Pdu::IcResp(h) => &h.ch,
            Pdu::H2CTermReq { hdr, .. } | Pdu::C2HTermReq { hdr, .. } => &hdr.ch,
            Pdu::CapsuleCmd { hdr, .. } => &hdr.ch,
            Pdu::CapsuleResp(h) => &h.ch,
            Pdu::H2CData { hdr, .. } | Pdu::C2HData { hdr, .. } => &hdr.ch,
            Pdu::R2T(h) => &h.ch,
        }
    }

    /// The data payload (empty for PDUs without data).
    pub fn data(&self) -> &'a [u8] {
        match *self {
            Pdu::H2CTermReq { data, .. }
            | Pdu::C2HTermReq { data, .. }
            | Pdu::CapsuleCmd { data, .. }
            | Pdu::H2CData { data, .. }
            | Pdu::C2HData { data, .. } => data,
            _ => &[],
        }
    }

    /// False if the PDU carried a data digest that did not match.
    pub fn data_digest_ok(&self) -> bool {
        match *self {
            Pdu::CapsuleCmd { data_digest_ok, .. }
            | Pdu::H2CData { data_digest_ok, .. }
            | Pdu::C2HData { data_digest_ok, .. } => data_digest_ok,
            _ => true,
        }
    }
}

/// Where the parts of a PDU sit, worked out from its common header alone
/// (see `peek_layout`).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PduLayout {
    /// The PDU type.
    pub ty: PduType,
    /// Header length (without digest).
    pub hlen: usize,
    /// A header digest follows the header.
    pub hdgst: bool,
    /// A data digest follows the data.
    pub ddgst: bool,
    /// Offset of the data from the start of the PDU.
    pub data_start: usize,
    /// Total PDU length.
    pub plen: usize,
}

impl PduLayout {
    /// Offset just past the data (where the data digest, if any, starts).
    pub fn data_end(&self) -> usize {
        self.plen - if self.ddgst { DIGEST_LEN } else { 0 }
    }
    /// Number of data bytes.
    pub fn data_len(&self) -> usize {
        self.data_end() - self.data_start
    }
}

/// Validate just the common header at the front of `buf` and say where the
/// PDU's parts are, without waiting for the rest of it. Returns `Ok(None)`
/// while fewer than 8 bytes are buffered. Useful to receive a large payload
/// straight into its final buffer; `decode` performs the same checks first.
pub fn peek_layout(buf: &[u8], opts: &DecodeOpts) -> Result<Option<PduLayout>, PduError> {
    match CommonHeader::ref_from_prefix(buf) {
        Ok((ch, _)) => check_common(ch, opts).map(Some),
        Err(_) => Ok(None),
    }
}

const fn err(fes: u16, fei: u32, msg: &'static str) -> PduError {
    PduError::new(fes, fei, msg)
}

/// Byte offsets of common header fields, used as FEI values.
const FEI_TYPE: u32 = 0;
const FEI_FLAGS: u32 = 1;
const FEI_HLEN: u32 = 2;
const FEI_PDO: u32 = 3;
const FEI_PLEN: u32 = 4;
/// Offset of DATAL in H2CData/C2HData.
const FEI_DATAL: u32 = 16;

/// Validate a common header and work out the PDU's layout.
fn check_common(ch: &CommonHeader, opts: &DecodeOpts) -> Result<PduLayout, PduError> {
    let ty = PduType::try_from(ch.pdu_type)
        .map_err(|_| err(FES_INVALID_HEADER_FIELD, FEI_TYPE, "unknown PDU type"))?;
    if ty.sender() == opts.role {
        return Err(err(
            FES_INVALID_HEADER_FIELD,
            FEI_TYPE,
            "PDU type not valid in this direction",
        ));
    }
    let hlen = ty.hlen();
    if ch.hlen as usize != hlen {
        return Err(err(
            FES_INVALID_HEADER_FIELD,
            FEI_HLEN,
            "header length wrong for PDU type",
        ));
    }

    // Digest flags. A header digest must be present exactly when negotiated;
    // a data digest flag is only allowed when negotiated.
    let hdgst = ty.can_have_hdgst() && ch.flags & HDGSTF != 0;
    let ddgst = ty.can_have_ddgst() && ch.flags & DDGSTF != 0;
    if ty.can_have_hdgst() && hdgst != opts.hdgst {
        return Err(err(
            FES_INVALID_HEADER_FIELD,
            FEI_FLAGS,
            "header digest flag does not match negotiated setting",
        ));
    }
    if ddgst && !opts.ddgst {
        return Err(err(
            FES_INVALID_HEADER_FIELD,
            FEI_FLAGS,
            "data digest flag set but data digests not negotiated",
        ));
    }

    let plen = ch.plen.get() as usize;
    let hdr_end = hlen + if hdgst { DIGEST_LEN } else { 0 };
    let ddgst_len = if ddgst { DIGEST_LEN } else { 0 };
    let pdo = ch.pdo as usize;

    let data_start = match ty {
        PduType::IcReq | PduType::IcResp => {
            if plen != hlen {
                return Err(err(
                    FES_INVALID_HEADER_FIELD,
                    FEI_PLEN,
                    "ICReq/ICResp length must be 128",
                ));
            }
            hlen
        }
        PduType::H2CTermReq | PduType::C2HTermReq => {
            // The offending header follows immediately; PDO is not used.
            if plen < hlen || plen > hlen + TERM_REQ_MAX_DATA {
                return Err(err(
                    FES_INVALID_HEADER_FIELD,
                    FEI_PLEN,
                    "TermReq length out of range",
                ));
            }
            hlen
        }
        PduType::CapsuleResp | PduType::R2T => {
            if plen != hdr_end {
                return Err(err(
                    FES_INVALID_HEADER_FIELD,
                    FEI_PLEN,
                    "PDU length does not match header length",
                ));
            }
            hdr_end
        }
        PduType::CapsuleCmd | PduType::H2CData | PduType::C2HData => {
            if plen < hdr_end + ddgst_len {
                return Err(err(
                    FES_INVALID_HEADER_FIELD,
                    FEI_PLEN,
                    "PDU length shorter than its header",
                ));
            }
            let data_end = plen - ddgst_len;
            let start = if pdo == 0 {
                // Only a command capsule without data may leave PDO at 0.
                if ty != PduType::CapsuleCmd || data_end != hdr_end {
                    return Err(err(
                        FES_INVALID_HEADER_FIELD,
                        FEI_PDO,
                        "data offset is 0 but the PDU has data",
                    ));
                }
                hdr_end
            } else {
                if pdo < hdr_end || pdo > data_end {
                    return Err(err(
                        FES_INVALID_HEADER_FIELD,
                        FEI_PDO,
                        "data offset out of range",
                    ));
                }
                pdo
            };
            let data_len = data_end - start;
            if data_len as u64 > opts.max_data_len as u64 {
                return Err(err(
                    FES_DATA_LIMIT_EXCEEDED,
                    0,
                    "PDU data exceeds the negotiated limit",
                ));
            }
            if opts.ddgst && data_len > 0 && !ddgst {
                return Err(err(
                    FES_INVALID_HEADER_FIELD,
                    FEI_FLAGS,
                    "data digest negotiated but flag not set",
                ));
            }
            start
        }
    };

    Ok(PduLayout {
        ty,
        hlen,
        hdgst,
        ddgst,
        data_start,
        plen,
    })
}

/// Little-endian u32 at `buf[at..at + 4]` (callers guarantee the bounds).
fn le32_at(buf: &[u8], at: usize) -> Option<u32> {
    let b: [u8; 4] = buf.get(at..at + 4)?.try_into().ok()?;
    Some(u32::from_le_bytes(b))
}

/// Cast the front of `buf` to a header type.
fn header<T: FromBytes + KnownLayout + Immutable>(buf: &[u8]) -> Result<&T, PduError> {
    T::ref_from_prefix(buf).map(|(h, _)| h).map_err(|_| {
        err(
            FES_INVALID_HEADER_FIELD,
            FEI_PLEN,
            "PDU shorter than its header",
        )
    })
}

/// Decode the PDU at the front of `buf`. See the module documentation.
///
/// Never panics, never allocates, and never reads past `buf`.
pub fn decode<'a>(buf: &'a [u8], opts: &DecodeOpts) -> Result<Decoded<'a>, PduError> {
    let Ok((ch, _)) = CommonHeader::ref_from_prefix(buf) else {
        return Ok(Decoded::Incomplete {
            need: size_of::<CommonHeader>(),
        });
    };
    let lay = check_common(ch, opts)?;
    if buf.len() < lay.plen {
        return Ok(Decoded::Incomplete { need: lay.plen });
    }
    let pdu = &buf[..lay.plen];

    if lay.hdgst {
        let want = crc32c(&pdu[..lay.hlen]);
        if le32_at(pdu, lay.hlen) != Some(want) {
            return Err(err(FES_HEADER_DIGEST_ERROR, 0, "header digest mismatch"));
        }
    }

    let data_end = lay.plen - if lay.ddgst { DIGEST_LEN } else { 0 };
    let data = &pdu[lay.data_start..data_end];
    let data_digest_ok = !lay.ddgst || le32_at(pdu, data_end) == Some(crc32c(data));

    let out = match lay.ty {
        PduType::IcReq => Pdu::IcReq(header(pdu)?),
        PduType::IcResp => Pdu::IcResp(header(pdu)?),
        PduType::H2CTermReq => Pdu::H2CTermReq {
            hdr: header(pdu)?,
            data,
        },
        PduType::C2HTermReq => Pdu::C2HTermReq {
            hdr: header(pdu)?,
            data,
        },
        PduType::CapsuleCmd => Pdu::CapsuleCmd {
            hdr: header(pdu)?,
            data,
            data_digest_ok,
        },
        PduType::CapsuleResp => Pdu::CapsuleResp(header(pdu)?),
        PduType::R2T => Pdu::R2T(header(pdu)?),
        PduType::H2CData | PduType::C2HData => {
            let hdr: &DataHeader = header(pdu)?;
            if hdr.datal() as usize != data.len() {
                return Err(err(
                    FES_INVALID_HEADER_FIELD,
                    FEI_DATAL,
                    "DATAL does not match the PDU length",
                ));
            }
            if lay.ty == PduType::H2CData {
                Pdu::H2CData {
                    hdr,
                    data,
                    data_digest_ok,
                }
            } else {
                if hdr.success() && !hdr.last() {
                    return Err(err(
                        FES_INVALID_HEADER_FIELD,
                        FEI_FLAGS,
                        "C2HData SUCCESS flag without LAST",
                    ));
                }
                Pdu::C2HData {
                    hdr,
                    data,
                    data_digest_ok,
                }
            }
        }
    };
    Ok(Decoded::Pdu {
        len: lay.plen,
        pdu: out,
    })
}

/// The bytes to quote in a termination request after `decode` failed on
/// `buf`: the offending PDU's header (HLEN bytes, or as much as is
/// buffered), capped at 128 bytes.
pub fn offending_header(buf: &[u8]) -> &[u8] {
    let hlen = buf.get(2).map_or(buf.len(), |&h| h as usize);
    let n = hlen
        .max(size_of::<CommonHeader>())
        .min(TERM_REQ_MAX_DATA)
        .min(buf.len());
    &buf[..n]
}

// ---------------------------------------------------------------------------
// Encoders
// ---------------------------------------------------------------------------

/// Digest and alignment settings for the PDUs we send.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct EncodeOpts {
    /// Add header digests (negotiated in ICReq/ICResp).
    pub hdgst: bool,
    /// Add data digests to PDUs that carry data.
    pub ddgst: bool,
    /// The receiver's data alignment: data starts at a multiple of
    /// (pda + 1) × 4 bytes. Use the host's HPDA for C2HData and the
    /// controller's CPDA for H2CData / in-capsule data. Usually 0.
    pub pda: u8,
}

impl EncodeOpts {
    pub fn new(hdgst: bool, ddgst: bool) -> Self {
        EncodeOpts {
            hdgst,
            ddgst,
            pda: 0,
        }
    }

    fn hdgst_len(&self) -> usize {
        if self.hdgst {
            DIGEST_LEN
        } else {
            0
        }
    }

    fn ddgst_len(&self) -> usize {
        if self.ddgst {
            DIGEST_LEN
        } else {
            0
        }
    }

    /// Offset of data in a PDU of type `ty` sent with these options.
    fn data_offset(&self, ty: PduType) -> usize {
        let unaligned = ty.hlen() + self.hdgst_len();
        let align = (self.pda as usize % 32 + 1) * 4;
        unaligned.div_ceil(align) * align
    }

    fn flags(&self, has_data: bool) -> u8 {
        let mut f = 0;
        if self.hdgst {
            f |= HDGSTF;
        }
        if self.ddgst && has_data {
            f |= DDGSTF;
        }
        f
    }
}

/// Append `hdr` and, if enabled, its header digest; then zero padding up to
/// `pdo` (when `pdo` is past the header).
fn put_header(out: &mut Vec<u8>, hdr: &[u8], hdgst: bool, pdo: usize) {
    let start = out.len();
    out.extend_from_slice(hdr);
    if hdgst {
        out.extend_from_slice(&crc32c(hdr).to_le_bytes());
    }
    let written = out.len() - start;
    if pdo > written {
        out.resize(start + pdo, 0);
    }
}

/// Append an ICReq (host). `maxr2t` is 0-based.
pub fn encode_ic_req(out: &mut Vec<u8>, hpda: u8, hdgst: bool, ddgst: bool, maxr2t: u32) {
    let mut p = IcReq::new_zeroed();
    p.ch = CommonHeader::new(PduType::IcReq, 0, 0, 128);
    p.pfv.set(PFV_1_0);
    p.hpda = hpda;
    p.dgst = dgst_bits(hdgst, ddgst);
    p.maxr2t.set(maxr2t);
    out.extend_from_slice(p.as_bytes());
}

/// Append an ICResp (controller).
pub fn encode_ic_resp(out: &mut Vec<u8>, cpda: u8, hdgst: bool, ddgst: bool, maxh2cdata: u32) {
    let mut p = IcResp::new_zeroed();
    p.ch = CommonHeader::new(PduType::IcResp, 0, 0, 128);
    p.pfv.set(PFV_1_0);
    p.cpda = cpda;
    p.dgst = dgst_bits(hdgst, ddgst);
    p.maxh2cdata.set(maxh2cdata);
    out.extend_from_slice(p.as_bytes());
}

fn dgst_bits(hdgst: bool, ddgst: bool) -> u8 {
    (if hdgst { DGST_HDGST_ENABLE } else { 0 }) | (if ddgst { DGST_DDGST_ENABLE } else { 0 })
}

/// Append a termination request. `sender` is who we are: `Role::Target`
/// sends C2HTermReq, `Role::Host` sends H2CTermReq. `offending` is the header
/// of the bad PDU (see `offending_header`); only its first 128 bytes are sent.
pub fn encode_term_req(out: &mut Vec<u8>, sender: Role, fes: u16, fei: u32, offending: &[u8]) {
    let ty = match sender {
        Role::Target => PduType::C2HTermReq,
        Role::Host => PduType::H2CTermReq,
    };
    let data = &offending[..offending.len().min(TERM_REQ_MAX_DATA)];
    let mut h = TermReqHeader::new_zeroed();
    h.ch = CommonHeader::new(ty, 0, 0, (ty.hlen() + data.len()) as u32);
    h.fes.set(fes);
    h.fei.set(fei);
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(data);
}

/// Append a command capsule with optional in-capsule `data` (host).
/// The caller sets the command's SGL (e.g. `SglDescriptor::in_capsule`).
pub fn encode_capsule_cmd(out: &mut Vec<u8>, opts: &EncodeOpts, cmd: &Command, data: &[u8]) {
    let ty = PduType::CapsuleCmd;
    let has_data = !data.is_empty();
    let (pdo, plen) = if has_data {
        let pdo = opts.data_offset(ty);
        (pdo, pdo + data.len() + opts.ddgst_len())
    } else {
        (0, ty.hlen() + opts.hdgst_len())
    };
    let h = CapsuleCmdHeader {
        ch: CommonHeader::new(ty, opts.flags(has_data), pdo as u8, plen as u32),
        cmd: *cmd,
    };
    put_header(out, h.as_bytes(), opts.hdgst, pdo);
    if has_data {
        append_data(out, opts, data);
    }
}

/// Append a response capsule (controller).
pub fn encode_capsule_resp(out: &mut Vec<u8>, opts: &EncodeOpts, cqe: &Completion) {
    let ty = PduType::CapsuleResp;
    let plen = ty.hlen() + opts.hdgst_len();
    let h = CapsuleRespHeader {
        ch: CommonHeader::new(ty, opts.flags(false), 0, plen as u32),
        cqe: *cqe,
    };
    put_header(out, h.as_bytes(), opts.hdgst, 0);
}

/// Append an R2T (controller): ask for `r2tl` bytes at offset `r2to` of
/// command `cccid`, to be tagged `ttag` in the H2CData PDUs.
pub fn encode_r2t(
    out: &mut Vec<u8>,
    opts: &EncodeOpts,
    cccid: u16,
    ttag: u16,
    r2to: u32,
    r2tl: u32,
) {
    let ty = PduType::R2T;
    let plen = ty.hlen() + opts.hdgst_len();
    let h = R2tHeader {
        ch: CommonHeader::new(ty, opts.flags(false), 0, plen as u32),
        cccid: U16::new(cccid),
        ttag: U16::new(ttag),
        r2to: U32::new(r2to),
        r2tl: U32::new(r2tl),
        rsvd: [0; 4],
    };
    put_header(out, h.as_bytes(), opts.hdgst, 0);
}

#[allow(clippy::too_many_arguments)]
fn encode_data_header(
    out: &mut Vec<u8>,
    ty: PduType,
    opts: &EncodeOpts,
    cccid: u16,
    ttag: u16,
    datao: u32,
    datal: u32,
    flags: u8,
) -> usize {
    let pdo = opts.data_offset(ty);
    let plen = pdo + datal as usize + opts.ddgst_len();
    let flags = (flags & !(HDGSTF | DDGSTF)) | opts.flags(true);
    let h = DataHeader {
        ch: CommonHeader::new(ty, flags, pdo as u8, plen as u32),
        cccid: U16::new(cccid),
        ttag: U16::new(ttag),
        datao: U32::new(datao),
        datal: U32::new(datal),
        rsvd: [0; 4],
    };
    put_header(out, h.as_bytes(), opts.hdgst, pdo);
    out.len()
}

/// Append a C2HData header (controller), its header digest and padding.
/// `flags` may include `DATA_LAST` and `DATA_SUCCESS`; digest flags are set
/// from `opts`. `ttag` is reserved for C2HData (pass 0).
///
/// Returns the offset in `out` where the data starts. The caller must then
/// append exactly `datal` bytes and finish with `append_data_digest(out,
/// opts, that_offset)` (or use `append_data` for both steps).
#[allow(clippy::too_many_arguments)]
pub fn encode_c2h_data_header(
    out: &mut Vec<u8>,
    opts: &EncodeOpts,
    cccid: u16,
    ttag: u16,
    datao: u32,
    datal: u32,
    flags: u8,
) -> usize {
    encode_data_header(
        out,
        PduType::C2HData,
        opts,
        cccid,
        ttag,
        datao,
        datal,
        flags,
    )
}

/// Append an H2CData header (host); same contract as `encode_c2h_data_header`.
/// `ttag` must echo the R2T's transfer tag. `flags` may include `DATA_LAST`.
#[allow(clippy::too_many_arguments)]
pub fn encode_h2c_data_header(
    out: &mut Vec<u8>,
    opts: &EncodeOpts,
    cccid: u16,
    ttag: u16,
    datao: u32,
    datal: u32,
    flags: u8,
) -> usize {
    encode_data_header(
        out,
        PduType::H2CData,
        opts,
        cccid,
        ttag,
        datao,
        datal,
        flags,
    )
}

/// Append `data` and, if data digests are enabled, its digest.
pub fn append_data(out: &mut Vec<u8>, opts: &EncodeOpts, data: &[u8]) {
    out.extend_from_slice(data);
    if opts.ddgst {
        out.extend_from_slice(&crc32c(data).to_le_bytes());
    }
}

/// If data digests are enabled, append the digest of `out[data_start..]`
/// (the data the caller wrote after a data header).
pub fn append_data_digest(out: &mut Vec<u8>, opts: &EncodeOpts, data_start: usize) {
    if opts.ddgst {
        let crc = crc32c(out.get(data_start..).unwrap_or(&[]));
        out.extend_from_slice(&crc.to_le_bytes());
    }
}

/// Append a whole C2HData PDU carrying `data` (header + data + digest).
pub fn encode_c2h_data(
    out: &mut Vec<u8>,
    opts: &EncodeOpts,
    cccid: u16,
    datao: u32,
    data: &[u8],
    flags: u8,
) {
    encode_c2h_data_header(out, opts, cccid, 0, datao, data.len() as u32, flags);
    append_data(out, opts, data);
}

/// Append a whole H2CData PDU carrying `data` (header + data + digest).
#[allow(clippy::too_many_arguments)]
pub fn encode_h2c_data(
    out: &mut Vec<u8>,
    opts: &EncodeOpts,
    cccid: u16,
    ttag: u16,
    datao: u32,
    data: &[u8],
    flags: u8,
) {
    encode_h2c_data_header(out, opts, cccid, ttag, datao, data.len() as u32, flags);
    append_data(out, opts, data);
}
