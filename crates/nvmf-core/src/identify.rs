//! Identify (admin opcode 06h) and its page builders.
//!
//! Owns CNS 00h (Identify Namespace), 01h (Identify Controller, NVM and
//! discovery flavours), 02h (active NSID list) and 03h (namespace
//! identification descriptors). Field choices follow what the Linux host
//! checks (see docs in `identify_controller`) and what nvmet reports.

use nvmf_wire::command::Command;
use nvmf_wire::identify::{
    fill_ascii, Cns, IdentifyController, IdentifyNamespace, LbaFormat, NsDescriptorList, CMIC_ANA,
    CMIC_MULTI_CTRL, CNTRLTYPE_DISCOVERY, CNTRLTYPE_IO, LPA_CMD_EFFECTS, LPA_EXTENDED, NMIC_SHARED,
    NSATTR_WRITE_PROTECTED, OAES_ANA_CHANGE, OAES_DISCOVERY_CHANGE, OAES_NS_ATTR, ONCS_DSM,
    ONCS_WRITE_ZEROES, SGLS_KEYED, SGLS_OFFSET, SGLS_SUPPORTED, VWC_PRESENT,
};
use nvmf_wire::zerocopy::{FromZeros, IntoBytes};

use crate::admin::AdminCtx;
use crate::ana::{ANACAP, ANATT_SECONDS};
use crate::controller::Controller;
use crate::error::{Outcome, INVALID_FIELD, INVALID_NAMESPACE};
use crate::fabrics::NVME_VERSION;
use crate::namespace::{Namespace, NamespaceTable};
use crate::queue::AER_LIMIT;
use crate::transport::{TransportCaps, TransportLimits};

/// Firmware revision reported in FR and the firmware slot log: the crate version.
pub const FIRMWARE_REVISION: &str = env!("CARGO_PKG_VERSION");

/// Keep Alive Support granularity in 100 ms units (10 = 1 s, as nvmet).
pub const KAS: u16 = 10;

/// Identify page size.
pub const PAGE: usize = 4096;

/// CMIC bit 0: the subsystem may have several ports.
const CMIC_MULTI_PORT: u8 = 1 << 0;
/// CTRATT bit 0: 128-bit host identifier (the Connect HOSTID).
const CTRATT_HOSTID_128: u32 = 1 << 0;
/// VWC bits 2:1 = 10b: Flush with NSID FFFFFFFFh is not supported.
const VWC_NO_BROADCAST_FLUSH: u8 = 0b10 << 1;
/// DLFEAT bits 2:0 = 001b: deallocated blocks read as zeroes.
const DLFEAT_READ_ZEROES: u8 = 0b001;
/// DLFEAT bit 3: Write Zeroes supports the Deallocate bit.
const DLFEAT_WZ_DEALLOC: u8 = 1 << 3;

