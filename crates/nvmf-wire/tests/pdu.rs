//! Decoder/encoder tests for NVMe/TCP PDUs: layouts, round trips for every
//! PDU type with and without digests, every decoder error path, and
//! truncation at every length.

use core::mem::offset_of;
use nvmf_wire::command::SglDescriptor;
use nvmf_wire::digest::crc32c;
use nvmf_wire::pdu::*;
use nvmf_wire::{Command, Completion, Status};

const DIGEST_COMBOS: [(bool, bool); 4] =
    [(false, false), (true, false), (false, true), (true, true)];

fn target(hdgst: bool, ddgst: bool) -> DecodeOpts {
    DecodeOpts {
        hdgst,
        ddgst,
        max_data_len: 1 << 20,
        role: Role::Target,
    }
}

fn host(hdgst: bool, ddgst: bool) -> DecodeOpts {
    DecodeOpts {
        role: Role::Host,
        ..target(hdgst, ddgst)
    }
}

/// Decode a buffer that must hold exactly one whole PDU, after checking that
/// every strict prefix reports Incomplete with a sensible `need`.
fn decode_whole<'a>(buf: &'a [u8], opts: &DecodeOpts) -> Pdu<'a> {
    for n in 0..buf.len() {
        match decode(&buf[..n], opts) {
            Ok(Decoded::Incomplete { need }) => {
                assert!(need > n, "need {need} at prefix {n}");
                assert!(need <= buf.len(), "need {need} > pdu len {}", buf.len());
            }
            other => panic!("prefix {n} of {}: {other:?}", buf.len()),
        }
    }
    // Trailing bytes (the next PDU) must not matter.
    let mut longer = buf.to_vec();
    longer.extend_from_slice(&[0xAA; 40]);
    let again = decode(&longer, opts).unwrap();
    match decode(buf, opts).unwrap() {
        Decoded::Pdu { len, pdu } => {
            assert_eq!(len, buf.len());
            match again {
                Decoded::Pdu { len: l2, pdu: p2 } => {
                    assert_eq!(l2, len);
                    assert_eq!(p2, pdu);
                }
                other => panic!("{other:?}"),
            }
            pdu
        }
        other => panic!("whole PDU: {other:?}"),
    }
}

fn decode_err(buf: &[u8], opts: &DecodeOpts) -> PduError {
    match decode(buf, opts) {
        Err(e) => e,
        other => panic!("expected error, got {other:?}"),
    }
}

#[test]
fn header_layouts() {
    assert_eq!(offset_of!(CommonHeader, pdu_type), 0);
    assert_eq!(offset_of!(CommonHeader, flags), 1);
    assert_eq!(offset_of!(CommonHeader, hlen), 2);
    assert_eq!(offset_of!(CommonHeader, pdo), 3);
    assert_eq!(offset_of!(CommonHeader, plen), 4);
    assert_eq!(offset_of!(IcReq, pfv), 8);
    assert_eq!(offset_of!(IcReq, hpda), 10);
    assert_eq!(offset_of!(IcReq, dgst), 11);
    assert_eq!(offset_of!(IcReq, maxr2t), 12);
    assert_eq!(offset_of!(IcResp, pfv), 8);
    assert_eq!(offset_of!(IcResp, cpda), 10);
    assert_eq!(offset_of!(IcResp, dgst), 11);
    assert_eq!(offset_of!(IcResp, maxh2cdata), 12);
    assert_eq!(offset_of!(TermReqHeader, fes), 8);
    assert_eq!(offset_of!(TermReqHeader, fei), 10);
    assert_eq!(offset_of!(CapsuleCmdHeader, cmd), 8);
    assert_eq!(offset_of!(CapsuleRespHeader, cqe), 8);
    assert_eq!(offset_of!(DataHeader, cccid), 8);
    assert_eq!(offset_of!(DataHeader, ttag), 10);
    assert_eq!(offset_of!(DataHeader, datao), 12);
    assert_eq!(offset_of!(DataHeader, datal), 16);
    assert_eq!(offset_of!(R2tHeader, cccid), 8);
    assert_eq!(offset_of!(R2tHeader, ttag), 10);
    assert_eq!(offset_of!(R2tHeader, r2to), 12);
    assert_eq!(offset_of!(R2tHeader, r2tl), 16);
    for ty in PduType::ALL {
        assert_eq!(PduType::try_from(ty as u8), Ok(ty));
    }
    assert!(PduType::try_from(8).is_err());
}

