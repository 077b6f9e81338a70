//! Admin command execution (everything on the admin queue but Fabrics commands).
//!
//! Owns opcode dispatch for NVM and discovery controllers, Get/Set Features,
//! Asynchronous Event Request queuing, Keep Alive and Abort. Identify and
//! Get Log Page live in `identify.rs` and `logpage.rs`.
//!
//! Abort reaches what is outstanding on this admin queue (an Asynchronous
//! Event Request named by (SQID 0, CID) completes with Command Aborted by
//! Request, delivered by `QueuePair::poll`, and the Abort reports
//! "aborted": dword 0 bit 0 clear) and on the controller's I/O queues,
//! which live on other connections, possibly other reactors: the Abort
//! waits (`abort_io`) until that queue looked at the command on its next
//! poll; a command still waiting for a buffer or QoS tokens is aborted,
//! one whose data is arriving or that is in a backend is "not aborted"
//! (bit 0 set), as the spec allows (docs/DESIGN.md, "Abort").

use std::sync::Arc;

use nvmf_wire::command::Command;
use nvmf_wire::opcode::{AdminOpcode, FeatureId};
use nvmf_wire::status::Status;

use crate::controller::{Controller, TEMP_OVER_DEFAULT_K};
use crate::error::{Outcome, INVALID_FIELD, INVALID_OPCODE};
use crate::namespace::NamespaceTable;
use crate::queue::{PortInfo, AER_LIMIT};
use crate::target::Target;
use crate::{identify, logpage};

/// What an admin command handler needs.
pub(crate) struct AdminCtx<'a> {
    pub target: &'a Arc<Target>,
    pub port: &'a Arc<PortInfo>,
    pub ctrl: &'a Arc<Controller>,
    pub ns: &'a Arc<NamespaceTable>,
    pub aers: &'a mut Vec<u16>,
    /// CIDs of AERs aborted by an Abort, to complete with Aborted by Request.
    pub aborted: &'a mut Vec<u16>,
    /// The admin queue's completion sink (commands finished on another
    /// thread: Set Features Reservation Persistence on a PTPL namespace,
    /// Aborts answered by an I/O queue).
    pub sink: &'a Arc<crate::backend::CompletionSink>,
    /// CIDs of Aborts waiting for an I/O queue's answer (it comes through
    /// `sink`; the queue turns it into dword 0).
    pub abort_waits: &'a mut Vec<u16>,
}

/// How an admin command ended.
#[derive(Debug)]
pub(crate) enum AdminResult {
    /// Complete now.
    Done(Outcome),
    /// An Asynchronous Event Request was queued, or the command runs on
    /// another thread; it completes through `poll`.
    Queued,
}

/// Execute one admin command.
pub(crate) fn execute(ctx: &mut AdminCtx<'_>, cmd: &Command, data: &mut [u8]) -> AdminResult {
    let Ok(op) = AdminOpcode::try_from(cmd.opcode()) else {
        return AdminResult::Done(Outcome::err(INVALID_OPCODE));
    };
    if ctx.ctrl.is_discovery()
        && !matches!(
            op,
            AdminOpcode::Identify
                | AdminOpcode::GetLogPage
                | AdminOpcode::GetFeatures
                | AdminOpcode::SetFeatures
                | AdminOpcode::AsyncEventRequest
                | AdminOpcode::KeepAlive
        )
    {
        return AdminResult::Done(Outcome::err(INVALID_OPCODE));
    }
    let out = match op {
        AdminOpcode::Identify => identify::execute(ctx, cmd, data),
        AdminOpcode::GetLogPage => logpage::execute(ctx, cmd, data),
        AdminOpcode::GetFeatures => get_features(ctx, cmd, data),
        AdminOpcode::SetFeatures
            if cmd.fid() == FeatureId::ReservationPersistence as u8 && !ctx.ctrl.is_discovery() =>
        {
            return set_reservation_persistence(ctx, cmd);
        }
        AdminOpcode::SetFeatures => set_features(ctx, cmd, data),
        AdminOpcode::AsyncEventRequest => {
            if ctx.aers.len() >= AER_LIMIT {
                Outcome::err(Status::ASYNC_EVENT_LIMIT_EXCEEDED.with_dnr())
            } else {
                ctx.aers.push(cmd.cid());
                return AdminResult::Queued;
            }
        }
        // The admin queue already recorded the activity.
        AdminOpcode::KeepAlive => Outcome::ok(),
        AdminOpcode::Abort => {
            let sqid = (cmd.cdw10() & 0xFFFF) as u16;
            if sqid != 0 {
                return abort_io(ctx, cmd, sqid);
            }
            abort(ctx, cmd)
        }
        // Create/Delete I/O SQ/CQ do not exist on fabrics; the rest is unsupported.
        _ => Outcome::err(INVALID_OPCODE),
    };
    AdminResult::Done(out)
}

