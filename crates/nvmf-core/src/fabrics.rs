//! Fabrics commands: Connect, Property Get, Property Set.
//!
//! Owns the Connect checks (record format, subsystem, host access, queue
//! size, controller ID, queue ID), creating a controller for an admin queue
//! Connect and attaching an I/O queue to an existing one, and the controller
//! properties CAP, VS, CC, CSTS (enable, reset and shutdown handshakes).
//! Connect errors carry IATTR/IPO in dword 0 the way the Linux host reads them.
//!
//! Host limits (`Target::set_host_limits`): a Connect that would take a host
//! over its controller cap (admin queue) or I/O queue cap (I/O queue), or the
//! target over its total controller cap, completes with Connect Controller
//! Busy (SCT 1h, SC 81h) and DNR clear: nothing in the command is wrong, the
//! target is out of a resource that may free up, so the host may retry later
//! (the Linux host keeps reconnecting every reconnect_delay until
//! ctrl_loss_tmo; with DNR it would give the controller up for good). nvmet
//! answers Controller Busy too when it has no controller ID left or a queue
//! is already taken.
//!
//! Do Not Retry on a Connect rejection: set only where the command itself
//! is malformed (record format, SQSIZE, a static controller ID on an admin
//! Connect, a QID out of range). A QID already connected is refused without
//! DNR (the queue holding it may be on its way out). A rejection that a later
//! reconfiguration or teardown can cure leaves DNR clear, as SPDK's target
//! does: no such subsystem, the subsystem does not listen on this port, the
//! host is not (yet) allowed, the controller an I/O queue names is gone, no
//! controller ID free. Linux hosts since 6.x stop reconnecting on DNR
//! (`nvmf_should_reconnect`), so a DNR there would lose a host for good
//! across a subsystem's delete and re-create (live maintenance); without it
//! the host retries every reconnect_delay until ctrl_loss_tmo.
//!
//! Authentication (DH-HMAC-CHAP) comes after Connect, so nothing a host
//! that must authenticate needs is given away before it has: its admin
//! Connect makes a controller in the unauthenticated pool
//! (`target::HostLimits`, evicting its oldest when full) that counts against
//! the host NQN only once authenticated, and its I/O-queue Connect claims
//! the queue ID and the host's I/O queue budget only once that queue has
//! authenticated ([`claim_after_auth`]). An I/O-queue Connect must carry
//! its controller's Host Identifier as well as its host NQN.
//!
//! Every refusal is logged through the target's rate limit
//! (`Target::set_log_rate`): a host may repeat a refused Connect on one
//! connection as fast as it can send.

use std::sync::Arc;

use nvmf_wire::command::Command;
use nvmf_wire::fabrics::{
    cap_value, ConnectData, CAP, CC, CC_EN, CC_IOCQES_SHIFT, CC_IOSQES_SHIFT, CC_SHN_MASK,
    CNTLID_DYNAMIC, CONNECT_RECFMT_0, CSTS, CSTS_CFS, CSTS_RDY, CSTS_SHST_COMPLETE, VS, VS_1_3,
};
use nvmf_wire::opcode::FabricsType;
use nvmf_wire::status::Status;
use nvmf_wire::zerocopy::FromBytes;

use crate::controller::{ClaimError, Controller};
use crate::error::{connect_ipo_iattr, Outcome, INVALID_FIELD, INVALID_OPCODE, SGL_LENGTH_INVALID};
use crate::queue::PortInfo;
use crate::target::{Budget, Target};
use crate::transport::TransportLimits;

/// Byte offsets of Connect fields, reported in IPO.
pub mod ipo {
    /// SQE: record format.
    pub const RECFMT: u16 = 40;
    /// SQE: queue ID.
    pub const QID: u16 = 42;
    /// SQE: submission queue size.
    pub const SQSIZE: u16 = 44;
    /// Data: host identifier.
    pub const HOSTID: u16 = 0;
    /// Data: controller ID.
    pub const CNTLID: u16 = 16;
    /// Data: subsystem NQN.
    pub const SUBNQN: u16 = 256;
    /// Data: host NQN.
    pub const HOSTNQN: u16 = 512;
}

/// Version reported in VS and Identify Controller VER.
pub const NVME_VERSION: u32 = VS_1_3;

/// CAP.TO: worst-case time to become ready, in 500 ms units (7.5 s, as nvmet).
const CAP_TIMEOUT: u8 = 15;

