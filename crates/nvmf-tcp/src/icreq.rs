//! Connection initialization: validates a host's ICReq and decides what the
//! ICResp says (PFV 0, CPDA 0, the digests the host asked for, MAXH2CDATA).

use crate::TcpParams;
use nvmf_wire::pdu::{
    encode_ic_resp, IcReq, PduError, FES_INVALID_HEADER_FIELD, FES_UNSUPPORTED_PARAMETER, PFV_1_0,
};

/// What a successful ICReq/ICResp exchange settled.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Negotiated {
    pub hdgst: bool,
    pub ddgst: bool,
    /// Host PDU data alignment (0-based, dwords): C2HData data starts at a
    /// multiple of (hpda + 1) × 4.
    pub hpda: u8,
    /// Largest H2CData payload the host may send in one PDU.
    pub maxh2cdata: u32,
}

/// Offsets of ICReq fields, for FEI.
const FEI_PFV: u32 = 8;
const FEI_HPDA: u32 = 10;

/// Checks `req` and, if it is acceptable, appends the ICResp to `out`.
pub fn answer(req: &IcReq, params: &TcpParams, out: &mut Vec<u8>) -> Result<Negotiated, PduError> {
    if req.pfv() != PFV_1_0 {
        return Err(PduError::new(
            FES_UNSUPPORTED_PARAMETER,
            FEI_PFV,
            "unsupported PDU format version",
        ));
    }
    if req.hpda() > 31 {
        return Err(PduError::new(
            FES_INVALID_HEADER_FIELD,
            FEI_HPDA,
            "HPDA out of range",
        ));
    }
    let n = Negotiated {
        hdgst: req.hdgst_enabled(),
        ddgst: req.ddgst_enabled(),
        hpda: req.hpda(),
        maxh2cdata: params.maxh2cdata,
    };
    encode_ic_resp(out, 0, n.hdgst, n.ddgst, n.maxh2cdata);
    Ok(n)
}
