//! bench/engines/: the load generators behind `trait Engine`
//! (`../engine.rs`), one file each: fio.rs (fio with our external ioengine,
//! fio on a kernel block device, fio client/server) with its JSON reader
//! fio_json.rs.

pub mod fio;
pub mod fio_json;
