//! The transport seam, core side: what the core knows of a transport and
//! nothing more (the part of the kernel target's `nvmet_fabrics_ops` that
//! its core reads).
//!
//! Owns [`TransportLimits`] (one transport type's configured queue depths
//! and sizes), [`TransportTable`] (those limits by transport type, as the
//! target holds them) and [`TransportCaps`] (what a transport states about
//! its command capsules: keyed SGLs, data descriptors per command; carried
//! by every connection's `PortInfo`, so Identify reports the facts of the
//! transport the host actually came in on). The request lifecycle all
//! transports share is `request.rs`; the transports themselves (nvmf-tcp,
//! the RDMA transport) live in their own crates and the core names none of
//! them.

use nvmf_config::{TransportConfig, TransportType};

/// Limits of one transport type that the core enforces and reports
/// (CAP.MQES, MDTS, IOCCSZ, MAXCMD, Number of Queues), from that
/// transport's `TransportConfig`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportLimits {
    /// Largest I/O queue (entries).
    pub max_queue_depth: u16,
    /// Largest admin queue (entries).
    pub max_aq_depth: u16,
    /// I/O queues per controller.
    pub max_io_qpairs_per_ctrlr: u16,
    /// In-capsule data bytes a command capsule may carry.
    pub in_capsule_data_size: u32,
    /// Largest data transfer of one command in bytes.
    pub max_io_size: u32,
    /// Buffer unit size in bytes (the transport's business).
    pub io_unit_size: u32,
    /// Send C2HData with SUCCESS and skip the response capsule (the transport's business).
    pub c2h_success: bool,
    /// Data buffer budget in `io_unit_size` units (the transport's business).
    pub num_shared_buffers: u32,
}

impl TransportLimits {
    /// Limits from a transport configuration, with nonsense values fixed up
    /// (depths at least 2, at least one I/O queue, max I/O at least 4 KiB).
    pub fn from_config(t: &TransportConfig) -> TransportLimits {
        TransportLimits {
            max_queue_depth: t.max_queue_depth.max(2),
            max_aq_depth: t.max_aq_depth.max(2),
            max_io_qpairs_per_ctrlr: t.max_io_qpairs_per_ctrlr.max(1),
            in_capsule_data_size: t.in_capsule_data_size,
            max_io_size: t.max_io_size.max(4096),
            io_unit_size: t.io_unit_size,
            c2h_success: t.c2h_success,
            num_shared_buffers: t.num_shared_buffers.max(1),
        }
    }

    /// Identify Controller MDTS: log2(max_io_size / 4 KiB) (CAP.MPSMIN is
    /// 4 KiB). 0 would mean "no limit", so the smallest value reported is 1.
    pub fn mdts(&self) -> u8 {
        let pages = (self.max_io_size / 4096).max(1);
        (31 - pages.leading_zeros()).max(1) as u8
    }

    /// Largest transfer the reported MDTS allows, in bytes: the I/O path
    /// rejects bigger commands with Invalid Field.
    pub fn max_transfer(&self) -> u32 {
        self.max_io_size
    }

    /// Bytes of data buffers above the in-capsule size that all queues may
    /// hold together: `num_shared_buffers × io_unit_size`.
    pub fn data_buffer_budget(&self) -> u64 {
        u64::from(self.num_shared_buffers) * u64::from(self.io_unit_size.max(512))
    }
}

impl Default for TransportLimits {
    fn default() -> Self {
        TransportLimits::from_config(&TransportConfig::tcp_default())
    }
}

/// What a transport states about the command capsules its connections
/// carry. The transport puts it in each connection's `PortInfo`; the core
/// reports it in Identify Controller.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransportCaps {
    /// SGLS bit 2: Keyed SGL Data Block descriptors (host memory the
    /// controller reads or writes itself, named by address and key: RDMA).
    pub keyed_sgls: bool,
    /// MSDBD: SGL data block descriptors one command may carry (at least 1).
    pub msdbd: u8,
}

impl TransportCaps {
    /// A transport that moves data itself (Transport SGL Data Block or
    /// in-capsule data) with one descriptor per command: NVMe/TCP.
    pub const MESSAGE_BASED: TransportCaps = TransportCaps {
        keyed_sgls: false,
        msdbd: 1,
    };
}

impl Default for TransportCaps {
    fn default() -> Self {
        TransportCaps::MESSAGE_BASED
    }
}

/// The limits of every transport type, from the target configuration's
/// transports (a type without a configuration entry gets its defaults).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TransportTable {
    by_type: Vec<(TransportType, TransportLimits)>,
}

impl TransportTable {
    /// Limits from the configured transports; every transport type has an
    /// entry (its SPDK defaults when not configured).
    pub fn from_config(transports: &[TransportConfig]) -> TransportTable {
        let mut by_type: Vec<(TransportType, TransportLimits)> = Vec::new();
        for t in transports {
            if !by_type.iter().any(|(ty, _)| *ty == t.trtype) {
                by_type.push((t.trtype, TransportLimits::from_config(t)));
            }
        }
        for ty in [TransportType::Tcp, TransportType::Rdma] {
            if !by_type.iter().any(|(t, _)| *t == ty) {
                let defaults = TransportConfig::default_for(ty);
                by_type.push((ty, TransportLimits::from_config(&defaults)));
            }
        }
        TransportTable { by_type }
    }

    /// The limits of `trtype`.
    pub fn get(&self, trtype: TransportType) -> &TransportLimits {
        match self.by_type.iter().find(|(ty, _)| *ty == trtype) {
            Some((_, l)) => l,
            // from_config gives every type an entry.
            None => &self.by_type[0].1,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tcp_has_limits_even_when_not_configured() {
        let t = TransportTable::from_config(&[]);
        assert_eq!(
            *t.get(TransportType::Tcp),
            TransportLimits::from_config(&TransportConfig::tcp_default())
        );
    }

    #[test]
    fn rdma_gets_its_defaults_or_its_own_configuration() {
        let t = TransportTable::from_config(&[]);
        assert_eq!(
            *t.get(TransportType::Rdma),
            TransportLimits::from_config(&TransportConfig::rdma_default())
        );
        let mut rdma = TransportConfig::rdma_default();
        rdma.max_queue_depth = 512;
        let t = TransportTable::from_config(&[TransportConfig::tcp_default(), rdma]);
        assert_eq!(t.get(TransportType::Rdma).max_queue_depth, 512);
        assert_eq!(t.get(TransportType::Tcp).max_queue_depth, 128);
    }

    #[test]
    fn each_type_gets_its_own_configuration() {
        let mut small = TransportConfig::tcp_default();
        small.max_queue_depth = 32;
        small.in_capsule_data_size = 8192;
        let t = TransportTable::from_config(&[small.clone()]);
        assert_eq!(t.get(TransportType::Tcp).max_queue_depth, 32);
        assert_eq!(t.get(TransportType::Tcp).in_capsule_data_size, 8192);
    }
}