/// A successful Connect.
#[derive(Debug)]
pub(crate) enum Connected {
    Admin {
        ctrl: Arc<Controller>,
        depth: u16,
    },
    Io {
        ctrl: Arc<Controller>,
        qid: u16,
        depth: u16,
        /// The queue ID (and the host's I/O queue budget) is held. False
        /// for a queue that must authenticate first: it claims them once
        /// its host has ([`claim_after_auth`]), so a host that cannot
        /// authenticate holds nothing a real one needs.
        claimed: bool,
    },
}

/// An I/O queue's host authenticated: its queue ID and the host's budget
/// are claimed now. A refusal ends the queue (logged by the caller).
pub(crate) fn claim_after_auth(ctrl: &Controller, qid: u16) -> Result<(), &'static str> {
    match ctrl.claim_io_queue(qid) {
        Ok(()) => Ok(()),
        Err(ClaimError::InvalidQid) => Err("queue ID out of range"),
        Err(ClaimError::Taken) => Err("queue ID already connected"),
        Err(ClaimError::Limit(_)) => Err("host I/O queue limit reached"),
    }
}

/// Over a host limit: Connect Controller Busy, retryable (see the top comment).
fn over_limit() -> Outcome {
    Outcome::err(Status::CONNECT_CONTROLLER_BUSY)
}

/// Connect Invalid Parameters for something a later reconfiguration can
/// cure (DNR clear; see the top comment).
fn not_here_yet(in_data: bool, offset: u16) -> Outcome {
    Outcome {
        status: Status::CONNECT_INVALID_PARAMETERS,
        dw0: connect_ipo_iattr(in_data, offset),
        dw1: 0,
    }
}

/// Connect Invalid Parameters for a malformed field (DNR set).
fn invalid_param(in_data: bool, offset: u16) -> Outcome {
    Outcome {
        status: Status::CONNECT_INVALID_PARAMETERS.with_dnr(),
        dw0: connect_ipo_iattr(in_data, offset),
        dw1: 0,
    }
}

