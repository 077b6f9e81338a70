//! controller.rs — `Controller`: a connected NVMe-oF controller (NVM or
//! discovery) seen from the host, with a blocking API for admin work:
//! connect (admin queue Connect, Property Get CAP/VS, Property Set CC.EN=1,
//! wait for CSTS.RDY), Identify (controller, namespace, active namespace
//! list, namespace descriptors), Set Features Number of Queues, Get Log Page,
//! Keep Alive (sent by a background thread every KATO/2), an Asynchronous
//! Event Request kept outstanding (`arm_async_event` / `poll_async_event`),
//! the ANA log page, and creation of I/O queues (`IoQueue`, one TCP
//! connection each). Also the host identity defaults (host NQN, host ID).
//!
//! The admin queue sits behind a mutex shared with the keep-alive thread;
//! that is the control path only. I/O queues are independent and lock-free.

use crate::error::{Error, NvmeError, Result};
use crate::queue::{IoCompletion, IoQueue, QueueParams, Slot};
use crate::transport::TransportParams;
use crate::trid::{TrType, TransportId, DISCOVERY_NQN};
use nvmf_core::tls::psk::{ConfiguredPsk, TlsPsk};
use nvmf_wire::fabrics::{self, CC_EN, CC_IOCQES_SHIFT, CC_IOSQES_SHIFT, CSTS_CFS, CSTS_RDY};
use nvmf_wire::identify::{IdentifyController, IdentifyNamespace, CMIC_ANA, CNTRLTYPE_DISCOVERY};
use nvmf_wire::zerocopy::FromBytes;
use nvmf_wire::{AdminOpcode, Command, FeatureId};
use std::sync::mpsc;
use std::sync::{Arc, Mutex, MutexGuard};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Identify CNS values.
const CNS_NAMESPACE: u32 = 0x00;
const CNS_CONTROLLER: u32 = 0x01;
const CNS_ACTIVE_NS_LIST: u32 = 0x02;
const CNS_NS_DESC_LIST: u32 = 0x03;

/// Asynchronous Event Configuration bit: ANA Change notices.
const AEC_ANA_CHANGE: u32 = 1 << 11;

/// Data buffer per admin slot; larger log pages are read in pieces.
const ADMIN_BUF: u32 = 64 * 1024;
/// Admin slots allocated (commands in flight at once on the admin queue).
const ADMIN_SLOTS: u16 = 4;

/// How to connect to a controller.
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// Address, port and subsystem NQN.
    pub trid: TransportId,
    pub hostnqn: String,
    /// Host identifier (must be the same on every queue of a controller).
    pub hostid: [u8; 16],
    pub hdr_digest: bool,
    pub data_digest: bool,
    /// Keep Alive Timeout (zero: none). Keep Alive is sent every KATO/2.
    pub kato: Duration,
    /// Admin queue size (entries announced in Connect).
    pub admin_queue_size: u16,
    /// Limit for the TCP connect, ICReq, Connect and each admin command.
    pub timeout: Duration,
    /// Ask for SQ flow control to be disabled on I/O queues (default: yes;
    /// this host never needs SQHD). The target may then complete a read
    /// with its last C2HData PDU (SUCCESS flag) instead of a response
    /// capsule: one PDU less per read.
    pub disable_sqflow: bool,
    /// TLS 1.3 with a PSK (`--tls-key`): every queue's TCP connection runs a
    /// TLS handshake before its ICReq.
    pub tls: Option<TlsKey>,
    /// Zero-copy sends of write data on I/O queues (`--zerocopy-send`;
    /// default auto: 16 KiB and up, off where the kernel copies anyway).
    pub zerocopy: Option<crate::queue::ZeroCopySend>,
}

/// The configured PSK a host connects with and the identity version it offers.
#[derive(Debug, Clone)]
pub struct TlsKey {
    pub key: Arc<ConfiguredPsk>,
    /// 1: `NVMe1R0x <hostnqn> <subnqn> <digest>` (default), 0: `NVMe0R0x <hostnqn> <subnqn>`.
    pub identity_version: u8,
    /// Hand established sessions to the kernel's TLS where it takes them (`--ktls`; default
    /// auto: OpenSSL's user-space records where the kernel has no `tls` module).
    pub ktls: nvmf_tls::Ktls,
}