/// Abort (08h): CDW10 bits 15:0 SQID, 31:16 CID. Only an outstanding AER
/// on the admin queue can be aborted here (see the top comment).
fn abort(ctx: &mut AdminCtx<'_>, cmd: &Command) -> Outcome {
    let sqid = cmd.cdw10() & 0xFFFF;
    let cid = (cmd.cdw10() >> 16) as u16;
    if sqid == 0 {
        if let Some(i) = ctx.aers.iter().position(|&c| c == cid) {
            ctx.aers.remove(i);
            ctx.aborted.push(cid);
            return Outcome::ok_dw0(0);
        }
    }
    // Not found, already completed, or on an I/O queue: not aborted.
    Outcome::ok_dw0(1)
}

/// Abort of a command on I/O queue `sqid`: the queue (on whichever
/// reactor) looks at it on its next poll and answers through this queue's
/// sink; a command still waiting for a data buffer or for QoS tokens is
/// aborted (Command Aborted by Request), anything else (data arriving,
/// in a backend, done, unknown) is "not aborted". A queue not connected:
/// "not aborted" at once; over [`crate::controller::ABORT_LIMIT`] waiting:
/// Abort Command Limit Exceeded.
fn abort_io(ctx: &mut AdminCtx<'_>, cmd: &Command, sqid: u16) -> AdminResult {
    if ctx.abort_waits.len() >= crate::controller::ABORT_LIMIT {
        return AdminResult::Done(Outcome::err(Status::ABORT_LIMIT_EXCEEDED));
    }
    let ask = crate::controller::AbortAsk {
        sqid,
        cid: (cmd.cdw10() >> 16) as u16,
        abort_cid: cmd.cid(),
        reply: ctx.sink.clone(),
    };
    match ctx.ctrl.ask_abort(ask) {
        Ok(()) => {
            ctx.abort_waits.push(cmd.cid());
            AdminResult::Queued
        }
        Err(_) => AdminResult::Done(Outcome::ok_dw0(1)),
    }
}

/// Asynchronous Event Configuration bits 4:0: SMART / health critical warnings.
const AEC_SMART_WARNINGS: u32 = 0x1F;

/// Get Features "supported capabilities" bits (SEL = 3).
const CAP_CHANGEABLE: u32 = 1 << 2;

/// Feature IDs that have nothing to configure on fabrics; Get answers 0.
const FID_ZERO_VALUED: [u8; 4] = [
    FeatureId::Arbitration as u8,
    FeatureId::PowerManagement as u8,
    FeatureId::ErrorRecovery as u8,
    FeatureId::InterruptCoalescing as u8,
];

/// Temperature Threshold (feature 04h) CDW11: TMPTH 15:0, TMPSEL 19:16,
/// THSEL 21:20. Only the composite temperature (TMPSEL 0; 1111b = all
/// sensors, for Set) exists; THSEL 0 = over, 1 = under. Anything else is
/// Invalid Field. Returns (under, threshold).
fn temp_threshold_select(cdw11: u32, set: bool) -> Option<(bool, u16)> {
    let tmpsel = (cdw11 >> 16) & 0xF;
    let thsel = (cdw11 >> 20) & 0x3;
    if !(tmpsel == 0 || (set && tmpsel == 0xF)) || thsel > 1 {
        return None;
    }
    Some((thsel == 1, cdw11 as u16))
}

fn discovery_feature_allowed(fid: u8) -> bool {
    fid == FeatureId::KeepAliveTimer as u8 || fid == FeatureId::AsyncEventConfig as u8
}

