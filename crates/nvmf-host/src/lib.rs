//! nvmf-host: a user-space NVMe over Fabrics initiator for NVMe/TCP, and the
//! engine of the `nvmf` command line tool (discover, perf).
//!
//! * [`Controller`] (controller.rs): connect to a discovery or NVM subsystem,
//!   blocking admin commands (Identify, Get Log Page, Set Features, Keep Alive).
//! * [`IoQueue`] (queue.rs): a pipelined I/O queue over its own TCP
//!   connection with preallocated command slots; no allocation or locks per I/O.
//! * transport.rs: the socket, ICReq/ICResp, batched send / bulk receive.
//! * discovery.rs: the discovery log and its `nvme discover` text form.
//! * trid.rs: SPDK transport ID strings.
//! * perf/: the load generator behind `nvmf perf` (mod.rs: setup and run;
//!   workload.rs: patterns and verify; engine.rs: the per-thread I/O engine
//!   with multipath fail-over; report.rs: results, text and JSON).
//! * multipath.rs: several paths to one subsystem (path set, discovery of
//!   paths, ANA log and AER, path state, monitor thread, policies).
//! * error.rs: errors with NVMe status names.
//! * kernel_host/: the Linux kernel host (`nvmf connect`, `connect-all`, `doctor`): sysfs and
//!   /etc/nvme readers, the /dev/nvme-fabrics connect, nvme-cli's autoconnect files, checks.
//! * top.rs: the interval rates and text of `nvmf top` (per-path statistics of nvmfd).
//! * bench/: `nvmf bench` (spec.rs: TOML spec and presets; matrix.rs: the ordered
//!   run list; placement.rs: route, NUMA node, CPUs, busy cores; mod.rs: the plan;
//!   engines/fio.rs + fio_json.rs: the fio engines and fio's JSON;
//!   targets/spdk.rs, targets/kernel.rs: SPDK and kernel targets; engines/spdk_perf.rs).
//!
//! ```no_run
//! use nvmf_host::{Controller, ConnectOptions, TransportId};
//! let trid = TransportId::parse("trtype:TCP traddr:127.0.0.1 trsvcid:4420 subnqn:nqn.2024-01.io.nvmfd:default")?;
//! let ctrl = Controller::connect(&ConnectOptions::new(trid))?;
//! println!("{}", ctrl.identify().model());
//! let mut q = ctrl.create_io_queue(1, 32, 4096)?;
//! let slot = q.alloc().unwrap();
//! let c = q.execute(slot, {
//!     let mut c = nvmf_wire::Command::new(nvmf_wire::IoOpcode::Read as u8, 0);
//!     c.set_nsid(1).set_lba_range(0, 8); c }, 4096, std::time::Duration::from_secs(5))?;
//! assert!(c.status.is_success());
//! # Ok::<(), nvmf_host::Error>(())
//! ```

pub mod bench;
pub mod controller;
pub mod discovery;
pub mod error;
pub mod gw;
pub mod kernel_host;
pub mod multipath;
pub mod perf;
pub mod queue;
mod rdma;
pub mod top;
pub mod transport;
pub mod trid;

pub use controller::{
    default_hostnqn, hostid_from_nqn, ConnectOptions, Controller, NsIdentifier, TlsKey,
};
pub use discovery::{format_nvme_cli, DiscoveryEntry, DiscoveryLog};
pub use error::{Error, NvmeError, Result};
pub use queue::{IoCompletion, IoQueue, QueueParams, Slot, ZeroCopySend};
pub use transport::{Negotiated, TransportParams};
pub use trid::{TransportId, DISCOVERY_NQN};