impl TlsKey {
    /// Reads a key file (one `NVMeTLSkey-1:xx:...:` key; refused when group or others may read
    /// it, as the target's keyring refuses such files) for identity version 1 or 0.
    pub fn from_file(path: &str, identity_version: u8) -> Result<TlsKey> {
        if identity_version > 1 {
            return Err(Error::InvalidArg(format!(
                "TLS identity version {identity_version} (0 or 1)"
            )));
        }
        let text = nvmf_config::read_key_file(path).map_err(Error::InvalidArg)?;
        let key = ConfiguredPsk::parse(&text)
            .map_err(|e| Error::InvalidArg(format!("key file {path}: not a TLS PSK: {e}")))?;
        Ok(TlsKey {
            key: Arc::new(key),
            identity_version,
            ktls: nvmf_tls::Ktls::Auto,
        })
    }

    /// The TLS PSK and identity for one (host, subsystem) pair.
    pub fn derive(&self, hostnqn: &str, subnqn: &str) -> Result<TlsPsk> {
        let r = match self.identity_version {
            0 => self.key.tls_psk_v0(hostnqn, subnqn),
            _ => self.key.tls_psk_v1(hostnqn, subnqn),
        };
        r.map_err(|e| Error::InvalidArg(format!("TLS key: {e}")))
    }
}

impl ConnectOptions {
    /// Defaults: the host NQN from `default_hostnqn()`, its derived host
    /// ID, no digests, KATO 10 s for NVM subsystems and none for discovery,
    /// admin queue of 32, 10 s timeouts. A host NQN in `trid` is used.
    pub fn new(trid: TransportId) -> ConnectOptions {
        let hostnqn = trid.hostnqn.clone().unwrap_or_else(default_hostnqn);
        let hostid = hostid_from_nqn(&hostnqn);
        let kato = if trid.subnqn == DISCOVERY_NQN {
            Duration::ZERO
        } else {
            Duration::from_secs(10)
        };
        ConnectOptions {
            trid,
            hostnqn,
            hostid,
            hdr_digest: false,
            data_digest: false,
            kato,
            admin_queue_size: 32,
            tls: None,
            zerocopy: Some(crate::queue::ZeroCopySend::AUTO),
            timeout: Duration::from_secs(10),
            disable_sqflow: true,
        }
    }

    /// Set the host NQN (and the host ID derived from it).
    pub fn with_hostnqn(mut self, hostnqn: &str) -> Self {
        self.hostnqn = hostnqn.to_string();
        self.hostid = hostid_from_nqn(hostnqn);
        self
    }

    /// Connect with TLS 1.3 using `key` (identity version 1 or 0).
    pub fn with_tls(mut self, key: ConfiguredPsk, identity_version: u8) -> Self {
        self.tls = Some(TlsKey {
            key: Arc::new(key),
            identity_version,
            ktls: nvmf_tls::Ktls::Auto,
        });
        self
    }

    /// The TLS PSK for this host and the trid's subsystem, if TLS is on.
    pub(crate) fn tls_psk(&self) -> Result<Option<TlsPsk>> {
        match &self.tls {
            Some(k) => k.derive(&self.hostnqn, &self.trid.subnqn).map(Some),
            None => Ok(None),
        }
    }

    /// The kernel TLS mode of this connection's queues (Off without TLS).
    pub(crate) fn ktls(&self) -> nvmf_tls::Ktls {
        self.tls.as_ref().map_or(nvmf_tls::Ktls::Off, |k| k.ktls)
    }

    /// Ask for header and/or data digests.
    pub fn with_digests(mut self, hdr: bool, data: bool) -> Self {
        self.hdr_digest = hdr;
        self.data_digest = data;
        self
    }

    fn transport(&self) -> TransportParams {
        TransportParams {
            hdr_digest: self.hdr_digest,
            data_digest: self.data_digest,
            rdma: self.trid.trtype == TrType::Rdma,
        }
    }
}

/// The host NQN: `/etc/nvme/hostnqn` if present, else a UUID-based NQN
/// derived from `/etc/machine-id` (stable per machine), else from the
/// host name.
pub fn default_hostnqn() -> String {
    if let Ok(s) = std::fs::read_to_string("/etc/nvme/hostnqn") {
        let s = s.trim();
        if s.starts_with("nqn.") {
            return s.to_string();
        }
    }
    let seed = std::fs::read_to_string("/etc/machine-id")
        .or_else(|_| std::fs::read_to_string("/proc/sys/kernel/hostname"))
        .unwrap_or_else(|_| "nvmf-host".into());
    let id = hash16(seed.trim().as_bytes());
    format!("nqn.2014-08.org.nvmexpress:uuid:{}", format_uuid(&id))
}