/// Execute an Identify command.
pub(crate) fn execute(ctx: &mut AdminCtx<'_>, cmd: &Command, data: &mut [u8]) -> Outcome {
    let cns = Cns::try_from(cmd.cns());
    if ctx.ctrl.is_discovery() {
        // A discovery controller only describes itself.
        return match cns {
            Ok(Cns::Controller) => {
                let id = identify_controller(
                    ctx.ctrl,
                    ctx.target.limits_for(ctx.port.trtype),
                    &ctx.port.caps,
                );
                put(id.as_bytes(), data)
            }
            _ => Outcome::err(INVALID_FIELD),
        };
    }
    match cns {
        Ok(Cns::Controller) => {
            let id = identify_controller(
                ctx.ctrl,
                ctx.target.limits_for(ctx.port.trtype),
                &ctx.port.caps,
            );
            put(id.as_bytes(), data)
        }
        Ok(Cns::Namespace) => {
            let nsid = cmd.nsid();
            if nsid == 0 || nsid > ctx.ctrl.subsystem().max_namespaces() {
                return Outcome::err(INVALID_NAMESPACE);
            }
            match ctx.ns.get(nsid) {
                Some(ns) => {
                    let mut id = identify_namespace(ns);
                    if ctx.ctrl.subsystem().ana().is_some() {
                        id.anagrpid.set(ns.anagrpid());
                    }
                    // Copy: the whole copy in one transfer-sized buffer.
                    let max = ctx.target.limits_for(ctx.port.trtype).max_transfer();
                    let (mssrl, mcl) = crate::io::copy_limits(ns.block_shift(), max);
                    id.mssrl.set(mssrl);
                    id.mcl.set(mcl);
                    id.msrc = (crate::io::COPY_MAX_RANGES - 1) as u8;
                    put(id.as_bytes(), data)
                }
                // Valid but inactive NSID: an all-zero page.
                None => put(&[], data),
            }
        }
        Ok(Cns::ActiveNsList) => {
            let nsid = cmd.nsid();
            if nsid >= 0xFFFF_FFFE {
                return Outcome::err(INVALID_NAMESPACE);
            }
            put(&active_ns_list(ctx.ns, nsid), data)
        }
        Ok(Cns::NsDescList) => {
            let nsid = cmd.nsid();
            match ctx.ns.get(nsid) {
                Some(ns) => put(ns_descriptor_list(ns).as_bytes(), data),
                None => Outcome::err(INVALID_NAMESPACE),
            }
        }
        // NVM command set specific pages (CSI in CDW11 31:24 must be NVM):
        // zero pages, as nvmet, but for the Verify Size Limit.
        // The Linux host asks for the controller one (DMRL/DMRSL/WZSL).
        Ok(Cns::CsiController) if csi(cmd) == 0 => {
            // VSL (byte 0): Verify is limited like a transfer (MDTS).
            let mdts = ctx.target.limits_for(ctx.port.trtype).mdts();
            put(&[mdts], data)
        }
        Ok(Cns::CsiNamespace) if csi(cmd) == 0 => match ctx.ns.get(cmd.nsid()) {
            Some(_) => put(&[], data),
            None => Outcome::err(INVALID_NAMESPACE),
        },
        _ => Outcome::err(INVALID_FIELD),
    }
}

/// Command Set Identifier of an Identify command (CDW11 31:24).
fn csi(cmd: &Command) -> u32 {
    cmd.cdw11() >> 24
}

/// Copy a page into the host's buffer; what the page does not cover is zero.
fn put(page: &[u8], data: &mut [u8]) -> Outcome {
    let n = page.len().min(data.len());
    data[..n].copy_from_slice(&page[..n]);
    data[n..].fill(0);
    Outcome::ok()
}

/// Identify Controller for `ctrl`.
///
/// What the Linux host checks: CNTLID equals the Connect result; KAS
/// non-zero (I/O controllers); IOCCSZ ≥ 4 and IORCSZ ≥ 1 (I/O controllers,
/// reserved on discovery); ICDOFF 0; SGLS bits 1:0 non-zero (bit 2, keyed
/// SGL data blocks, when the transport has them: NVMe/RDMA); MAXCMD bounds
/// the queue size it uses; MDTS bounds its I/O size; SUBNQN.
pub fn identify_controller(
    ctrl: &Controller,
    limits: &TransportLimits,
    caps: &TransportCaps,
) -> IdentifyController {
    let sub = ctrl.subsystem();
    let mut id = IdentifyController::new_zeroed();
    fill_ascii(&mut id.sn, sub.serial());
    fill_ascii(&mut id.mn, sub.model());
    fill_ascii(&mut id.fr, FIRMWARE_REVISION);
    id.mdts = limits.mdts();
    id.cntlid.set(ctrl.cntlid());
    id.ver.set(NVME_VERSION);
    id.kas.set(KAS);
    id.lpa = LPA_EXTENDED;
    id.set_subnqn(sub.nqn());
    let keyed = if caps.keyed_sgls { SGLS_KEYED } else { 0 };
    id.sgls.set(SGLS_SUPPORTED | keyed | SGLS_OFFSET);
    id.aerl = (AER_LIMIT - 1) as u8;
    id.fcatt = 0; // dynamic controller model
    id.icdoff.set(0);

    if ctrl.is_discovery() {
        id.cntrltype = CNTRLTYPE_DISCOVERY;
        id.oaes.set(OAES_DISCOVERY_CHANGE);
        id.maxcmd.set(limits.max_aq_depth);
        // NN 0, IOCCSZ/IORCSZ reserved (0) on discovery controllers.
        return id;
    }

    id.cntrltype = CNTRLTYPE_IO;
    id.rab = 6;
    id.cmic = CMIC_MULTI_PORT | CMIC_MULTI_CTRL;
    id.oaes.set(OAES_NS_ATTR);
    id.ctratt.set(CTRATT_HOSTID_128);
    id.acl = 3;
    // Firmware: one slot, read-only.
    id.frmw = (1 << 0) | (1 << 1);
    id.lpa = LPA_EXTENDED | LPA_CMD_EFFECTS;
    id.elpe = 0;
    id.npss = 0;
    id.sqes = 0x66;
    id.cqes = 0x44;
    id.maxcmd.set(limits.max_queue_depth);
    id.nn.set(sub.max_namespaces());
    id.mnan.set(sub.max_namespaces());
    if let Some(ana) = sub.ana() {
        // ANA reporting: the Linux host sizes its ANA log buffer from
        // NANAGRPID and MNAN and needs it to fit in MDTS.
        id.cmic |= CMIC_ANA;
        id.oaes.set(OAES_NS_ATTR | OAES_ANA_CHANGE);
        id.anacap = ANACAP;
        id.anatt = ANATT_SECONDS;
        id.anagrpmax.set(ana.grpmax());
        id.nanagrpid.set(ana.grpmax());
    }
    id.oncs.set(
        ONCS_COMPARE | ONCS_DSM | ONCS_WRITE_ZEROES | ONCS_RESERVATIONS | ONCS_VERIFY | ONCS_COPY,
    );
    // Copy source range descriptor format 0.
    id.ocfs.set(1);
    // Fused Compare and Write, atomic up to CAW_MAX_BLOCKS (0's based).
    id.fuses.set(crate::fused::FUSES_COMPARE_AND_WRITE);
    id.acwu.set((crate::fused::CAW_MAX_BLOCKS - 1) as u16);
    id.vwc = VWC_PRESENT | VWC_NO_BROADCAST_FLUSH;
    // Command capsule: SQE + in-capsule data, in 16-byte units; response: CQE.
    id.ioccsz.set((64 + limits.in_capsule_data_size) / 16);
    id.iorcsz.set(1);
    id.msdbd = caps.msdbd.max(1);
    id
}

