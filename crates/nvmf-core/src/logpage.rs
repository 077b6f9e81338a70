//! Get Log Page (admin opcode 02h).
//!
//! Owns the log pages a controller offers and their bytes: supported log
//! pages (00h), error information (01h, no entries), SMART / health (02h),
//! firmware slot (03h), changed namespace list (04h, cleared on read),
//! commands supported and effects (05h), reservation notification (80h,
//! one notification per read, `Controller::take_reservation_notice`), and the discovery log (70h, built in
//! `discovery.rs`), and with ANA reporting the ANA log (0Ch, built in
//! `ana.rs`; LSP bit 0 = groups only). Handles NUMD/LPO (offset and length: what lies past the
//! page reads as zero, an offset past the page is Invalid Field) and RAE
//! (reading 04h/0Ch/70h without RAE re-arms the matching asynchronous event).

use nvmf_wire::command::Command;
use nvmf_wire::identify::fill_ascii;
use nvmf_wire::log::{FirmwareSlotLog, SmartLog, ANA_LSP_RGO};
use nvmf_wire::opcode::{AdminOpcode, IoOpcode, LogPageId};
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::{FromZeros, IntoBytes};

use crate::admin::{copy_out, AdminCtx};
use crate::ana::ana_log;
use crate::controller::{
    AEN_ANA_CHANGE, AEN_DISC_CHANGE, AEN_NS_ATTR, AEN_RESERVATION, CHANGED_NS_MAX,
};
use crate::discovery::discovery_log;
use crate::error::{Outcome, INVALID_FIELD, SGL_LENGTH_INVALID};
use crate::identify::FIRMWARE_REVISION;

/// Log page 00h: supported log pages.
const LID_SUPPORTED: u8 = 0x00;
/// Error log entries kept (Identify ELPE + 1); always empty.
const ERROR_LOG_ENTRIES: usize = 1;
/// Size of one error log entry.
const ERROR_LOG_ENTRY: usize = 64;
/// Commands Supported and Effects: command supported.
const CSUPP: u32 = 1 << 0;
/// Commands Supported and Effects: logical block content change.
const LBCC: u32 = 1 << 1;
/// Composite temperature reported in SMART (Kelvin, 25 °C).
const TEMPERATURE_K: u16 = 298;

/// Log pages an NVM controller offers; the last one (ANA) only with ANA
/// reporting.
const NVM_LIDS: [u8; 8] = [
    LID_SUPPORTED,
    LogPageId::Error as u8,
    LogPageId::Smart as u8,
    LogPageId::FirmwareSlot as u8,
    LogPageId::ChangedNsList as u8,
    LogPageId::CommandsSupported as u8,
    LogPageId::ReservationNotification as u8,
    LogPageId::AnaLog as u8,
];

/// Log pages a discovery controller offers.
const DISCOVERY_LIDS: [u8; 3] = [
    LID_SUPPORTED,
    LogPageId::Error as u8,
    LogPageId::Discovery as u8,
];

