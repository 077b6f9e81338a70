//! NVMe in-band authentication on the wire (NVMe base spec, "Authentication";
//! Fabrics Authentication Send / Receive): the command fields (SECP, SPSP0/1,
//! transfer / allocation length), the DH-HMAC-CHAP message layouts
//! (AUTH_Negotiate, Challenge, Reply, Success1, Success2, Failure1/2) as
//! zerocopy structs, identifiers (hash functions, DH groups, failure reason
//! explanations, Connect response AUTHREQ bits), a parser that validates a
//! received message and borrows its variable parts from the buffer (no
//! allocation), and encoders for both directions (the target's answers, the
//! host's messages for initiators and tests). Only bytes: no cryptography.

use crate::command::{Command, SglDescriptor};
use crate::opcode::FabricsType;
use core::mem::size_of;
use zerocopy::little_endian::{U16, U32};
use zerocopy::{FromBytes, Immutable, IntoBytes, KnownLayout, Unaligned};

/// Security protocol of NVMe in-band authentication (SECP).
pub const SECP_NVME: u8 = 0xe9;
/// SPSP0 / SPSP1 of DH-HMAC-CHAP messages.
pub const SPSP0_DHCHAP: u8 = 0x01;
pub const SPSP1_DHCHAP: u8 = 0x01;

/// Connect response dword 0: authentication transaction required (ATR).
pub const AUTHREQ_ATR: u32 = 1 << 17;
/// Connect response dword 0: secure channel concatenation required (ASCR).
pub const AUTHREQ_ASCR: u32 = 1 << 18;

/// Message types (byte 0).
pub const AUTH_TYPE_COMMON: u8 = 0x00;
pub const AUTH_TYPE_DHCHAP: u8 = 0x01;

/// Message identifiers (byte 1).
pub const AUTH_ID_NEGOTIATE: u8 = 0x00;
pub const AUTH_ID_CHALLENGE: u8 = 0x01;
pub const AUTH_ID_REPLY: u8 = 0x02;
pub const AUTH_ID_SUCCESS1: u8 = 0x03;
pub const AUTH_ID_SUCCESS2: u8 = 0x04;
pub const AUTH_ID_FAILURE2: u8 = 0xf0;
pub const AUTH_ID_FAILURE1: u8 = 0xf1;

/// Authentication protocol identifier of DH-HMAC-CHAP in a descriptor.
pub const AUTHID_DHCHAP: u8 = 0x01;

/// Hash function identifiers.
pub const HASH_SHA256: u8 = 0x01;
pub const HASH_SHA384: u8 = 0x02;
pub const HASH_SHA512: u8 = 0x03;

/// Diffie-Hellman group identifiers.
pub const DHGROUP_NULL: u8 = 0x00;
pub const DHGROUP_FFDHE2048: u8 = 0x01;
pub const DHGROUP_FFDHE3072: u8 = 0x02;
pub const DHGROUP_FFDHE4096: u8 = 0x03;
pub const DHGROUP_FFDHE6144: u8 = 0x04;
pub const DHGROUP_FFDHE8192: u8 = 0x05;

/// Failure reason code (the only one defined).
pub const FAILURE_RC: u8 = 0x01;
/// Failure reason code explanations.
pub const FAILURE_FAILED: u8 = 0x01;
pub const FAILURE_PROTOCOL_UNUSABLE: u8 = 0x02;
pub const FAILURE_SCC_MISMATCH: u8 = 0x03;
pub const FAILURE_HASH_UNUSABLE: u8 = 0x04;
pub const FAILURE_DHGROUP_UNUSABLE: u8 = 0x05;
pub const FAILURE_INCORRECT_PAYLOAD: u8 = 0x06;
pub const FAILURE_INCORRECT_PROTOCOL_MESSAGE: u8 = 0x07;

