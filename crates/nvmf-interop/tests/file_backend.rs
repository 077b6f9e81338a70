//! Kernel NVMe/TCP host against nvmfd serving a file bdev: the QEMU guest's
//! kernel host runs fio with crc32c verification (tests/interop/fio-verify.sh,
//! plain and with digests) on a namespace backed by `bdev_uring_create` over a
//! 64 MiB file with 4096-byte blocks (O_DIRECT through the per-reactor
//! io_uring). Opt-in with NVMFD_INTEROP=1, like kernel_host.rs.

use nvmf_interop::*;

const NQN: &str = "nqn.2016-06.io.spdk:file1";

#[test]
fn fio_verify_on_file_bdev() {
    let Some(_serial) = begin("fio_verify_on_file_bdev") else {
        return;
    };
    let dir = work_dir("file_backend");
    let img = dir.join("disk.img");
    std::fs::File::create(&img)
        .unwrap()
        .set_len(64 << 20)
        .unwrap();
    let port = free_port();
    let mut cfg = spdk_config(
        port,
        &[],
        &[Subsystem {
            nqn: NQN.into(),
            serial: "NVMFDFILE01".into(),
            model: "nvmfd file test".into(),
            allow_any_host: true,
            hosts: vec![],
            namespaces: vec![(1, "File0")],
        }],
    );
    cfg["subsystems"][0]["config"] = serde_json::json!([{
        "method": "bdev_uring_create",
        "params": {"name": "File0", "filename": img.to_str().unwrap(), "block_size": 4096}
    }]);
    let mut nvmfd = Nvmfd::start(&dir, &cfg, port);
    assert!(
        nvmfd.log().contains("direct=true"),
        "file bdev not opened with O_DIRECT:\n{}",
        nvmfd.log()
    );
    fio_verify_scenario("fio_verify_on_file_bdev", &dir, port, NQN, &mut nvmfd);
}