/// Execute a Get Log Page command.
pub(crate) fn execute(ctx: &mut AdminCtx<'_>, cmd: &Command, data: &mut [u8]) -> Outcome {
    if cmd.log_len_bytes() != data.len() as u64 {
        return Outcome::err(SGL_LENGTH_INVALID);
    }
    let offset = cmd.log_offset();
    if offset & 3 != 0 {
        return Outcome::err(INVALID_FIELD);
    }
    let lid = cmd.lid();
    let discovery = ctx.ctrl.is_discovery();
    let offered: &[u8] = if discovery {
        &DISCOVERY_LIDS
    } else if ctx.ctrl.subsystem().ana().is_some() {
        &NVM_LIDS
    } else {
        &NVM_LIDS[..NVM_LIDS.len() - 1]
    };
    if !offered.contains(&lid) {
        return Outcome::err(Status::INVALID_LOG_PAGE.with_dnr());
    }
    let rae = cmd.rae();

    if lid == LID_SUPPORTED {
        let mut page = [0u8; 1024];
        for &l in offered {
            let at = l as usize * 4;
            page[at..at + 4].copy_from_slice(&1u32.to_le_bytes());
        }
        return copy_out(&page, offset, data);
    }
    match LogPageId::try_from(lid) {
        Ok(LogPageId::Error) => {
            let page = [0u8; ERROR_LOG_ENTRIES * ERROR_LOG_ENTRY];
            copy_out(&page, offset, data)
        }
        Ok(LogPageId::Smart) => {
            let mut log = SmartLog::new_zeroed();
            log.temperature.set(TEMPERATURE_K);
            log.avail_spare = 100;
            log.spare_thresh = 10;
            copy_out(log.as_bytes(), offset, data)
        }
        Ok(LogPageId::FirmwareSlot) => {
            let mut log = FirmwareSlotLog::new_zeroed();
            log.afi = 1;
            fill_ascii(&mut log.frs[0], FIRMWARE_REVISION);
            copy_out(log.as_bytes(), offset, data)
        }
        Ok(LogPageId::ChangedNsList) => {
            let mut page = [0u8; CHANGED_NS_MAX * 4];
            for (slot, nsid) in page
                .chunks_exact_mut(4)
                .zip(ctx.ctrl.take_changed_namespaces())
            {
                slot.copy_from_slice(&nsid.to_le_bytes());
            }
            if !rae {
                ctx.ctrl.unmask_event(AEN_NS_ATTR);
            }
            copy_out(&page, offset, data)
        }
        Ok(LogPageId::CommandsSupported) => {
            // Command set identifier (CDW14 31:24): only NVM (0).
            if cmd.cdw14() >> 24 != 0 {
                return Outcome::err(Status::INVALID_LOG_PAGE.with_dnr());
            }
            copy_out(&commands_supported(), offset, data)
        }
        Ok(LogPageId::AnaLog) => {
            let (Some(ana), Some(path)) = (ctx.ctrl.subsystem().ana(), ctx.ctrl.ana_path()) else {
                return Outcome::err(Status::INVALID_LOG_PAGE.with_dnr());
            };
            let page = ana_log(ana, path, ctx.ns, cmd.lsp() & ANA_LSP_RGO != 0);
            if !rae {
                ctx.ctrl.unmask_event(AEN_ANA_CHANGE);
            }
            copy_out(&page, offset, data)
        }
        Ok(LogPageId::ReservationNotification) => {
            // One notification per read, oldest first; an empty page when
            // none waits.
            let e = ctx.ctrl.take_reservation_notice();
            let mut page = [0u8; 64];
            page[0..8].copy_from_slice(&e.count.to_le_bytes());
            page[8] = e.kind;
            page[9] = e.available;
            page[12..16].copy_from_slice(&e.nsid.to_le_bytes());
            if !rae {
                ctx.ctrl.unmask_event(AEN_RESERVATION);
                if e.available > 0 {
                    // More wait: announce the next one.
                    ctx.ctrl.raise_event(AEN_RESERVATION);
                }
            }
            copy_out(&page, offset, data)
        }
        Ok(LogPageId::Discovery) => {
            let page = discovery_log(ctx.target, ctx.ctrl.hostnqn(), ctx.port);
            if !rae {
                ctx.ctrl.unmask_event(AEN_DISC_CHANGE);
            }
            copy_out(&page, offset, data)
        }
        _ => Outcome::err(Status::INVALID_LOG_PAGE.with_dnr()),
    }
}

/// Log 05h: admin command entries 0..255, then I/O command entries.
pub fn commands_supported() -> [u8; 4096] {
    let mut page = [0u8; 4096];
    let mut set = |base: usize, opcode: u8, bits: u32| {
        let at = base + opcode as usize * 4;
        page[at..at + 4].copy_from_slice(&bits.to_le_bytes());
    };
    for op in [
        AdminOpcode::GetLogPage,
        AdminOpcode::Identify,
        AdminOpcode::Abort,
        AdminOpcode::SetFeatures,
        AdminOpcode::GetFeatures,
        AdminOpcode::AsyncEventRequest,
        AdminOpcode::KeepAlive,
    ] {
        set(0, op as u8, CSUPP);
    }
    for op in [
        IoOpcode::Flush,
        IoOpcode::Read,
        IoOpcode::DatasetManagement,
        IoOpcode::ReservationRegister,
        IoOpcode::ReservationReport,
        IoOpcode::ReservationAcquire,
        IoOpcode::ReservationRelease,
        IoOpcode::Compare,
        IoOpcode::Verify,
    ] {
        set(1024, op as u8, CSUPP);
    }
    for op in [IoOpcode::Write, IoOpcode::WriteZeroes] {
        set(1024, op as u8, CSUPP | LBCC);
    }
    page
}