/// Length in bytes of the digest of a hash identifier (0: unknown).
pub const fn hash_len(hash_id: u8) -> usize {
    match hash_id {
        HASH_SHA256 => 32,
        HASH_SHA384 => 48,
        HASH_SHA512 => 64,
        _ => 0,
    }
}

/// Size in bytes of a DH group's public values (0 for the null group or an
/// unknown identifier).
pub const fn dhgroup_len(dhgroup_id: u8) -> usize {
    match dhgroup_id {
        DHGROUP_FFDHE2048 => 256,
        DHGROUP_FFDHE3072 => 384,
        DHGROUP_FFDHE4096 => 512,
        DHGROUP_FFDHE6144 => 768,
        DHGROUP_FFDHE8192 => 1024,
        _ => 0,
    }
}

/// AUTH_Negotiate header (8 bytes), followed by `napd` protocol descriptors.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct NegotiateHeader {
    pub auth_type: u8,
    pub auth_id: u8,
    pub rsvd2: [u8; 2],
    pub t_id: U16,
    /// Secure channel concatenation (0: none).
    pub sc_c: u8,
    /// Number of protocol descriptors that follow.
    pub napd: u8,
}

/// One authentication protocol descriptor of AUTH_Negotiate (64 bytes).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct ProtocolDescriptor {
    pub authid: u8,
    pub rsvd1: u8,
    /// Entries used in `hash_ids`.
    pub halen: u8,
    /// Entries used in `dhgroup_ids`.
    pub dhlen: u8,
    pub hash_ids: [u8; 30],
    pub dhgroup_ids: [u8; 30],
}

impl ProtocolDescriptor {
    /// The hash identifiers offered (at most 30).
    pub fn hashes(&self) -> &[u8] {
        &self.hash_ids[..usize::from(self.halen).min(30)]
    }
    /// The DH group identifiers offered (at most 30).
    pub fn dhgroups(&self) -> &[u8] {
        &self.dhgroup_ids[..usize::from(self.dhlen).min(30)]
    }
}

/// DH-HMAC-CHAP_Challenge header (16 bytes), followed by `hl` bytes of
/// challenge and `dhvlen` bytes of the controller's DH public value.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct ChallengeHeader {
    pub auth_type: u8,
    pub auth_id: u8,
    pub rsvd2: [u8; 2],
    pub t_id: U16,
    pub hl: u8,
    pub rsvd7: u8,
    pub hash_id: u8,
    pub dhgroup_id: u8,
    pub dhvlen: U16,
    pub seqnum: U32,
}

/// DH-HMAC-CHAP_Reply header (16 bytes), followed by `hl` bytes of
/// response, `hl` bytes of the host's challenge (meaningful when `cvalid`)
/// and `dhvlen` bytes of the host's DH public value.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct ReplyHeader {
    pub auth_type: u8,
    pub auth_id: u8,
    pub rsvd2: [u8; 2],
    pub t_id: U16,
    pub hl: u8,
    pub rsvd7: u8,
    /// 1: the host asks the controller to authenticate itself.
    pub cvalid: u8,
    pub rsvd9: u8,
    pub dhvlen: U16,
    /// The host's sequence number S2 (0 when `cvalid` is 0).
    pub seqnum: U32,
}

/// DH-HMAC-CHAP_Success1 header (16 bytes), followed by `hl` bytes of the
/// controller's response when `rvalid`.
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct Success1Header {
    pub auth_type: u8,
    pub auth_id: u8,
    pub rsvd2: [u8; 2],
    pub t_id: U16,
    pub hl: u8,
    pub rsvd7: u8,
    pub rvalid: u8,
    pub rsvd9: [u8; 7],
}

/// DH-HMAC-CHAP_Success2 (16 bytes).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct Success2 {
    pub auth_type: u8,
    pub auth_id: u8,
    pub rsvd2: [u8; 2],
    pub t_id: U16,
    pub rsvd6: [u8; 10],
}