#[test]
fn ic_req_and_resp_round_trip() {
    let mut out = Vec::new();
    encode_ic_req(&mut out, 0, true, false, 3);
    assert_eq!(out.len(), 128);
    assert_eq!(&out[..8], &[0, 0, 128, 0, 128, 0, 0, 0]);
    assert_eq!(out[11], DGST_HDGST_ENABLE);
    // ICReq never carries digests, even if the opts say so.
    let Pdu::IcReq(r) = decode_whole(&out, &target(false, false)) else {
        panic!()
    };
    assert_eq!(
        (
            r.pfv(),
            r.hpda(),
            r.hdgst_enabled(),
            r.ddgst_enabled(),
            r.maxr2t()
        ),
        (0, 0, true, false, 3)
    );

    out.clear();
    encode_ic_resp(&mut out, 1, true, true, 131072);
    assert_eq!(&out[..8], &[1, 0, 128, 0, 128, 0, 0, 0]);
    let Pdu::IcResp(r) = decode_whole(&out, &host(true, true)) else {
        panic!()
    };
    assert_eq!(
        (
            r.cpda(),
            r.hdgst_enabled(),
            r.ddgst_enabled(),
            r.maxh2cdata()
        ),
        (1, true, true, 131072)
    );
}

#[test]
fn term_req_round_trip() {
    for (role, recv) in [(Role::Target, Role::Host), (Role::Host, Role::Target)] {
        for n in [0usize, 8, 24, 72, 128, 200] {
            let offending: Vec<u8> = (0..n as u8).collect();
            let mut out = Vec::new();
            encode_term_req(&mut out, role, FES_INVALID_HEADER_FIELD, 2, &offending);
            let sent = n.min(128);
            assert_eq!(out.len(), 24 + sent);
            assert_eq!(out[2], 24);
            assert_eq!(
                u32::from_le_bytes(out[4..8].try_into().unwrap()) as usize,
                24 + sent
            );
            let opts = DecodeOpts {
                hdgst: true,
                ddgst: true,
                ..DecodeOpts::new(recv)
            };
            let pdu = decode_whole(&out, &opts);
            let (hdr, data) = match pdu {
                Pdu::C2HTermReq { hdr, data } if role == Role::Target => (hdr, data),
                Pdu::H2CTermReq { hdr, data } if role == Role::Host => (hdr, data),
                other => panic!("{other:?}"),
            };
            assert_eq!((hdr.fes(), hdr.fei()), (1, 2));
            assert_eq!(data, &offending[..sent]);
        }
    }
}

fn sample_cmd() -> Command {
    let mut c = Command::new(0x01, 0x42);
    c.set_nsid(1).set_lba_range(100, 2);
    c
}

#[test]
fn capsule_cmd_round_trip() {
    for (hd, dd) in DIGEST_COMBOS {
        for pda in [0u8, 1, 7, 31] {
            for len in [0usize, 1, 4, 1024, 8192] {
                let data: Vec<u8> = (0..len).map(|i| (i * 13) as u8).collect();
                let mut cmd = sample_cmd();
                cmd.set_sgl(SglDescriptor::in_capsule(0, len as u32));
                let eo = EncodeOpts {
                    hdgst: hd,
                    ddgst: dd,
                    pda,
                };
                let mut out = Vec::new();
                encode_capsule_cmd(&mut out, &eo, &cmd, &data);
                let hdr_end = 72 + if hd { 4 } else { 0 };
                if len == 0 {
                    assert_eq!(out.len(), hdr_end);
                    assert_eq!(out[3], 0, "pdo 0 without data");
                    assert_eq!(out[1] & DDGSTF, 0);
                } else {
                    let align = (pda as usize + 1) * 4;
                    assert_eq!(out[3] as usize % align, 0);
                    assert!(out[3] as usize >= hdr_end);
                }
                assert_eq!(out[1] & HDGSTF != 0, hd);
                let pdu = decode_whole(&out, &target(hd, dd));
                let Pdu::CapsuleCmd {
                    hdr,
                    data: got,
                    data_digest_ok,
                } = pdu
                else {
                    panic!("{pdu:?}")
                };
                assert!(data_digest_ok);
                assert_eq!(hdr.cmd, cmd);
                assert_eq!(got, &data[..]);
                assert_eq!(pdu.data(), &data[..]);
            }
        }
    }
}