fn get_features(ctx: &mut AdminCtx<'_>, cmd: &Command, data: &mut [u8]) -> Outcome {
    let ctrl = ctx.ctrl;
    let fid = cmd.fid();
    if ctrl.is_discovery() && !discovery_feature_allowed(fid) {
        return Outcome::err(INVALID_FIELD);
    }
    let sel = cmd.sel();
    if sel > 3 {
        return Outcome::err(INVALID_FIELD);
    }
    let changeable = matches!(
        FeatureId::try_from(fid),
        Ok(FeatureId::NumberOfQueues
            | FeatureId::AsyncEventConfig
            | FeatureId::KeepAliveTimer
            | FeatureId::VolatileWriteCache
            | FeatureId::TemperatureThreshold
            | FeatureId::ReservationNotificationMask
            | FeatureId::ReservationPersistence)
    );
    let value = match FeatureId::try_from(fid) {
        Ok(FeatureId::ReservationNotificationMask) => match ctx.ns.get(cmd.nsid()) {
            Some(_) if sel == 1 => 0,
            Some(_) => ctrl.reservation_mask(cmd.nsid()),
            None => return Outcome::err(INVALID_FIELD),
        },
        Ok(FeatureId::ReservationPersistence) => match ctx.ns.get(cmd.nsid()) {
            Some(_) if sel == 1 => 0,
            Some(ns) => u32::from(ns.reservations().snapshot().ptpl),
            None => return Outcome::err(INVALID_FIELD),
        },
        Ok(FeatureId::NumberOfQueues) => {
            let n = u32::from(ctrl.num_io_queues().max(1) - 1);
            n | (n << 16)
        }
        Ok(FeatureId::AsyncEventConfig) => ctrl.aen_enabled(),
        Ok(FeatureId::KeepAliveTimer) => ctrl.kato_ms(),
        Ok(FeatureId::VolatileWriteCache) => u32::from(ctrl.write_cache_enabled()),
        Ok(FeatureId::TemperatureThreshold) => {
            let Some((under, _)) = temp_threshold_select(cmd.cdw11(), false) else {
                return Outcome::err(INVALID_FIELD);
            };
            if sel == 1 {
                // Default.
                return Outcome::ok_dw0(if under {
                    0
                } else {
                    u32::from(TEMP_OVER_DEFAULT_K)
                });
            }
            u32::from(ctrl.temp_threshold(under))
        }
        Ok(FeatureId::HostIdentifier) => {
            // Only the 128-bit form (EXHID, CDW11 bit 0) exists on fabrics.
            if cmd.cdw11() & 1 == 0 {
                return Outcome::err(INVALID_FIELD);
            }
            if sel != 3 {
                let hostid = ctrl.hostid();
                let n = data.len().min(hostid.len());
                data[..n].copy_from_slice(&hostid[..n]);
                data[n..].fill(0);
            }
            0
        }
        Ok(_) if FID_ZERO_VALUED.contains(&fid) => 0,
        _ => return Outcome::err(INVALID_FIELD),
    };
    if sel == 3 {
        return Outcome::ok_dw0(if changeable { CAP_CHANGEABLE } else { 0 });
    }
    if sel == 1 {
        // Defaults.
        let default = match FeatureId::try_from(fid) {
            Ok(FeatureId::NumberOfQueues) => {
                let n = u32::from(ctrl.max_io_queues().max(1) - 1);
                n | (n << 16)
            }
            Ok(FeatureId::AsyncEventConfig) => ctrl.supported_events(),
            Ok(FeatureId::VolatileWriteCache) => 1,
            _ => value,
        };
        return Outcome::ok_dw0(default);
    }
    Outcome::ok_dw0(value)
}