/// AUTH_Failure1 / AUTH_Failure2 (8 bytes).
#[repr(C)]
#[derive(
    Debug, Clone, Copy, PartialEq, Eq, FromBytes, IntoBytes, KnownLayout, Immutable, Unaligned,
)]
pub struct Failure {
    pub auth_type: u8,
    pub auth_id: u8,
    pub rsvd2: [u8; 2],
    pub t_id: U16,
    /// Reason code (`FAILURE_RC`).
    pub rescode: u8,
    /// Reason code explanation (`FAILURE_*`).
    pub rescode_exp: u8,
}

const _: () = assert!(size_of::<NegotiateHeader>() == 8);
const _: () = assert!(size_of::<ProtocolDescriptor>() == 64);
const _: () = assert!(size_of::<ChallengeHeader>() == 16);
const _: () = assert!(size_of::<ReplyHeader>() == 16);
const _: () = assert!(size_of::<Success1Header>() == 16);
const _: () = assert!(size_of::<Success2>() == 16);
const _: () = assert!(size_of::<Failure>() == 8);

/// Authentication Send / Receive fields of the SQE (bytes 40..48).
impl Command {
    /// Security protocol (byte 43).
    pub fn auth_secp(&self) -> u8 {
        (self.cdw10() >> 24) as u8
    }
    /// SP specific 0 (byte 41).
    pub fn auth_spsp0(&self) -> u8 {
        (self.cdw10() >> 8) as u8
    }
    /// SP specific 1 (byte 42).
    pub fn auth_spsp1(&self) -> u8 {
        (self.cdw10() >> 16) as u8
    }
    /// Authentication Send: transfer length; Receive: allocation length
    /// (bytes 47:44).
    pub fn auth_len(&self) -> u32 {
        self.cdw11()
    }
    /// True when SECP/SPSP name NVMe DH-HMAC-CHAP.
    pub fn is_dhchap_auth(&self) -> bool {
        self.auth_secp() == SECP_NVME
            && self.auth_spsp0() == SPSP0_DHCHAP
            && self.auth_spsp1() == SPSP1_DHCHAP
    }

    fn auth_cmd(cid: u16, fctype: FabricsType, len: u32) -> Command {
        let mut c = Command::new(0, cid);
        c.set_fctype(fctype as u8);
        c.set_cdw10(
            (u32::from(SECP_NVME) << 24)
                | (u32::from(SPSP1_DHCHAP) << 16)
                | (u32::from(SPSP0_DHCHAP) << 8),
        );
        c.set_cdw11(len);
        c.set_sgl(SglDescriptor::in_capsule(0, len));
        c
    }
    /// Build an Authentication Send carrying `tl` bytes (in-capsule SGL).
    pub fn auth_send(cid: u16, tl: u32) -> Command {
        Self::auth_cmd(cid, FabricsType::AuthSend, tl)
    }
    /// Build an Authentication Receive for up to `al` bytes. The SGL is a
    /// transport data block the transport's host side may replace.
    pub fn auth_recv(cid: u16, al: u32) -> Command {
        let mut c = Self::auth_cmd(cid, FabricsType::AuthRecv, al);
        c.set_sgl(SglDescriptor::transport(al));
        c
    }
}