#[test]
fn capsule_resp_round_trip() {
    for (hd, dd) in DIGEST_COMBOS {
        let cqe = Completion::new(7, 1, 3, Status::LBA_OUT_OF_RANGE.with_dnr(), 0xdead);
        let mut out = Vec::new();
        encode_capsule_resp(&mut out, &EncodeOpts::new(hd, dd), &cqe);
        assert_eq!(out.len(), 24 + if hd { 4 } else { 0 });
        let Pdu::CapsuleResp(r) = decode_whole(&out, &host(hd, dd)) else {
            panic!()
        };
        assert_eq!(r.cqe, cqe);
        assert_eq!(r.cqe.status(), Status::LBA_OUT_OF_RANGE.with_dnr());
    }
}

#[test]
fn r2t_round_trip() {
    for (hd, dd) in DIGEST_COMBOS {
        let mut out = Vec::new();
        encode_r2t(&mut out, &EncodeOpts::new(hd, dd), 9, 0x55, 4096, 65536);
        let Pdu::R2T(r) = decode_whole(&out, &host(hd, dd)) else {
            panic!()
        };
        assert_eq!(
            (r.cccid(), r.ttag(), r.r2to(), r.r2tl()),
            (9, 0x55, 4096, 65536)
        );
        assert_eq!(r.ch.flags & HDGSTF != 0, hd);
    }
}

#[test]
fn data_pdus_round_trip() {
    for (hd, dd) in DIGEST_COMBOS {
        for pda in [0u8, 3] {
            for len in [1usize, 512, 4096, 65536] {
                let data: Vec<u8> = (0..len).map(|i| (i % 251) as u8).collect();
                let eo = EncodeOpts {
                    hdgst: hd,
                    ddgst: dd,
                    pda,
                };

                // C2HData written in two steps, data copied straight into the send buffer.
                let mut out = Vec::with_capacity(len + 64);
                let start = encode_c2h_data_header(
                    &mut out,
                    &eo,
                    5,
                    0,
                    8192,
                    len as u32,
                    DATA_LAST | DATA_SUCCESS,
                );
                assert_eq!(start, out[3] as usize);
                out.extend_from_slice(&data);
                append_data_digest(&mut out, &eo, start);
                let mut whole = Vec::new();
                encode_c2h_data(&mut whole, &eo, 5, 8192, &data, DATA_LAST | DATA_SUCCESS);
                assert_eq!(out, whole);
                let pdu = decode_whole(&out, &host(hd, dd));
                let Pdu::C2HData {
                    hdr,
                    data: got,
                    data_digest_ok,
                } = pdu
                else {
                    panic!()
                };
                assert!(data_digest_ok);
                assert_eq!(
                    (hdr.cccid(), hdr.datao(), hdr.datal()),
                    (5, 8192, len as u32)
                );
                assert!(hdr.last() && hdr.success());
                assert_eq!(hdr.flags() & DDGSTF != 0, dd);
                assert_eq!(got, &data[..]);
                if dd {
                    let tail = &out[out.len() - 4..];
                    assert_eq!(tail, &crc32c(&data).to_le_bytes());
                }

                // H2CData.
                let mut out = Vec::new();
                encode_h2c_data(&mut out, &eo, 6, 0x77, 0, &data, DATA_LAST);
                let Pdu::H2CData {
                    hdr,
                    data: got,
                    data_digest_ok,
                } = decode_whole(&out, &target(hd, dd))
                else {
                    panic!()
                };
                assert!(data_digest_ok);
                assert_eq!(
                    (hdr.cccid(), hdr.ttag(), hdr.datao(), hdr.datal()),
                    (6, 0x77, 0, len as u32)
                );
                assert!(hdr.last() && !hdr.success());
                assert_eq!(got, &data[..]);
            }
        }
    }
}

#[test]
fn header_digest_is_crc_of_header_le() {
    let mut out = Vec::new();
    encode_capsule_resp(
        &mut out,
        &EncodeOpts::new(true, false),
        &Completion::default(),
    );
    assert_eq!(&out[24..28], &crc32c(&out[..24]).to_le_bytes());
}

// ---- error paths ----

#[test]
fn unknown_type_rejected_after_8_bytes() {
    for ty in [8u8, 0x0a, 0x10, 0xff] {
        let buf = [ty, 0, 24, 0, 24, 0, 0, 0];
        assert!(matches!(
            decode(&buf[..7], &target(false, false)),
            Ok(Decoded::Incomplete { need: 8 })
        ));
        let e = decode_err(&buf, &target(false, false));
        assert_eq!((e.fes(), e.fei()), (FES_INVALID_HEADER_FIELD, 0), "{e}");
    }
}