fn set_features(ctx: &mut AdminCtx<'_>, cmd: &Command, _data: &mut [u8]) -> Outcome {
    let ctrl = ctx.ctrl;
    let fid = cmd.fid();
    if ctrl.is_discovery() && !discovery_feature_allowed(fid) {
        return Outcome::err(INVALID_FIELD);
    }
    let known = FeatureId::try_from(fid);
    if cmd.save() {
        // Nothing is saveable; unknown features stay Invalid Field.
        return match known {
            Ok(_) => Outcome::err(Status::FEATURE_NOT_SAVEABLE.with_dnr()),
            Err(_) => Outcome::err(INVALID_FIELD),
        };
    }
    let cdw11 = cmd.cdw11();
    match known {
        Ok(FeatureId::NumberOfQueues) => {
            let nsqr = cdw11 & 0xFFFF;
            let ncqr = cdw11 >> 16;
            if nsqr == 0xFFFF || ncqr == 0xFFFF {
                return Outcome::err(INVALID_FIELD);
            }
            // No more than the transport allows per controller, nor than
            // the host may still connect under its per-host I/O queue
            // limit (at least 1: the field cannot say 0; Connect enforces).
            let mut max = u32::from(ctrl.max_io_queues().max(1));
            if let Some(left) = ctx.target.io_queue_budget(ctrl.hostnqn()) {
                max = max.min(left.clamp(1, u16::MAX as usize) as u32);
            }
            let nsqa = (nsqr + 1).min(max);
            let ncqa = (ncqr + 1).min(max);
            ctrl.set_num_io_queues(nsqa.min(ncqa) as u16);
            Outcome::ok_dw0((nsqa - 1) | ((ncqa - 1) << 16))
        }
        Ok(FeatureId::AsyncEventConfig) => {
            // SMART critical warning bits are accepted (as nvmet does) but
            // never raised; notices must be ones this controller reports.
            if cdw11 & !(ctrl.supported_events() | AEC_SMART_WARNINGS) != 0 {
                return Outcome::err(INVALID_FIELD);
            }
            ctrl.set_aen_enabled(cdw11);
            Outcome::ok_dw0(cdw11)
        }
        Ok(FeatureId::KeepAliveTimer) => {
            // A discovery controller is always reaped: KATO 0 there means
            // the target's discovery default, as at Connect.
            let kato = if cdw11 == 0 && ctrl.is_discovery() {
                ctx.target.discovery_kato_ms()
            } else {
                cdw11
            };
            ctrl.set_kato_ms(kato);
            Outcome::ok()
        }
        Ok(FeatureId::VolatileWriteCache) => {
            ctrl.set_write_cache_enabled(cdw11 & 1 != 0);
            Outcome::ok()
        }
        Ok(FeatureId::TemperatureThreshold) => match temp_threshold_select(cdw11, true) {
            Some((under, kelvin)) => {
                ctrl.set_temp_threshold(under, kelvin);
                Outcome::ok()
            }
            None => Outcome::err(INVALID_FIELD),
        },
        Ok(FeatureId::ReservationNotificationMask) => {
            // Bits 1..3: registration preempted, reservation released,
            // reservation preempted.
            let mask = cdw11 & 0xE;
            let nsid = cmd.nsid();
            if nsid == 0xFFFF_FFFF {
                ctrl.set_reservation_mask(ctx.ns.active_nsids(), mask);
            } else if ctx.ns.get(nsid).is_some() {
                ctrl.set_reservation_mask(&[nsid], mask);
            } else {
                return Outcome::err(INVALID_FIELD);
            }
            Outcome::ok()
        }
        // The host identifier comes from Connect on fabrics.
        Ok(FeatureId::HostIdentifier) => Outcome::err(Status::COMMAND_SEQUENCE_ERROR.with_dnr()),
        _ => Outcome::err(INVALID_FIELD),
    }
}

/// Set Features Reservation Persistence (83h): CDW11 bit 0 PTPL, for the
/// namespace the command names. Needs the namespace's PTPL file to turn it
/// on; the file is written on the `nvmfd-ptpl` thread and the command
/// completes once it is on disk.
fn set_reservation_persistence(ctx: &mut AdminCtx<'_>, cmd: &Command) -> AdminResult {
    if cmd.save() {
        return AdminResult::Done(Outcome::err(Status::FEATURE_NOT_SAVEABLE.with_dnr()));
    }
    let Some(ns) = ctx.ns.get(cmd.nsid()).cloned() else {
        return AdminResult::Done(Outcome::err(INVALID_FIELD));
    };
    let on = cmd.cdw11() & 1 != 0;
    if ns.reservations().ptpl_file().is_none() {
        return AdminResult::Done(if on {
            Outcome::err(INVALID_FIELD)
        } else {
            Outcome::ok()
        });
    }
    let tag = crate::backend::IoTag {
        cid: cmd.cid(),
        bytes: 0,
        write: true,
        nsid: 0,
    };
    let work = move || match ns.reservations().set_ptpl(on) {
        Ok(_) => Status::SUCCESS,
        Err(st) => st,
    };
    match crate::reservation::PTPL_POOL.run(ctx.sink, tag, work) {
        crate::backend::Submitted::Done(st) => AdminResult::Done(Outcome::err(st)),
        _ => AdminResult::Queued,
    }
}

/// Copy `page[offset..]` into `data`, zero-filling what the page does not
/// cover. `offset` past the end of the page is Invalid Field.
pub(crate) fn copy_out(page: &[u8], offset: u64, data: &mut [u8]) -> Outcome {
    let Ok(off) = usize::try_from(offset) else {
        return Outcome::err(INVALID_FIELD);
    };
    if off > page.len() || (off == page.len() && !data.is_empty()) {
        return Outcome::err(INVALID_FIELD);
    }
    let avail = &page[off..];
    let n = avail.len().min(data.len());
    data[..n].copy_from_slice(&avail[..n]);
    data[n..].fill(0);
    Outcome::ok()
}