/// Why a received authentication message was refused.
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum AuthMsgError {
    #[error("authentication message of {0} bytes is too short")]
    Short(usize),
    #[error("unexpected authentication message type {auth_type:#x} id {auth_id:#x}")]
    Unexpected { auth_type: u8, auth_id: u8 },
    #[error("authentication message length {got} does not match its fields ({want})")]
    Length { got: usize, want: usize },
    #[error("invalid authentication message field: {0}")]
    Field(&'static str),
}

impl AuthMsgError {
    /// The failure reason explanation a controller reports for it.
    pub fn reason(&self) -> u8 {
        match self {
            AuthMsgError::Unexpected { .. } => FAILURE_INCORRECT_PROTOCOL_MESSAGE,
            _ => FAILURE_INCORRECT_PAYLOAD,
        }
    }
}

/// A message a host sends (Authentication Send), parsed and validated;
/// variable parts borrow from the buffer.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum HostMsg<'a> {
    Negotiate {
        t_id: u16,
        sc_c: u8,
        descriptors: &'a [ProtocolDescriptor],
    },
    Reply {
        t_id: u16,
        hl: u8,
        /// The host's sequence number and challenge when it asks the
        /// controller to authenticate itself.
        host_challenge: Option<(u32, &'a [u8])>,
        response: &'a [u8],
        dh_value: &'a [u8],
    },
    Success2 {
        t_id: u16,
    },
    Failure2 {
        t_id: u16,
        rescode: u8,
        rescode_exp: u8,
    },
}

/// A message a controller sends (Authentication Receive), parsed and
/// validated (for initiators and tests).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CtrlMsg<'a> {
    Challenge {
        t_id: u16,
        hash_id: u8,
        dhgroup_id: u8,
        seqnum: u32,
        challenge: &'a [u8],
        dh_value: &'a [u8],
    },
    Success1 {
        t_id: u16,
        hl: u8,
        response: Option<&'a [u8]>,
    },
    Failure1 {
        t_id: u16,
        rescode: u8,
        rescode_exp: u8,
    },
}

fn exact(buf: &[u8], want: usize) -> Result<(), AuthMsgError> {
    if buf.len() != want {
        return Err(AuthMsgError::Length {
            got: buf.len(),
            want,
        });
    }
    Ok(())
}

fn valid_hl(hl: u8) -> Result<usize, AuthMsgError> {
    match hl {
        32 | 48 | 64 => Ok(usize::from(hl)),
        _ => Err(AuthMsgError::Field("hl (hash length)")),
    }
}

/// Parse what a host sent with Authentication Send (`buf`: exactly the
/// transfer length).
pub fn parse_host_msg(buf: &[u8]) -> Result<HostMsg<'_>, AuthMsgError> {
    if buf.len() < 8 {
        return Err(AuthMsgError::Short(buf.len()));
    }
    let t_id = u16::from_le_bytes([buf[4], buf[5]]);
    match (buf[0], buf[1]) {
        (AUTH_TYPE_COMMON, AUTH_ID_NEGOTIATE) => {
            let (h, rest) = NegotiateHeader::ref_from_prefix(buf)
                .map_err(|_| AuthMsgError::Short(buf.len()))?;
            let n = usize::from(h.napd);
            exact(buf, 8 + n * size_of::<ProtocolDescriptor>())?;
            let descriptors = <[ProtocolDescriptor]>::ref_from_bytes(rest)
                .map_err(|_| AuthMsgError::Field("protocol descriptors"))?;
            for d in descriptors {
                if d.halen > 30 || d.dhlen > 30 {
                    return Err(AuthMsgError::Field("halen/dhlen over 30"));
                }
            }
            Ok(HostMsg::Negotiate {
                t_id,
                sc_c: h.sc_c,
                descriptors,
            })
        }
        (AUTH_TYPE_DHCHAP, AUTH_ID_REPLY) => {
            let (h, rest) =
                ReplyHeader::ref_from_prefix(buf).map_err(|_| AuthMsgError::Short(buf.len()))?;
            let hl = valid_hl(h.hl)?;
            let dhvlen = usize::from(h.dhvlen.get());
            if dhvlen % 4 != 0 {
                return Err(AuthMsgError::Field("dhvlen not a multiple of 4"));
            }
            exact(buf, 16 + 2 * hl + dhvlen)?;
            let host_challenge = match h.cvalid {
                0 => None,
                1 if h.seqnum.get() == 0 => {
                    return Err(AuthMsgError::Field("seqnum 0 with cvalid"))
                }
                1 => Some((h.seqnum.get(), &rest[hl..2 * hl])),
                _ => return Err(AuthMsgError::Field("cvalid")),
            };
            Ok(HostMsg::Reply {
                t_id,
                hl: h.hl,
                host_challenge,
                response: &rest[..hl],
                dh_value: &rest[2 * hl..],
            })
        }
        (AUTH_TYPE_DHCHAP, AUTH_ID_SUCCESS2) => {
            exact(buf, size_of::<Success2>())?;
            Ok(HostMsg::Success2 { t_id })
        }
        (AUTH_TYPE_COMMON, AUTH_ID_FAILURE2) => {
            exact(buf, size_of::<Failure>())?;
            Ok(HostMsg::Failure2 {
                t_id,
                rescode: buf[6],
                rescode_exp: buf[7],
            })
        }
        (auth_type, auth_id) => Err(AuthMsgError::Unexpected { auth_type, auth_id }),
    }
}