/// The host ID for a host NQN: the UUID in a `...:uuid:<UUID>` NQN, else a
/// stable hash of the NQN (so every queue of a run agrees).
pub fn hostid_from_nqn(nqn: &str) -> [u8; 16] {
    if let Some(pos) = nqn.rfind(":uuid:") {
        if let Some(u) = parse_uuid(&nqn[pos + 6..]) {
            return u;
        }
    }
    hash16(nqn.as_bytes())
}

/// 16 bytes from two FNV-1a passes, shaped as a version 4 UUID.
fn hash16(data: &[u8]) -> [u8; 16] {
    let fnv = |seed: u64| {
        let mut h = seed;
        for &b in data {
            h ^= b as u64;
            h = h.wrapping_mul(0x100_0000_01b3);
        }
        h
    };
    let mut out = [0u8; 16];
    out[..8].copy_from_slice(&fnv(0xcbf2_9ce4_8422_2325).to_be_bytes());
    out[8..].copy_from_slice(&fnv(0x6c62_272e_07bb_0142).to_be_bytes());
    out[6] = (out[6] & 0x0f) | 0x40;
    out[8] = (out[8] & 0x3f) | 0x80;
    out
}

/// A UUID in text form (8-4-4-4-12 or 32 hex digits).
fn parse_uuid(s: &str) -> Option<[u8; 16]> {
    uuid::Uuid::try_parse(s).ok().map(|u| *u.as_bytes())
}

/// Lower-case 8-4-4-4-12 text of a UUID.
pub fn format_uuid(u: &[u8; 16]) -> String {
    uuid::Uuid::from_bytes(*u).hyphenated().to_string()
}

/// A namespace identifier from Identify CNS 03h.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NsIdentifier {
    Eui64([u8; 8]),
    Nguid([u8; 16]),
    Uuid([u8; 16]),
    Csi(u8),
    Other { nidt: u8, nid: Vec<u8> },
}

struct KeepAlive {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<()>,
}

/// A connected controller.
pub struct Controller {
    admin: Arc<Mutex<IoQueue>>,
    ka: Option<KeepAlive>,
    ka_error: Arc<Mutex<Option<String>>>,
    /// Admin slot of the outstanding Asynchronous Event Request, if any.
    aer: Mutex<Option<Slot>>,
    opts: ConnectOptions,
    cntlid: u16,
    cap: u64,
    vs: u32,
    ident: Box<IdentifyController>,
}

impl Controller {
    /// Connect the admin queue, enable the controller and read Identify
    /// Controller. Errors say what failed: connection refused, a Connect
    /// status ("Connect Invalid Parameters" for an unknown subsystem NQN,
    /// "Connect Invalid Host" for a host not allowed), timeouts.
    pub fn connect(opts: &ConnectOptions) -> Result<Controller> {
        let q = IoQueue::connect(&QueueParams {
            addr: opts.trid.socket_addr_string(),
            qid: 0,
            entries: opts.admin_queue_size.max(2),
            slots: ADMIN_SLOTS,
            buf_size: ADMIN_BUF,
            in_capsule: 0,
            transport: opts.transport(),
            kato_ms: opts.kato.as_millis().min(u32::MAX as u128) as u32,
            hostnqn: opts.hostnqn.clone(),
            hostid: opts.hostid,
            subnqn: opts.trid.subnqn.clone(),
            cntlid: fabrics::CNTLID_DYNAMIC,
            timeout: opts.timeout,
            disable_sqflow: false,
            tls: opts.tls_psk()?,
            ktls: opts.ktls(),
            zerocopy: None,
        })?;
        let cntlid = q.cntlid();
        let mut c = Controller {
            admin: Arc::new(Mutex::new(q)),
            ka: None,
            ka_error: Arc::new(Mutex::new(None)),
            aer: Mutex::new(None),
            opts: opts.clone(),
            cntlid,
            cap: 0,
            vs: 0,
            ident: Box::new(IdentifyController::new_zeroed_value()),
        };
        c.cap = c.property_get(fabrics::CAP, true)?;
        c.vs = c.property_get(fabrics::VS, false)? as u32;
        c.enable()?;
        c.ident = c.identify_controller()?;
        c.start_keep_alive();
        Ok(c)
    }

