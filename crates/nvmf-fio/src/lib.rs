//! nvmf-fio: a fio external ioengine (`libnvmf_fio.so`) that runs fio jobs
//! against NVMe/TCP subsystems through nvmf-host's user-space initiator,
//! without a kernel host (what SPDK's fio plugin does for SPDK).
//!
//! * filename.rs: the `--filename` syntax (transport ID words, `\:` for ':').
//! * engine.rs: probe (namespace size) and `Job` (a controller and an I/O
//!   queue per file; queue / commit / getevents; no allocation per I/O).
//! * ffi.rs: the C ABI the shim calls, panic-safe.
//! * csrc/nvmf_fio.c: the shim, compiled against the configured fio source
//!   tree of the installed fio (its `struct ioengine_ops`, `thread_data` and
//!   `io_u` layouts are that build's) by build.rs when `FIO_SRC` is set;
//!   without it the library has no fio entry point (`get_ioengine`).
//!
//! scripts/build-fio-engine.sh fetches and configures the matching fio
//! source and installs the engine as target/nvmf-fio/libnvmf_fio.so. See
//! docs/FIO.md.

pub mod engine;
pub mod ffi;
pub mod filename;

/// Where scripts/build-fio-engine.sh puts the engine, relative to the
/// workspace root; `NVMF_FIO_ENGINE` (a path) overrides it for tools.
pub const DEFAULT_ENGINE_PATH: &str = "target/nvmf-fio/libnvmf_fio.so";