/// Parse what a controller returned for Authentication Receive (`buf`: the
/// bytes it filled; trailing zero padding up to the allocation length is
/// ignored).
pub fn parse_ctrl_msg(buf: &[u8]) -> Result<CtrlMsg<'_>, AuthMsgError> {
    if buf.len() < 8 {
        return Err(AuthMsgError::Short(buf.len()));
    }
    let t_id = u16::from_le_bytes([buf[4], buf[5]]);
    match (buf[0], buf[1]) {
        (AUTH_TYPE_DHCHAP, AUTH_ID_CHALLENGE) => {
            let (h, rest) = ChallengeHeader::ref_from_prefix(buf)
                .map_err(|_| AuthMsgError::Short(buf.len()))?;
            let hl = valid_hl(h.hl)?;
            if hash_len(h.hash_id) != hl {
                return Err(AuthMsgError::Field("hl does not match hash_id"));
            }
            let dhvlen = usize::from(h.dhvlen.get());
            if dhvlen != dhgroup_len(h.dhgroup_id) {
                return Err(AuthMsgError::Field("dhvlen does not match dhgroup_id"));
            }
            if rest.len() < hl + dhvlen {
                return Err(AuthMsgError::Length {
                    got: buf.len(),
                    want: 16 + hl + dhvlen,
                });
            }
            Ok(CtrlMsg::Challenge {
                t_id,
                hash_id: h.hash_id,
                dhgroup_id: h.dhgroup_id,
                seqnum: h.seqnum.get(),
                challenge: &rest[..hl],
                dh_value: &rest[hl..hl + dhvlen],
            })
        }
        (AUTH_TYPE_DHCHAP, AUTH_ID_SUCCESS1) => {
            let (h, rest) =
                Success1Header::ref_from_prefix(buf).map_err(|_| AuthMsgError::Short(buf.len()))?;
            let hl = valid_hl(h.hl)?;
            let response = match h.rvalid {
                0 => None,
                1 if rest.len() >= hl => Some(&rest[..hl]),
                1 => {
                    return Err(AuthMsgError::Length {
                        got: buf.len(),
                        want: 16 + hl,
                    })
                }
                _ => return Err(AuthMsgError::Field("rvalid")),
            };
            Ok(CtrlMsg::Success1 {
                t_id,
                hl: h.hl,
                response,
            })
        }
        (AUTH_TYPE_COMMON, AUTH_ID_FAILURE1) => Ok(CtrlMsg::Failure1 {
            t_id,
            rescode: buf[6],
            rescode_exp: buf[7],
        }),
        (auth_type, auth_id) => Err(AuthMsgError::Unexpected { auth_type, auth_id }),
    }
}