    fn enable(&self) -> Result<()> {
        let cc = CC_EN | (6 << CC_IOSQES_SHIFT) | (4 << CC_IOCQES_SHIFT);
        self.property_set(fabrics::CC, false, cc as u64)?;
        // CAP.TO: worst case time to ready, in 500 ms units.
        let to = ((self.cap >> 24) & 0xff).max(2) * 500;
        let limit = Duration::from_millis(to.min(60_000));
        let start = Instant::now();
        loop {
            let csts = self.property_get(fabrics::CSTS, false)? as u32;
            if csts & CSTS_CFS != 0 {
                return Err(Error::Protocol(
                    "controller reports fatal status (CSTS.CFS) after enable".into(),
                ));
            }
            if csts & CSTS_RDY != 0 {
                return Ok(());
            }
            if start.elapsed() > limit {
                return Err(Error::Timeout(format!(
                    "controller not ready (CSTS.RDY=0) {limit:?} after CC.EN=1"
                )));
            }
            std::thread::sleep(Duration::from_millis(10));
        }
    }

    fn start_keep_alive(&mut self) {
        if self.opts.kato.is_zero() {
            return;
        }
        let interval = (self.opts.kato / 2).max(Duration::from_millis(100));
        let (stop, rx) = mpsc::channel::<()>();
        let admin = Arc::clone(&self.admin);
        let err = Arc::clone(&self.ka_error);
        let timeout = self.opts.timeout;
        let thread = std::thread::Builder::new()
            .name("nvmf-keepalive".into())
            .spawn(move || loop {
                match rx.recv_timeout(interval) {
                    Err(mpsc::RecvTimeoutError::Timeout) => {
                        let cmd = Command::new(AdminOpcode::KeepAlive as u8, 0);
                        let r = admin_exec(&admin, "Keep Alive", cmd, None, None, timeout);
                        if let Err(e) = r {
                            *err.lock().unwrap_or_else(|p| p.into_inner()) = Some(e.to_string());
                            return;
                        }
                    }
                    _ => return,
                }
            })
            .expect("spawn keep-alive thread");
        self.ka = Some(KeepAlive { stop, thread });
    }