#[test]
fn wrong_direction_rejected() {
    let mut out = Vec::new();
    encode_capsule_resp(&mut out, &EncodeOpts::default(), &Completion::default());
    let e = decode_err(&out[..8], &target(false, false));
    assert_eq!((e.fes(), e.fei()), (1, 0));
    let mut out = Vec::new();
    encode_capsule_cmd(&mut out, &EncodeOpts::default(), &sample_cmd(), &[]);
    let e = decode_err(&out, &host(false, false));
    assert_eq!((e.fes(), e.fei()), (1, 0));
    for ty in PduType::ALL {
        let buf = [ty as u8, 0, ty.hlen() as u8, 0, ty.hlen() as u8, 0, 0, 0];
        let opts = DecodeOpts::new(ty.sender());
        assert_eq!(decode_err(&buf, &opts).fei(), 0, "{ty:?}");
    }
}

#[test]
fn bad_hlen_rejected() {
    let mut out = Vec::new();
    encode_capsule_cmd(&mut out, &EncodeOpts::default(), &sample_cmd(), &[]);
    out[2] = 24;
    let e = decode_err(&out[..8], &target(false, false));
    assert_eq!((e.fes(), e.fei()), (1, 2));
    let mut out = Vec::new();
    encode_ic_req(&mut out, 0, false, false, 0);
    out[2] = 127;
    assert_eq!(decode_err(&out[..8], &target(false, false)).fei(), 2);
}

#[test]
fn bad_pdo_rejected() {
    let data = [1u8; 64];
    let eo = EncodeOpts::default();
    let mut out = Vec::new();
    encode_h2c_data(&mut out, &eo, 1, 1, 0, &data, DATA_LAST);
    for bad_pdo in [0u8, 8, 23, 200] {
        let mut b = out.clone();
        b[3] = bad_pdo;
        let e = decode_err(&b[..8], &target(false, false));
        assert_eq!((e.fes(), e.fei()), (1, 3), "pdo {bad_pdo}: {e}");
    }
    // In a capsule, PDO 0 is fine without data but not with data.
    let mut out = Vec::new();
    encode_capsule_cmd(&mut out, &eo, &sample_cmd(), &data);
    out[3] = 0;
    assert_eq!(decode_err(&out[..8], &target(false, false)).fei(), 3);
    // PDO inside the header digest.
    let mut out = Vec::new();
    encode_capsule_cmd(
        &mut out,
        &EncodeOpts::new(true, false),
        &sample_cmd(),
        &data,
    );
    assert_eq!(out[3], 76);
    out[3] = 74;
    assert_eq!(decode_err(&out[..8], &target(true, false)).fei(), 3);
}

#[test]
fn bad_plen_rejected() {
    let eo = EncodeOpts::default();
    // Shorter than the header.
    let mut out = Vec::new();
    encode_capsule_cmd(&mut out, &eo, &sample_cmd(), &[]);
    out[4] = 71;
    let e = decode_err(&out[..8], &target(false, false));
    assert_eq!((e.fes(), e.fei()), (1, 4));
    // ICReq must be exactly 128.
    let mut out = Vec::new();
    encode_ic_req(&mut out, 0, false, false, 0);
    out[4] = 129;
    assert_eq!(decode_err(&out[..8], &target(false, false)).fei(), 4);
    // CapsuleResp / R2T have no data.
    let mut out = Vec::new();
    encode_r2t(&mut out, &eo, 1, 1, 0, 10);
    out[4] = 28;
    assert_eq!(decode_err(&out[..8], &host(false, false)).fei(), 4);
    // TermReq carries at most 128 bytes.
    let mut out = Vec::new();
    encode_term_req(&mut out, Role::Host, 1, 0, &[0; 128]);
    out[4] = 153;
    assert_eq!(decode_err(&out[..8], &target(false, false)).fei(), 4);
    // H2CData shorter than header + data digest.
    let mut out = Vec::new();
    encode_h2c_data(&mut out, &EncodeOpts::new(false, true), 1, 1, 0, &[1], 0);
    out[4] = 27;
    out[5] = 0;
    assert_eq!(decode_err(&out[..8], &target(false, true)).fei(), 4);
}