/// Append a DH-HMAC-CHAP_Challenge.
pub fn encode_challenge(
    out: &mut Vec<u8>,
    t_id: u16,
    hash_id: u8,
    dhgroup_id: u8,
    seqnum: u32,
    challenge: &[u8],
    dh_value: &[u8],
) {
    let h = ChallengeHeader {
        auth_type: AUTH_TYPE_DHCHAP,
        auth_id: AUTH_ID_CHALLENGE,
        rsvd2: [0; 2],
        t_id: U16::new(t_id),
        hl: challenge.len() as u8,
        rsvd7: 0,
        hash_id,
        dhgroup_id,
        dhvlen: U16::new(dh_value.len() as u16),
        seqnum: U32::new(seqnum),
    };
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(challenge);
    out.extend_from_slice(dh_value);
}

/// Append a DH-HMAC-CHAP_Success1 (`hl` is set even without a response:
/// the Linux host checks it).
pub fn encode_success1(out: &mut Vec<u8>, t_id: u16, hl: u8, response: Option<&[u8]>) {
    let h = Success1Header {
        auth_type: AUTH_TYPE_DHCHAP,
        auth_id: AUTH_ID_SUCCESS1,
        rsvd2: [0; 2],
        t_id: U16::new(t_id),
        hl,
        rsvd7: 0,
        rvalid: u8::from(response.is_some()),
        rsvd9: [0; 7],
    };
    out.extend_from_slice(h.as_bytes());
    if let Some(r) = response {
        out.extend_from_slice(r);
    }
}

fn encode_failure(out: &mut Vec<u8>, auth_id: u8, t_id: u16, rescode_exp: u8) {
    let f = Failure {
        auth_type: AUTH_TYPE_COMMON,
        auth_id,
        rsvd2: [0; 2],
        t_id: U16::new(t_id),
        rescode: FAILURE_RC,
        rescode_exp,
    };
    out.extend_from_slice(f.as_bytes());
}

/// Append an AUTH_Failure1 (controller to host).
pub fn encode_failure1(out: &mut Vec<u8>, t_id: u16, rescode_exp: u8) {
    encode_failure(out, AUTH_ID_FAILURE1, t_id, rescode_exp);
}

/// Append an AUTH_Failure2 (host to controller).
pub fn encode_failure2(out: &mut Vec<u8>, t_id: u16, rescode_exp: u8) {
    encode_failure(out, AUTH_ID_FAILURE2, t_id, rescode_exp);
}

/// Append an AUTH_Negotiate with one DH-HMAC-CHAP descriptor.
pub fn encode_negotiate(out: &mut Vec<u8>, t_id: u16, hashes: &[u8], dhgroups: &[u8]) {
    let h = NegotiateHeader {
        auth_type: AUTH_TYPE_COMMON,
        auth_id: AUTH_ID_NEGOTIATE,
        rsvd2: [0; 2],
        t_id: U16::new(t_id),
        sc_c: 0,
        napd: 1,
    };
    let mut d = ProtocolDescriptor {
        authid: AUTHID_DHCHAP,
        rsvd1: 0,
        halen: hashes.len().min(30) as u8,
        dhlen: dhgroups.len().min(30) as u8,
        hash_ids: [0; 30],
        dhgroup_ids: [0; 30],
    };
    let hn = hashes.len().min(30);
    let dn = dhgroups.len().min(30);
    d.hash_ids[..hn].copy_from_slice(&hashes[..hn]);
    d.dhgroup_ids[..dn].copy_from_slice(&dhgroups[..dn]);
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(d.as_bytes());
}

/// Append a DH-HMAC-CHAP_Reply. `host_challenge`: (S2, C2) when the host
/// asks the controller to authenticate itself; C2 must be as long as the
/// response.
pub fn encode_reply(
    out: &mut Vec<u8>,
    t_id: u16,
    response: &[u8],
    host_challenge: Option<(u32, &[u8])>,
    dh_value: &[u8],
) {
    let h = ReplyHeader {
        auth_type: AUTH_TYPE_DHCHAP,
        auth_id: AUTH_ID_REPLY,
        rsvd2: [0; 2],
        t_id: U16::new(t_id),
        hl: response.len() as u8,
        rsvd7: 0,
        cvalid: u8::from(host_challenge.is_some()),
        rsvd9: 0,
        dhvlen: U16::new(dh_value.len() as u16),
        seqnum: U32::new(host_challenge.map_or(0, |(s, _)| s)),
    };
    out.extend_from_slice(h.as_bytes());
    out.extend_from_slice(response);
    match host_challenge {
        Some((_, c)) => out.extend_from_slice(c),
        None => out.resize(out.len() + response.len(), 0),
    }
    out.extend_from_slice(dh_value);
}