/// Execute a Connect on an unconnected queue.
pub(crate) fn connect(
    target: &Arc<Target>,
    port: &PortInfo,
    cmd: &Command,
    data: &[u8],
) -> Result<Connected, Outcome> {
    if cmd.recfmt() != CONNECT_RECFMT_0 {
        return Err(Outcome::err(Status::CONNECT_INCOMPATIBLE_FORMAT.with_dnr()));
    }
    let Ok((d, _)) = ConnectData::ref_from_prefix(data) else {
        return Err(Outcome::err(SGL_LENGTH_INVALID));
    };
    let subnqn = d.subnqn();
    let hostnqn = d.hostnqn();
    let Some(subsys) = target.subsystem(subnqn) else {
        target.refusal_log(
            || tracing::warn!(subnqn, hostnqn, peer = %port.peer, "connect to unknown subsystem"),
        );
        return Err(not_here_yet(true, ipo::SUBNQN));
    };
    // An NVM subsystem is reachable only through its own listeners: to a host
    // that came in on another port it does not exist (as with nvmet). The
    // discovery subsystem answers on every port the target listens on.
    if !subsys.is_discovery() && !subsys.listens_on(port) {
        target.refusal_log(|| {
            tracing::warn!(
                subnqn,
                hostnqn,
                peer = %port.peer,
                port = %format_args!("{}:{}", port.traddr, port.trsvcid),
                "connect to a subsystem that does not listen on this port"
            )
        });
        return Err(not_here_yet(true, ipo::SUBNQN));
    }
    // An empty host NQN (SPDK's host sends one unless told otherwise) is
    // accepted where any host is (allow_any_host, discovery), as SPDK's
    // target and nvmet do; it matches no allow-list entry, so a restricted
    // subsystem answers Connect Invalid Host. Anonymous hosts share one
    // per-host-NQN budget (the host limits key on the NQN).
    if !subsys.host_allowed(hostnqn) {
        target.refusal_log(
            || tracing::warn!(subnqn, hostnqn, peer = %port.peer, "connect from a host not allowed"),
        );
        return Err(Outcome {
            status: Status::CONNECT_INVALID_HOST,
            dw0: connect_ipo_iattr(true, ipo::HOSTNQN),
            dw1: 0,
        });
    }
    // Over TLS, the PSK identity the handshake accepted names the host (and
    // the subsystem): Connect must match it, or one host's key would open
    // another host's controllers.
    if let Some(id) = &port.tls {
        if id.hostnqn != hostnqn || (id.subnqn != subnqn && !subsys.is_discovery()) {
            target.refusal_log(|| {
                tracing::warn!(
                    subnqn,
                    hostnqn,
                    peer = %port.peer,
                    tls_host = %id.hostnqn,
                    tls_subsystem = %id.subnqn,
                    "connect refused: the TLS PSK identity names another host or subsystem"
                )
            });
            return Err(Outcome {
                status: Status::CONNECT_INVALID_HOST,
                dw0: connect_ipo_iattr(true, ipo::HOSTNQN),
                dw1: 0,
            });
        }
    }
    let limits = target.limits_for(port.trtype);
    let qid = cmd.qid();
    let sqsize = cmd.sqsize();

    if qid == 0 {
        // Admin queue: a new controller (dynamic controller model).
        if sqsize == 0 || u32::from(sqsize) + 1 > u32::from(limits.max_aq_depth) {
            return Err(invalid_param(false, ipo::SQSIZE));
        }
        if d.cntlid() != CNTLID_DYNAMIC {
            return Err(invalid_param(true, ipo::CNTLID));
        }
        let mut kato_ms = cmd.kato();
        if subsys.is_discovery() && kato_ms == 0 {
            kato_ms = target.discovery_kato_ms();
        }
        let max_io = if subsys.is_discovery() {
            0
        } else {
            limits.max_io_qpairs_per_ctrlr
        };
        // Which budget the controller is counted in (see
        // `target::HostLimits`): discovery controllers and those of hosts
        // that must still authenticate in their own evicting pools, so that
        // neither can use up the controllers a real host needs.
        let budget = if subsys.is_discovery() {
            Budget::Discovery
        } else if subsys.host_keys(hostnqn).is_some() {
            Budget::Unauthenticated
        } else {
            Budget::Nvm
        };
        if budget == Budget::Nvm {
            if let Err(hit) = target.admit_controller(hostnqn) {
                target.refusal_log(|| tracing::warn!(subnqn, hostnqn, peer = %port.peer, "connect refused (Controller Busy): host limit of {hit} reached"));
                return Err(over_limit());
            }
        } else {
            target.admit_pooled(budget);
        }
        let hostid = d.hostid;
        let sub2 = subsys.clone();
        let mut admitted = false;
        let ctrl = subsys.register_controller(|cntlid| {
            admitted = true;
            Arc::new(
                Controller::new(cntlid, sub2.clone(), hostnqn, hostid, max_io, kato_ms)
                    .with_ana_path(sub2.ana_path_for(port))
                    .with_admission(target, budget),
            )
        });
        match ctrl {
            Some(ctrl) => {
                target.track_pooled(&ctrl);
                Ok(Connected::Admin {
                    ctrl,
                    depth: sqsize + 1,
                })
            }
            None => {
                if !admitted {
                    match budget {
                        Budget::Nvm => target.release_controller(hostnqn),
                        b => target.release_pooled(b, false),
                    }
                }
                target.refusal_log(|| tracing::warn!(subnqn, hostnqn, "no free controller ID"));
                Err(Outcome::err(Status::CONNECT_CONTROLLER_BUSY))
            }
        }
    } else {
        // I/O queue of an existing controller.
        let Some(ctrl) = subsys
            .controller(d.cntlid())
            .filter(|c| c.hostnqn() == hostnqn)
        else {
            // The controller is gone (torn down, subsystem re-created): the
            // host's reconnect with a new admin queue cures it.
            return Err(not_here_yet(true, ipo::CNTLID));
        };
        // The Host Identifier names the host as well as its NQN does: an I/O
        // queue's must be its controller's.
        if ctrl.hostid() != &d.hostid {
            target.refusal_log(|| {
                tracing::warn!(subnqn, hostnqn, qid, peer = %port.peer, cntlid = ctrl.cntlid(), "I/O queue connect refused: Host Identifier differs from its controller's")
            });
            return Err(Outcome {
                status: Status::CONNECT_INVALID_HOST,
                dw0: connect_ipo_iattr(true, ipo::HOSTID),
                dw1: 0,
            });
        }
        if sqsize == 0 || u32::from(sqsize) + 1 > u32::from(limits.max_queue_depth) {
            return Err(invalid_param(false, ipo::SQSIZE));
        }
        if qid == 0 || qid > ctrl.num_io_queues() {
            return Err(invalid_param(false, ipo::QID));
        }
        // A queue that must authenticate claims its queue ID and the host's
        // budget only once it has: before, anybody who knows the host NQN
        // and guesses the controller ID could hold them (for the whole
        // authentication timeout) and lock the real host's queue out.
        if subsys.host_keys(hostnqn).is_some() {
            return Ok(Connected::Io {
                ctrl,
                qid,
                depth: sqsize + 1,
                claimed: false,
            });
        }
        match ctrl.claim_io_queue(qid) {
            Ok(()) => {}
            Err(ClaimError::InvalidQid) => return Err(invalid_param(false, ipo::QID)),
            Err(ClaimError::Taken) => {
                // Retryable (no DNR): the queue holding it may be on its
                // way out (a reconnect racing the old queue's teardown).
                target.refusal_log(|| tracing::warn!(subnqn, hostnqn, qid, peer = %port.peer, "I/O queue connect refused: queue ID already connected"));
                return Err(not_here_yet(false, ipo::QID));
            }
            Err(ClaimError::Limit(hit)) => {
                target.refusal_log(|| tracing::warn!(subnqn, hostnqn, qid, peer = %port.peer, "I/O queue connect refused (Controller Busy): host limit of {hit} reached"));
                return Err(over_limit());
            }
        }
        Ok(Connected::Io {
            ctrl,
            qid,
            depth: sqsize + 1,
            claimed: true,
        })
    }
}

