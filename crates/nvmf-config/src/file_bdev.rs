//! Owns loading file / block-device bdevs (`bdev_uring_create`,
//! `bdev_aio_create`): parameter validation, checking that the file exists
//! and probing its size and logical block size (std only: block devices are
//! sized by seeking to their end, their logical block size comes from
//! sysfs), and the SPDK parameters written back by save_config.

use std::fs::File;
use std::io::{Seek, SeekFrom};
use std::os::unix::fs::{FileTypeExt, MetadataExt};

use serde_json::{json, Map, Value};

use crate::params::Params;
use crate::parse::bdev_uuid;
use crate::{BdevConfig, BdevKind, ConfigError, FileBdev, FileMethod, TargetConfig};

/// Block sizes a file bdev may be given.
pub const FILE_BLOCK_SIZES: [u32; 2] = [512, 4096];

/// What probing a path found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Probe {
    pub is_block_device: bool,
    pub size_bytes: u64,
    /// Logical block size of the device (512 for regular files).
    pub device_block_size: u32,
}

/// Size and logical block size of a regular file or block device.
pub fn probe(path: &str) -> Result<Probe, String> {
    let md = std::fs::metadata(path).map_err(|e| format!("cannot open \"{path}\": {e}"))?;
    let ft = md.file_type();
    if ft.is_file() {
        return Ok(Probe {
            is_block_device: false,
            size_bytes: md.len(),
            device_block_size: 512,
        });
    }
    if !ft.is_block_device() {
        return Err(format!(
            "\"{path}\" is neither a regular file nor a block device"
        ));
    }
    let mut f = File::open(path).map_err(|e| format!("cannot open \"{path}\": {e}"))?;
    let size_bytes = f
        .seek(SeekFrom::End(0))
        .map_err(|e| format!("cannot size block device \"{path}\": {e}"))?;
    let rdev = md.rdev();
    let major = ((rdev >> 8) & 0xfff) | ((rdev >> 32) & !0xfff);
    let minor = (rdev & 0xff) | ((rdev >> 12) & !0xff);
    let sys = format!("/sys/dev/block/{major}:{minor}");
    // Partitions have no queue/ of their own: use the parent disk's.
    let lbs = [
        format!("{sys}/queue/logical_block_size"),
        format!("{sys}/../queue/logical_block_size"),
    ]
    .iter()
    .find_map(|p| std::fs::read_to_string(p).ok())
    .and_then(|s| s.trim().parse::<u32>().ok())
    .unwrap_or(512);
    Ok(Probe {
        is_block_device: true,
        size_bytes,
        device_block_size: lbs,
    })
}

/// `bdev_uring_create` / `bdev_aio_create`.
pub(crate) fn create(
    cfg: &mut TargetConfig,
    mut p: Params<'_>,
    method: FileMethod,
) -> Result<(), ConfigError> {
    let name = p.req_str("name")?.to_string();
    if name.is_empty() {
        return Err(p.err("name", "bdev name must not be empty"));
    }
    if cfg.bdev(&name).is_some() {
        return Err(p.err("name", format!("a bdev named \"{name}\" already exists")));
    }
    let filename = p.req_str("filename")?.to_string();
    if filename.is_empty() {
        return Err(p.err("filename", "must not be empty"));
    }
    let given_bs = p.opt_u32("block_size")?.unwrap_or(0);
    let (readonly, fallocate) = match method {
        FileMethod::Aio => (
            p.opt_bool("readonly")?.unwrap_or(false),
            p.opt_bool("fallocate")?.unwrap_or(false),
        ),
        FileMethod::Uring => (false, true),
    };
    let uuid = bdev_uuid(cfg, &mut p)?;
    p.finish()?;
    if given_bs != 0 && !FILE_BLOCK_SIZES.contains(&given_bs) {
        return Err(p.err(
            "block_size",
            format!("{given_bs} is not supported (use 512 or 4096, or 0 to detect)"),
        ));
    }
    let probe = probe(&filename).map_err(|e| p.err("filename", e))?;
    let block_size = if given_bs == 0 {
        probe.device_block_size
    } else {
        given_bs
    };
    if block_size < probe.device_block_size {
        return Err(p.err(
            "block_size",
            format!(
                "{block_size} is smaller than the logical block size {} of \"{filename}\"",
                probe.device_block_size
            ),
        ));
    }
    if !FILE_BLOCK_SIZES.contains(&block_size) {
        return Err(p.err(
            "block_size",
            format!(
                "detected logical block size {block_size} of \"{filename}\" is not 512 or 4096"
            ),
        ));
    }
    let num_blocks = probe.size_bytes / u64::from(block_size);
    if num_blocks == 0 {
        return Err(p.err(
            "filename",
            format!(
                "\"{filename}\" ({} bytes) is smaller than one {block_size}-byte block",
                probe.size_bytes
            ),
        ));
    }
    cfg.bdevs.push(BdevConfig {
        name,
        kind: BdevKind::File(method),
        block_size,
        num_blocks,
        uuid,
        file: Some(FileBdev {
            filename,
            readonly,
            fallocate,
            is_block_device: probe.is_block_device,
            device_block_size: probe.device_block_size,
        }),
        rbd: None,
    });
    Ok(())
}

/// The save_config parameters of a file bdev (SPDK's names and order).
pub(crate) fn params(b: &BdevConfig, f: &FileBdev, method: FileMethod) -> Value {
    let mut p = Map::new();
    p.insert("name".into(), json!(b.name));
    p.insert("filename".into(), json!(f.filename));
    p.insert("block_size".into(), json!(b.block_size));
    if method == FileMethod::Aio {
        p.insert("readonly".into(), json!(f.readonly));
        p.insert("fallocate".into(), json!(f.fallocate));
    }
    if let Some(u) = &b.uuid {
        p.insert("uuid".into(), json!(u.to_string()));
    }
    Value::Object(p)
}