/// Append a DH-HMAC-CHAP_Success2.
pub fn encode_success2(out: &mut Vec<u8>, t_id: u16) {
    let s = Success2 {
        auth_type: AUTH_TYPE_DHCHAP,
        auth_id: AUTH_ID_SUCCESS2,
        rsvd2: [0; 2],
        t_id: U16::new(t_id),
        rsvd6: [0; 10],
    };
    out.extend_from_slice(s.as_bytes());
}

#[cfg(test)]
mod tests {
    use super::*;
    use core::mem::offset_of;

    #[test]
    fn layouts() {
        assert_eq!(offset_of!(NegotiateHeader, t_id), 4);
        assert_eq!(offset_of!(NegotiateHeader, napd), 7);
        assert_eq!(offset_of!(ProtocolDescriptor, hash_ids), 4);
        assert_eq!(offset_of!(ProtocolDescriptor, dhgroup_ids), 34);
        assert_eq!(offset_of!(ChallengeHeader, hl), 6);
        assert_eq!(offset_of!(ChallengeHeader, hash_id), 8);
        assert_eq!(offset_of!(ChallengeHeader, dhgroup_id), 9);
        assert_eq!(offset_of!(ChallengeHeader, dhvlen), 10);
        assert_eq!(offset_of!(ChallengeHeader, seqnum), 12);
        assert_eq!(offset_of!(ReplyHeader, cvalid), 8);
        assert_eq!(offset_of!(ReplyHeader, dhvlen), 10);
        assert_eq!(offset_of!(ReplyHeader, seqnum), 12);
        assert_eq!(offset_of!(Success1Header, rvalid), 8);
        assert_eq!(offset_of!(Failure, rescode), 6);
        assert_eq!(offset_of!(Failure, rescode_exp), 7);
    }

    #[test]
    fn command_fields() {
        let c = Command::auth_send(7, 72);
        let b = c.as_bytes();
        assert_eq!(b[4], FabricsType::AuthSend as u8);
        assert_eq!(b[40], 0);
        assert_eq!(b[41], SPSP0_DHCHAP);
        assert_eq!(b[42], SPSP1_DHCHAP);
        assert_eq!(b[43], SECP_NVME);
        assert_eq!(u32::from_le_bytes(b[44..48].try_into().unwrap()), 72);
        assert!(c.is_dhchap_auth());
        assert_eq!(c.auth_len(), 72);
        let r = Command::auth_recv(8, 1024);
        assert_eq!(r.fctype(), FabricsType::AuthRecv as u8);
        assert_eq!(r.auth_len(), 1024);
    }

    #[test]
    fn negotiate_round_trip_and_rejects() {
        let mut m = Vec::new();
        encode_negotiate(&mut m, 3, &[1, 2, 3], &[0, 1, 2, 3, 4, 5]);
        assert_eq!(m.len(), 72);
        match parse_host_msg(&m).unwrap() {
            HostMsg::Negotiate {
                t_id,
                sc_c,
                descriptors,
            } => {
                assert_eq!((t_id, sc_c, descriptors.len()), (3, 0, 1));
                assert_eq!(descriptors[0].hashes(), &[1, 2, 3]);
                assert_eq!(descriptors[0].dhgroups(), &[0, 1, 2, 3, 4, 5]);
            }
            other => panic!("{other:?}"),
        }
        // napd says 2, one descriptor present.
        let mut bad = m.clone();
        bad[7] = 2;
        assert!(matches!(
            parse_host_msg(&bad),
            Err(AuthMsgError::Length { .. })
        ));
        // halen over 30.
        let mut bad = m.clone();
        bad[8 + 2] = 31;
        assert_eq!(
            parse_host_msg(&bad),
            Err(AuthMsgError::Field("halen/dhlen over 30"))
        );
        assert_eq!(parse_host_msg(&m[..5]), Err(AuthMsgError::Short(5)));
    }