/// The CAP property of a controller.
pub fn cap(limits: &TransportLimits) -> u64 {
    let mqes = limits.max_queue_depth.saturating_sub(1);
    cap_value(mqes, CAP_TIMEOUT)
}

/// A Fabrics command on a connected admin queue.
pub(crate) fn admin_fabrics(
    target: &Target,
    port: &PortInfo,
    ctrl: &Controller,
    cmd: &Command,
) -> Outcome {
    match FabricsType::try_from(cmd.fctype()) {
        Ok(FabricsType::PropertyGet) => property_get(target.limits_for(port.trtype), ctrl, cmd),
        Ok(FabricsType::PropertySet) => property_set(target, ctrl, cmd),
        Ok(FabricsType::Connect) => Outcome::err(Status::COMMAND_SEQUENCE_ERROR.with_dnr()),
        _ => Outcome::err(INVALID_OPCODE),
    }
}

fn property_get(limits: &TransportLimits, ctrl: &Controller, cmd: &Command) -> Outcome {
    let Some(size) = cmd.prop_size() else {
        return Outcome::err(INVALID_FIELD);
    };
    let value: u64 = match (cmd.prop_offset(), size) {
        (CAP, 8) => cap(limits),
        (CAP, 4) => cap(limits) & 0xFFFF_FFFF,
        (o, 4) if o == CAP + 4 => cap(limits) >> 32,
        (VS, _) => u64::from(NVME_VERSION),
        (CC, _) => u64::from(ctrl.cc()),
        (CSTS, _) => u64::from(ctrl.csts()),
        _ => return Outcome::err(INVALID_FIELD),
    };
    Outcome {
        status: Status::SUCCESS,
        dw0: value as u32,
        dw1: if size == 8 { (value >> 32) as u32 } else { 0 },
    }
}

fn property_set(target: &Target, ctrl: &Controller, cmd: &Command) -> Outcome {
    if cmd.prop_size().is_none() {
        return Outcome::err(INVALID_FIELD);
    }
    if cmd.prop_offset() != CC {
        return Outcome::err(INVALID_FIELD);
    }
    write_cc(target, ctrl, cmd.prop_value() as u32);
    Outcome::ok()
}

/// Apply a CC write: enable (→ RDY, or CFS on a bad configuration),
/// disable (reset: RDY cleared), shutdown (SHST complete).
pub(crate) fn write_cc(target: &Target, ctrl: &Controller, new: u32) {
    let old = ctrl.cc();
    let mut csts = ctrl.csts();
    ctrl.set_cc(new);

    let was_en = old & CC_EN != 0;
    let is_en = new & CC_EN != 0;
    if is_en && !was_en {
        let iosqes = (new >> CC_IOSQES_SHIFT) & 0xF;
        let iocqes = (new >> CC_IOCQES_SHIFT) & 0xF;
        let mps = (new >> 7) & 0xF;
        let css = (new >> 4) & 0x7;
        let ams = (new >> 11) & 0x7;
        if iosqes != 6 || iocqes != 4 || mps != 0 || css != 0 || ams != 0 {
            // A host may repeat this as fast as it can send: rate-limited.
            target.refusal_log(|| {
                tracing::warn!(
                    cntlid = ctrl.cntlid(),
                    cc = new,
                    "unsupported CC configuration"
                );
            });
            csts |= CSTS_CFS;
        } else {
            csts |= CSTS_RDY;
        }
    } else if !is_en && was_en {
        // Controller reset.
        csts &= !(CSTS_RDY | CSTS_CFS);
    }

    let old_shn = old & CC_SHN_MASK != 0;
    let new_shn = new & CC_SHN_MASK != 0;
    if new_shn && !old_shn {
        csts &= !CSTS_RDY;
        csts |= CSTS_SHST_COMPLETE;
        ctrl.set_cc(new & !CC_EN);
    } else if !new_shn && old_shn {
        csts &= !CSTS_SHST_COMPLETE;
    }
    ctrl.set_csts(csts);
}
