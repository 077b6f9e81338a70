//! Kernel NVMe/TCP host against nvmfd serving a loop block device: a 64 MiB file on disk
//! (under target/, not tmpfs) is attached with `losetup -f --show --sector-size 4096`, and
//! nvmfd serves /dev/loopN through `bdev_aio_create` without a block_size, so the 4096-byte
//! logical block size is detected from sysfs. The QEMU guest's kernel host runs fio with
//! crc32c verification (tests/interop/fio-verify.sh: 4k randrw + 128k sequential, plain and
//! with digests). The loop device is detached by a Drop guard, also on failure.
//! Needs root (losetup); with NVMFD_INTEROP=1 a failing losetup fails the test.
//! Opt-in with NVMFD_INTEROP=1, like kernel_host.rs.

use std::process::Command;

use nvmf_interop::*;

const NQN: &str = "nqn.2016-06.io.spdk:loop1";
const SIZE: u64 = 64 << 20;
const SECTOR: u32 = 4096;

#[test]
fn fio_verify_on_loop_device() {
    let Some(_serial) = begin("fio_verify_on_loop_device") else {
        return;
    };
    let dir = work_dir("loop_backend");
    let img = dir.join("loop-backing.img");
    let fs_type = Command::new("stat")
        .args(["-f", "-c", "%T"])
        .arg(&dir)
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string())
        .unwrap_or_default();
    assert!(
        fs_type != "tmpfs" && fs_type != "ramfs",
        "{} is on {fs_type}; the loop-device test needs a file on disk (set CARGO_TARGET_DIR elsewhere)",
        dir.display()
    );
    // a fully allocated file (not sparse): the loop device really reads and writes the disk
    {
        use std::io::Write;
        let mut f = std::fs::File::create(&img).expect("create backing file");
        let chunk = vec![0u8; 1 << 20];
        for _ in 0..(SIZE >> 20) {
            f.write_all(&chunk).expect("write backing file");
        }
        f.sync_all().expect("sync backing file");
    }
    let lo = LoopDevice::attach(&img, SECTOR).unwrap_or_else(|e| {
        panic!(
            "{SWITCH}=1 but no loop device could be attached (the loop-device backend test needs root and /dev/loop-control): {e}"
        )
    });
    let dev = lo.path.to_str().unwrap().to_string();
    say(&format!(
        "interop fio_verify_on_loop_device: {} ({fs_type}) attached as {dev}, sector size {SECTOR}",
        img.display()
    ));
    let port = free_port();
    let mut cfg = spdk_config(
        port,
        &[],
        &[Subsystem {
            nqn: NQN.into(),
            serial: "NVMFDLOOP01".into(),
            model: "nvmfd loop test".into(),
            allow_any_host: true,
            hosts: vec![],
            namespaces: vec![(1, "Loop0")],
        }],
    );
    // no block_size: nvmfd detects the loop device's logical block size
    cfg["subsystems"][0]["config"] = serde_json::json!([{
        "method": "bdev_aio_create",
        "params": {"name": "Loop0", "filename": dev}
    }]);
    let mut nvmfd = Nvmfd::start(&dir, &cfg, port);
    let want = format!(
        "block_size={SECTOR} num_blocks={} direct=true block_device=true",
        SIZE / SECTOR as u64
    );
    let opened = nvmfd
        .log()
        .lines()
        .find(|l| l.contains("file bdev opened") && l.contains("bdev=Loop0"))
        .map(str::to_string);
    assert!(
        opened.as_deref().is_some_and(|l| l.contains(&want)),
        "nvmfd did not open {dev} as a block device with `{want}`:\n{}",
        nvmfd.log()
    );
    say(&format!(
        "interop fio_verify_on_loop_device: {}",
        opened.unwrap().trim()
    ));
    fio_verify_scenario("fio_verify_on_loop_device", &dir, port, NQN, &mut nvmfd);
    // nvmfd is stopped before the loop device is detached (drop order: nvmfd, then lo)
    drop(nvmfd);
    drop(lo);
}