    /// The error that stopped the keep-alive thread, if any.
    pub fn keep_alive_error(&self) -> Option<String> {
        self.ka_error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    // ---- facts ----

    pub fn options(&self) -> &ConnectOptions {
        &self.opts
    }
    /// Controller ID assigned in the admin Connect.
    pub fn cntlid(&self) -> u16 {
        self.cntlid
    }
    /// CAP register.
    pub fn cap(&self) -> u64 {
        self.cap
    }
    /// Largest I/O queue size the controller supports (CAP.MQES + 1).
    pub fn max_queue_size(&self) -> u32 {
        (self.cap & 0xffff) as u32 + 1
    }
    /// VS register.
    pub fn version(&self) -> u32 {
        self.vs
    }
    /// Identify Controller data read at connect.
    pub fn identify(&self) -> &IdentifyController {
        &self.ident
    }
    /// True for a discovery controller.
    pub fn is_discovery(&self) -> bool {
        self.ident.cntrltype == CNTRLTYPE_DISCOVERY || self.opts.trid.subnqn == DISCOVERY_NQN
    }
    /// Largest write carried as in-capsule data on I/O queues (IOCCSZ × 16 − 64).
    pub fn in_capsule_size(&self) -> u32 {
        (self.ident.ioccsz.get().saturating_mul(16)).saturating_sub(64)
    }
    /// Largest transfer of one command (MDTS; CAP.MPSMIN pages), None if unlimited.
    pub fn max_transfer(&self) -> Option<u32> {
        let mdts = self.ident.mdts;
        if mdts == 0 {
            return None;
        }
        let mpsmin = 4096u64 << ((self.cap >> 48) & 0xf);
        Some((mpsmin << mdts).min(u32::MAX as u64) as u32)
    }

    // ---- admin commands ----

    fn lock(&self) -> MutexGuard<'_, IoQueue> {
        self.admin.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Run an admin command. `out` is sent to the controller, `into`
    /// receives data from it (at most one of them). `op` names the command
    /// in errors. Non-success status is an `Error::Nvme`.
    pub fn admin_command(
        &self,
        op: &'static str,
        cmd: Command,
        out: Option<&[u8]>,
        into: Option<&mut [u8]>,
    ) -> Result<IoCompletion> {
        admin_exec(&self.admin, op, cmd, out, into, self.opts.timeout)
    }

    /// Property Get (`size8`: 8-byte register).
    pub fn property_get(&self, offset: u32, size8: bool) -> Result<u64> {
        let c = self.admin_command(
            "Property Get",
            Command::property_get(0, offset, size8),
            None,
            None,
        )?;
        Ok(if size8 {
            c.dw0 as u64 | ((c.dw1 as u64) << 32)
        } else {
            c.dw0 as u64
        })
    }

    /// Property Set.
    pub fn property_set(&self, offset: u32, size8: bool, value: u64) -> Result<()> {
        self.admin_command(
            "Property Set",
            Command::property_set(0, offset, size8, value),
            None,
            None,
        )?;
        Ok(())
    }

    fn identify_raw(&self, op: &'static str, cns: u32, nsid: u32) -> Result<Box<[u8; 4096]>> {
        let mut buf = Box::new([0u8; 4096]);
        let mut c = Command::new(AdminOpcode::Identify as u8, 0);
        c.set_nsid(nsid).set_cdw10(cns);
        self.admin_command(op, c, None, Some(&mut buf[..]))?;
        Ok(buf)
    }

    /// Identify Controller (CNS 01h).
    pub fn identify_controller(&self) -> Result<Box<IdentifyController>> {
        let b = self.identify_raw("Identify Controller", CNS_CONTROLLER, 0)?;
        Ok(Box::new(
            IdentifyController::read_from_bytes(&b[..]).expect("4096 bytes"),
        ))
    }

    /// Identify Namespace (CNS 00h).
    pub fn identify_namespace(&self, nsid: u32) -> Result<Box<IdentifyNamespace>> {
        let b = self.identify_raw("Identify Namespace", CNS_NAMESPACE, nsid)?;
        Ok(Box::new(
            IdentifyNamespace::read_from_bytes(&b[..]).expect("4096 bytes"),
        ))
    }

    /// Active namespace IDs (CNS 02h), all of them (follows the list past 1024).
    pub fn active_namespaces(&self) -> Result<Vec<u32>> {
        let mut out = Vec::new();
        let mut start = 0u32;
        loop {
            let b =
                self.identify_raw("Identify Active Namespace List", CNS_ACTIVE_NS_LIST, start)?;
            let mut n = 0;
            for w in b.chunks_exact(4) {
                let id = u32::from_le_bytes([w[0], w[1], w[2], w[3]]);
                if id == 0 {
                    break;
                }
                out.push(id);
                n += 1;
            }
            if n < 1024 || start >= 0xffff_fffe {
                return Ok(out);
            }
            start = *out.last().expect("n > 0");
        }
    }

    /// Namespace Identification Descriptors (CNS 03h).
    pub fn ns_descriptors(&self, nsid: u32) -> Result<Vec<NsIdentifier>> {
        let b = self.identify_raw("Identify Namespace Descriptors", CNS_NS_DESC_LIST, nsid)?;
        Ok(nvmf_wire::identify::ns_descriptors(&b[..])
            .map(|(nidt, nid)| match (nidt, nid.len()) {
                (1, 8) => NsIdentifier::Eui64(nid.try_into().expect("8")),
                (2, 16) => NsIdentifier::Nguid(nid.try_into().expect("16")),
                (3, 16) => NsIdentifier::Uuid(nid.try_into().expect("16")),
                (4, 1) => NsIdentifier::Csi(nid[0]),
                _ => NsIdentifier::Other {
                    nidt,
                    nid: nid.to_vec(),
                },
            })
            .collect())
    }

    /// Set Features Number of Queues: ask for `n` I/O queue pairs, returns
    /// how many the controller allocated (min of SQs and CQs).
    pub fn set_num_queues(&self, n: u16) -> Result<u16> {
        let n = n.max(1) as u32 - 1;
        let mut c = Command::new(AdminOpcode::SetFeatures as u8, 0);
        c.set_cdw10(FeatureId::NumberOfQueues as u32)
            .set_cdw11(n | (n << 16));
        let r = self.admin_command("Set Features (Number of Queues)", c, None, None)?;
        let nsqa = (r.dw0 & 0xffff) + 1;
        let ncqa = (r.dw0 >> 16) + 1;
        Ok(nsqa.min(ncqa).min(0xffff) as u16)
    }

    /// Get Log Page `lid` for `nsid` from byte `offset` into `buf` (its
    /// length a multiple of 4), in pieces no larger than the admin buffer.
    pub fn get_log_page(&self, lid: u8, nsid: u32, offset: u64, buf: &mut [u8]) -> Result<()> {
        if !buf.len().is_multiple_of(4) || buf.is_empty() {
            return Err(Error::InvalidArg(format!(
                "log page length {} is not a non-zero multiple of 4",
                buf.len()
            )));
        }
        let mut done = 0usize;
        while done < buf.len() {
            let n = (buf.len() - done).min(ADMIN_BUF as usize);
            let mut c = Command::new(AdminOpcode::GetLogPage as u8, 0);
            c.set_nsid(nsid)
                .set_get_log_page(lid, n as u32, offset + done as u64);
            self.admin_command("Get Log Page", c, None, Some(&mut buf[done..done + n]))?;
            done += n;
        }
        Ok(())
    }

    /// Whether the controller reports Asymmetric Namespace Access (CMIC bit 3).
    pub fn ana_reporting(&self) -> bool {
        self.ident.cmic & CMIC_ANA != 0
    }

    /// Ask for ANA Change notices (Set Features Asynchronous Event
    /// Configuration, bit 11, keeping the bits already set).
    pub fn enable_ana_change_events(&self) -> Result<()> {
        let fid = FeatureId::AsyncEventConfig as u32;
        let mut g = Command::new(AdminOpcode::GetFeatures as u8, 0);
        g.set_cdw10(fid);
        let cur = self
            .admin_command("Get Features (Async Event Config)", g, None, None)
            .map(|c| c.dw0)
            .unwrap_or(0);
        let mut c = Command::new(AdminOpcode::SetFeatures as u8, 0);
        c.set_cdw10(fid).set_cdw11(cur | AEC_ANA_CHANGE);
        self.admin_command("Set Features (Async Event Config)", c, None, None)?;
        Ok(())
    }

    /// Keep one Asynchronous Event Request outstanding: submit one unless
    /// one is already waiting. Its completion is taken by `poll_async_event`.
    pub fn arm_async_event(&self) -> Result<()> {
        let mut aer = self.aer.lock().unwrap_or_else(|p| p.into_inner());
        if aer.is_some() {
            return Ok(());
        }
        let mut q = self.lock();
        let slot = q
            .alloc()
            .ok_or_else(|| Error::Timeout("admin queue has no free slot for an AER".into()))?;
        let cmd = Command::new(AdminOpcode::AsyncEventRequest as u8, 0);
        if let Err(e) = q.submit(slot, cmd, 0) {
            q.release(slot);
            return Err(e);
        }
        q.flush()?;
        *aer = Some(slot);
        Ok(())
    }

    /// Drive the admin queue without waiting and return the Asynchronous
    /// Event completion if it has arrived (the caller arms the next one).
    /// An error means the admin connection is gone.
    pub fn poll_async_event(&self) -> Result<Option<IoCompletion>> {
        let mut aer = self.aer.lock().unwrap_or_else(|p| p.into_inner());
        let Some(slot) = *aer else {
            return Ok(None);
        };
        let mut q = self.lock();
        q.poll(Some(Duration::ZERO))?;
        let Some(c) = q.take_completion(slot) else {
            return Ok(None);
        };
        q.release(slot);
        *aer = None;
        Ok(Some(c))
    }

    /// The ANA log page (0Ch) as raw bytes, long enough for every group
    /// descriptor and namespace list it announces (at most 64 KiB).
    pub fn ana_log(&self) -> Result<Vec<u8>> {
        let mut len = 4096usize;
        loop {
            let mut buf = vec![0u8; len];
            self.get_log_page(nvmf_wire::LogPageId::AnaLog as u8, 0, 0, &mut buf)?;
            let need = crate::multipath::ana_log_len(&buf);
            if need <= len || len >= ADMIN_BUF as usize {
                return Ok(buf);
            }
            len = need.next_multiple_of(4).min(ADMIN_BUF as usize);
        }
    }

    /// Send one Keep Alive now.
    pub fn keep_alive(&self) -> Result<()> {
        let cmd = Command::new(AdminOpcode::KeepAlive as u8, 0);
        self.admin_command("Keep Alive", cmd, None, None)?;
        Ok(())
    }

    /// Open I/O queue `qid` with `depth` commands outstanding at most (queue
    /// size announced = depth; must be ≤ CAP.MQES+1) and data buffers of
    /// `io_size` bytes per slot. Writes up to the controller's in-capsule
    /// size go in the capsule; larger ones use R2T/H2CData.
    pub fn create_io_queue(&self, qid: u16, depth: u16, io_size: u32) -> Result<IoQueue> {
        if qid == 0 {
            return Err(Error::InvalidArg("I/O queue IDs start at 1".into()));
        }
        if depth as u32 > self.max_queue_size() {
            return Err(Error::InvalidArg(format!(
                "queue depth {depth} exceeds the controller's maximum queue size {} (CAP.MQES+1)",
                self.max_queue_size()
            )));
        }
        if let Some(m) = self.max_transfer() {
            if io_size > m {
                return Err(Error::InvalidArg(format!(
                    "I/O size {io_size} exceeds the controller's maximum transfer {m} (MDTS)"
                )));
            }
        }
        IoQueue::connect(&QueueParams {
            addr: self.opts.trid.socket_addr_string(),
            qid,
            entries: depth.max(2),
            slots: depth.max(1),
            buf_size: io_size,
            in_capsule: self.in_capsule_size(),
            transport: self.opts.transport(),
            kato_ms: 0,
            hostnqn: self.opts.hostnqn.clone(),
            hostid: self.opts.hostid,
            subnqn: self.opts.trid.subnqn.clone(),
            cntlid: self.cntlid,
            timeout: self.opts.timeout,
            disable_sqflow: self.opts.disable_sqflow,
            tls: self.opts.tls_psk()?,
            ktls: self.opts.ktls(),
            zerocopy: self.opts.zerocopy,
        })
    }
}

impl Drop for Controller {
    fn drop(&mut self) {
        if let Some(ka) = self.ka.take() {
            let _ = ka.stop.send(());
            let _ = ka.thread.join();
        }
        let q = self.lock();
        q.shutdown();
    }
}

fn admin_exec(
    admin: &Mutex<IoQueue>,
    op: &'static str,
    cmd: Command,
    out: Option<&[u8]>,
    into: Option<&mut [u8]>,
    timeout: Duration,
) -> Result<IoCompletion> {
    let mut q = admin.lock().unwrap_or_else(|p| p.into_inner());
    let slot = q.alloc().ok_or_else(|| {
        Error::Timeout("admin queue has no free slot (earlier commands timed out)".into())
    })?;
    let len = match (&out, &into) {
        (Some(d), _) => d.len(),
        (_, Some(d)) => d.len(),
        _ => 0,
    };
    if len > q.buf_size() {
        q.release(slot);
        return Err(Error::InvalidArg(format!(
            "{op}: {len} bytes exceed the admin buffer"
        )));
    }
    if let Some(d) = out {
        q.buf_mut(slot)[..d.len()].copy_from_slice(d);
    }
    let c = q.execute(slot, cmd, len as u32, timeout)?;
    if let Some(d) = into {
        d.copy_from_slice(&q.buf(slot)[..d.len()]);
    }
    q.release(slot);
    if !c.status.is_success() {
        return Err(Error::Nvme(NvmeError {
            op,
            status: c.status,
            dw0: c.dw0,
            connect: false,
        }));
    }
    Ok(c)
}

/// Zeroed value helper (zerocopy's `FromZeros::new_zeroed` under a name
/// that does not clash with the trait import).
trait ZeroedValue: Sized {
    fn new_zeroed_value() -> Self;
}
impl<T: nvmf_wire::zerocopy::FromZeros> ZeroedValue for T {
    fn new_zeroed_value() -> Self {
        T::new_zeroed()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn hostid_from_uuid_nqn() {
        let id =
            hostid_from_nqn("nqn.2014-08.org.nvmexpress:uuid:01234567-89ab-cdef-0123-456789abcdef");
        assert_eq!(format_uuid(&id), "01234567-89ab-cdef-0123-456789abcdef");
        let a = hostid_from_nqn("nqn.2024-01.io.example:host1");
        assert_eq!(a, hostid_from_nqn("nqn.2024-01.io.example:host1"));
        assert_ne!(a, hostid_from_nqn("nqn.2024-01.io.example:host2"));
        assert!(default_hostnqn().starts_with("nqn."));
    }
}