#[test]
fn data_limit_exceeded() {
    let opts = DecodeOpts {
        max_data_len: 4096,
        ..target(false, false)
    };
    let mut out = Vec::new();
    encode_h2c_data_header(&mut out, &EncodeOpts::default(), 1, 1, 0, 4096, DATA_LAST);
    assert!(matches!(
        decode(&out, &opts),
        Ok(Decoded::Incomplete { need: 4120 })
    ));
    let mut out = Vec::new();
    encode_h2c_data_header(&mut out, &EncodeOpts::default(), 1, 1, 0, 4097, DATA_LAST);
    let e = decode_err(&out[..8], &opts);
    assert_eq!(e.fes(), FES_DATA_LIMIT_EXCEEDED);
    // A huge PLEN is rejected before waiting for it.
    let buf = [4u8, 0, 72, 72, 0xff, 0xff, 0xff, 0xff];
    assert_eq!(decode_err(&buf, &opts).fes(), FES_DATA_LIMIT_EXCEEDED);
}

#[test]
fn header_digest_mismatch() {
    let eo = EncodeOpts::new(true, false);
    let mut out = Vec::new();
    encode_capsule_cmd(&mut out, &eo, &sample_cmd(), &[]);
    for flip in [8usize, 40, 71, 72, 75] {
        let mut b = out.clone();
        b[flip] ^= 0x10;
        let e = decode_err(&b, &target(true, false));
        assert_eq!(e.fes(), FES_HEADER_DIGEST_ERROR, "flip {flip}");
    }
}

#[test]
fn digest_flags_must_match_negotiation() {
    // Header digest negotiated but missing.
    let mut out = Vec::new();
    encode_capsule_resp(&mut out, &EncodeOpts::default(), &Completion::default());
    let e = decode_err(&out, &host(true, false));
    assert_eq!((e.fes(), e.fei()), (1, 1));
    // Header digest present but not negotiated.
    let mut out = Vec::new();
    encode_capsule_resp(
        &mut out,
        &EncodeOpts::new(true, false),
        &Completion::default(),
    );
    assert_eq!(decode_err(&out, &host(false, false)).fei(), 1);
    // Data digest present but not negotiated.
    let mut out = Vec::new();
    encode_c2h_data(
        &mut out,
        &EncodeOpts::new(false, true),
        1,
        0,
        &[1, 2, 3],
        DATA_LAST,
    );
    assert_eq!(decode_err(&out, &host(false, false)).fei(), 1);
    // Data digest negotiated but missing on a PDU with data.
    let mut out = Vec::new();
    encode_c2h_data(
        &mut out,
        &EncodeOpts::default(),
        1,
        0,
        &[1, 2, 3],
        DATA_LAST,
    );
    assert_eq!(decode_err(&out, &host(false, true)).fei(), 1);
    // ... but a capsule without data needs no data digest.
    let mut out = Vec::new();
    encode_capsule_cmd(&mut out, &EncodeOpts::new(false, true), &sample_cmd(), &[]);
    assert!(matches!(
        decode_whole(&out, &target(false, true)),
        Pdu::CapsuleCmd { .. }
    ));
}

#[test]
fn data_digest_mismatch_is_not_fatal() {
    let eo = EncodeOpts::new(true, true);
    let data = [9u8; 100];
    let mut out = Vec::new();
    encode_h2c_data(&mut out, &eo, 3, 4, 0, &data, DATA_LAST);
    let n = out.len();
    out[n - 1] ^= 1;
    let pdu = decode_whole(&out, &target(true, true));
    let Pdu::H2CData {
        hdr,
        data_digest_ok,
        ..
    } = pdu
    else {
        panic!()
    };
    assert!(!data_digest_ok);
    assert!(!pdu.data_digest_ok());
    assert_eq!(hdr.cccid(), 3);
    // Corrupt data rather than the digest.
    let mut out = Vec::new();
    encode_capsule_cmd(&mut out, &eo, &sample_cmd(), &data);
    let n = out.len();
    out[n - 10] ^= 0x80;
    assert!(!decode_whole(&out, &target(true, true)).data_digest_ok());
    let mut out = Vec::new();
    encode_c2h_data(&mut out, &eo, 3, 0, &data, DATA_LAST);
    let n = out.len();
    out[n - 5] ^= 0x80;
    assert!(!decode_whole(&out, &host(true, true)).data_digest_ok());
}