/// ONCS bit 0: Compare.
const ONCS_COMPARE: u16 = 1 << 0;
/// ONCS bit 5: reservations.
const ONCS_RESERVATIONS: u16 = 1 << 5;
/// ONCS bit 7: Verify.
const ONCS_VERIFY: u16 = 1 << 7;
/// ONCS bit 8: Copy.
const ONCS_COPY: u16 = 1 << 8;

/// Identify Namespace for an active namespace.
pub fn identify_namespace(ns: &Namespace) -> IdentifyNamespace {
    let mut id = IdentifyNamespace::new_zeroed();
    let blocks = ns.num_blocks();
    id.nsze.set(blocks);
    id.ncap.set(blocks);
    id.nuse.set(blocks);
    id.nlbaf = 0;
    id.flbas = 0;
    id.nmic = NMIC_SHARED;
    id.rescap = crate::reservation::RESCAP_TYPES
        | if ns.reservations().ptpl_file().is_some() {
            crate::reservation::RESCAP_PTPL
        } else {
            0
        };
    if ns.backend().deallocate_reads_zeroes() {
        id.dlfeat = DLFEAT_READ_ZEROES | DLFEAT_WZ_DEALLOC;
    }
    if ns.read_only() {
        id.nsattr |= NSATTR_WRITE_PROTECTED;
    }
    id.nguid = ns.nguid;
    id.eui64 = ns.eui64;
    id.lbaf[0] = LbaFormat::new(ns.block_size());
    if !ns.name().is_empty() {
        id.set_vendor_name(ns.name());
    }
    id
}

/// Active NSID list: NSIDs greater than `after`, ascending, at most 1024.
pub fn active_ns_list(table: &NamespaceTable, after: u32) -> [u8; PAGE] {
    let mut page = [0u8; PAGE];
    let ids = table.active_nsids().iter().filter(|&&n| n > after);
    for (slot, nsid) in page.chunks_exact_mut(4).zip(ids) {
        slot.copy_from_slice(&nsid.to_le_bytes());
    }
    page
}

/// Namespace identification descriptors: EUI-64, NGUID, UUID (each only
/// when non-zero) and the command set identifier (NVM).
pub fn ns_descriptor_list(ns: &Namespace) -> NsDescriptorList {
    let mut l = NsDescriptorList::new();
    if ns.eui64 != [0; 8] {
        l.push_eui64(&ns.eui64);
    }
    if ns.nguid != [0; 16] {
        l.push_nguid(&ns.nguid);
    }
    if ns.uuid != [0; 16] {
        l.push_uuid(&ns.uuid);
    }
    l.push_csi(0);
    l
}