    #[test]
    fn reply_round_trip_and_rejects() {
        let mut m = Vec::new();
        encode_reply(
            &mut m,
            9,
            &[0xaa; 32],
            Some((77, &[0xbb; 32])),
            &[0xcc; 256],
        );
        assert_eq!(m.len(), 16 + 64 + 256);
        match parse_host_msg(&m).unwrap() {
            HostMsg::Reply {
                t_id,
                hl,
                host_challenge,
                response,
                dh_value,
            } => {
                assert_eq!((t_id, hl), (9, 32));
                assert_eq!(host_challenge, Some((77, &[0xbb; 32][..])));
                assert_eq!(response, &[0xaa; 32]);
                assert_eq!(dh_value.len(), 256);
            }
            other => panic!("{other:?}"),
        }
        let mut bad = m.clone();
        bad[6] = 33;
        assert!(matches!(parse_host_msg(&bad), Err(AuthMsgError::Field(_))));
        let mut bad = m.clone();
        bad[8] = 2;
        assert_eq!(parse_host_msg(&bad), Err(AuthMsgError::Field("cvalid")));
        let mut bad = m.clone();
        bad[12..16].copy_from_slice(&[0; 4]);
        assert!(matches!(parse_host_msg(&bad), Err(AuthMsgError::Field(_))));
        assert!(matches!(
            parse_host_msg(&m[..m.len() - 4]),
            Err(AuthMsgError::Length { .. })
        ));
        let mut bad = m.clone();
        bad[10] = 2; // dhvlen 258
        assert!(matches!(parse_host_msg(&bad), Err(AuthMsgError::Field(_))));
    }

    #[test]
    fn success_failure_and_unknown() {
        let mut m = Vec::new();
        encode_success2(&mut m, 4);
        assert_eq!(parse_host_msg(&m), Ok(HostMsg::Success2 { t_id: 4 }));
        m.clear();
        encode_failure2(&mut m, 4, FAILURE_FAILED);
        assert_eq!(
            parse_host_msg(&m),
            Ok(HostMsg::Failure2 {
                t_id: 4,
                rescode: FAILURE_RC,
                rescode_exp: FAILURE_FAILED
            })
        );
        m.clear();
        encode_challenge(&mut m, 1, HASH_SHA256, DHGROUP_NULL, 5, &[1; 32], &[]);
        let e = parse_host_msg(&m).unwrap_err();
        assert_eq!(e.reason(), FAILURE_INCORRECT_PROTOCOL_MESSAGE);
        match parse_ctrl_msg(&m).unwrap() {
            CtrlMsg::Challenge {
                seqnum, challenge, ..
            } => assert_eq!((seqnum, challenge.len()), (5, 32)),
            other => panic!("{other:?}"),
        }
        m.clear();
        encode_success1(&mut m, 1, 48, Some(&[3; 48]));
        assert_eq!(
            parse_ctrl_msg(&m),
            Ok(CtrlMsg::Success1 {
                t_id: 1,
                hl: 48,
                response: Some(&[3; 48][..])
            })
        );
        m.clear();
        encode_failure1(&mut m, 2, FAILURE_HASH_UNUSABLE);
        assert_eq!(
            parse_ctrl_msg(&m),
            Ok(CtrlMsg::Failure1 {
                t_id: 2,
                rescode: 1,
                rescode_exp: FAILURE_HASH_UNUSABLE
            })
        );
    }
}