#[test]
fn datal_mismatch_and_success_without_last() {
    let eo = EncodeOpts::default();
    let mut out = Vec::new();
    encode_h2c_data(&mut out, &eo, 1, 1, 0, &[0; 16], DATA_LAST);
    out[16] = 15;
    let e = decode_err(&out, &target(false, false));
    assert_eq!((e.fes(), e.fei()), (1, 16));

    let mut out = Vec::new();
    encode_c2h_data(&mut out, &eo, 1, 0, &[0; 16], DATA_SUCCESS);
    let e = decode_err(&out, &host(false, false));
    assert_eq!((e.fes(), e.fei()), (1, 1));
}

#[test]
fn term_req_for_an_error() {
    let buf = [0x04u8, 0, 72, 72, 0xff, 0xff, 0, 0];
    let e = decode_err(
        &buf,
        &DecodeOpts {
            max_data_len: 8192,
            ..target(false, false)
        },
    );
    let mut out = Vec::new();
    encode_term_req(
        &mut out,
        Role::Target,
        e.fes(),
        e.fei(),
        offending_header(&buf),
    );
    assert_eq!(out.len(), 24 + 8);
    let Pdu::C2HTermReq { hdr, data } = decode_whole(&out, &host(false, false)) else {
        panic!()
    };
    assert_eq!(hdr.fes(), FES_DATA_LIMIT_EXCEEDED);
    assert_eq!(data, &buf);

    let mut long = vec![0u8; 300];
    long[2] = 128;
    assert_eq!(offending_header(&long).len(), 128);
    long[2] = 24;
    assert_eq!(offending_header(&long).len(), 24);
    long[2] = 0;
    assert_eq!(offending_header(&long).len(), 8);
    assert_eq!(offending_header(&long[..3]).len(), 3);
    assert_eq!(offending_header(&[]).len(), 0);
}

#[test]
fn stream_of_pdus() {
    // Several PDUs back to back are decoded one after another.
    let eo = EncodeOpts::new(true, true);
    let mut out = Vec::new();
    encode_capsule_cmd(&mut out, &eo, &sample_cmd(), &[5; 512]);
    encode_h2c_data(&mut out, &eo, 1, 2, 0, &[6; 1000], DATA_LAST);
    encode_term_req(&mut out, Role::Host, 2, 0, &[]);
    let opts = target(true, true);
    let mut rest = &out[..];
    let mut types = Vec::new();
    while !rest.is_empty() {
        match decode(rest, &opts).unwrap() {
            Decoded::Pdu { len, pdu } => {
                types.push(pdu.pdu_type());
                rest = &rest[len..];
            }
            Decoded::Incomplete { .. } => panic!(),
        }
    }
    assert_eq!(
        types,
        [PduType::CapsuleCmd, PduType::H2CData, PduType::H2CTermReq]
    );
}

#[test]
fn encoders_append_without_reallocating() {
    let mut out = Vec::with_capacity(4096);
    let ptr = out.as_ptr();
    let eo = EncodeOpts::new(true, true);
    encode_capsule_resp(&mut out, &eo, &Completion::default());
    encode_r2t(&mut out, &eo, 1, 1, 0, 4096);
    let start = encode_c2h_data_header(&mut out, &eo, 1, 0, 0, 1024, DATA_LAST);
    out.extend_from_slice(&[0u8; 1024]);
    append_data_digest(&mut out, &eo, start);
    assert_eq!(out.as_ptr(), ptr);
}

#[test]
fn peek_layout_before_data_arrives() {
    let eo = EncodeOpts {
        hdgst: true,
        ddgst: true,
        pda: 1,
    };
    let data = [3u8; 5000];
    let mut out = Vec::new();
    encode_h2c_data(&mut out, &eo, 1, 2, 0, &data, DATA_LAST);
    let opts = target(true, true);
    assert_eq!(peek_layout(&out[..7], &opts), Ok(None));
    let l = peek_layout(&out[..8], &opts).unwrap().unwrap();
    assert_eq!(l.ty, PduType::H2CData);
    assert!(l.hdgst && l.ddgst);
    assert_eq!(l.data_start, 32);
    assert_eq!(l.data_len(), 5000);
    assert_eq!(l.plen, out.len());
    assert_eq!(&out[l.data_start..l.data_end()], &data[..]);
    assert_eq!(peek_layout(&[0xff; 8], &opts).unwrap_err().fei(), 0);
}
