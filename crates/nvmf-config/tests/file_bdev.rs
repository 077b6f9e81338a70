//! Tests of file / block-device bdevs in the config: `bdev_uring_create` and
//! `bdev_aio_create` load, detect geometry, validate (errors name method,
//! parameter and problem) and write back the method they were created with
//! (save → load → save byte-identical).

use std::path::PathBuf;

use nvmf_config::{BdevKind, FileMethod, TargetConfig};

fn file(name: &str, size: u64) -> String {
    let dir = PathBuf::from(env!("CARGO_TARGET_TMPDIR")).join("config_file_bdev");
    std::fs::create_dir_all(&dir).unwrap();
    let p = dir.join(name);
    std::fs::File::create(&p).unwrap().set_len(size).unwrap();
    p.to_str().unwrap().to_string()
}

fn doc(method: &str, params: &str) -> String {
    format!(
        r#"{{"subsystems":[{{"subsystem":"bdev","config":[{{"method":"{method}","params":{{{params}}}}}]}},
        {{"subsystem":"nvmf","config":[
          {{"method":"nvmf_create_subsystem","params":{{"nqn":"nqn.2024-01.io.nvmfd:f","allow_any_host":true}}}},
          {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"nqn.2024-01.io.nvmfd:f","namespace":{{"nsid":1,"bdev_name":"F0"}}}}}}]}}]}}"#
    )
}

fn round_trip(cfg: &TargetConfig) -> String {
    let a = cfg.to_json_string_pretty();
    let again = TargetConfig::from_json_str(&a).unwrap();
    assert_eq!(&again, cfg);
    let b = again.to_json_string_pretty();
    assert_eq!(a, b, "save -> load -> save is byte-identical");
    a
}

#[test]
fn uring_loads_detects_and_round_trips() {
    let path = file("u.img", 1 << 20);
    let cfg = TargetConfig::from_json_str(&doc(
        "bdev_uring_create",
        &format!(r#""name":"F0","filename":"{path}""#),
    ))
    .unwrap();
    let b = &cfg.bdevs[0];
    assert_eq!(b.kind, BdevKind::File(FileMethod::Uring));
    assert_eq!(
        (b.block_size, b.num_blocks),
        (512, 2048),
        "block_size defaults to 512"
    );
    let f = b.file.as_ref().unwrap();
    assert_eq!(f.filename, path);
    assert!(!f.readonly && f.fallocate && !f.is_block_device);
    let saved = round_trip(&cfg);
    assert!(saved.contains("\"bdev_uring_create\""));
    assert!(
        !saved.contains("num_blocks"),
        "file bdevs are sized by their file"
    );
}

#[test]
fn aio_keeps_its_method_and_flags() {
    let path = file("a.img", 1 << 20);
    let cfg = TargetConfig::from_json_str(&doc(
        "bdev_aio_create",
        &format!(
            r#""name":"F0","filename":"{path}","block_size":4096,"readonly":true,"fallocate":false,"uuid":"1b4e28ba-2fa1-11d2-883f-0016d3cca427""#
        ),
    ))
    .unwrap();
    let b = &cfg.bdevs[0];
    assert_eq!(b.kind, BdevKind::File(FileMethod::Aio));
    assert_eq!((b.block_size, b.num_blocks), (4096, 256));
    let f = b.file.as_ref().unwrap();
    assert!(f.readonly && !f.fallocate);
    let saved = round_trip(&cfg);
    assert!(saved.contains("\"bdev_aio_create\""));
    assert!(saved.contains("1b4e28ba-2fa1-11d2-883f-0016d3cca427"));
}

#[test]
fn block_size_zero_means_detect() {
    let path = file("z.img", 65536);
    let cfg = TargetConfig::from_json_str(&doc(
        "bdev_uring_create",
        &format!(r#""name":"F0","filename":"{path}","block_size":0"#),
    ))
    .unwrap();
    assert_eq!(cfg.bdevs[0].block_size, 512);
}

fn err(method: &str, params: &str) -> String {
    TargetConfig::from_json_str(&doc(method, params))
        .unwrap_err()
        .to_string()
}

#[test]
fn missing_file_names_the_path() {
    let e = err(
        "bdev_uring_create",
        r#""name":"F0","filename":"/nonexistent/nvmfd-disk.img""#,
    );
    assert!(e.contains("bdev_uring_create"), "{e}");
    assert!(e.contains("filename"), "{e}");
    assert!(e.contains("/nonexistent/nvmfd-disk.img"), "{e}");
}

#[test]
fn bad_block_sizes() {
    let path = file("bs.img", 1 << 20);
    for bs in [1024, 520, 8192] {
        let e = err(
            "bdev_aio_create",
            &format!(r#""name":"F0","filename":"{path}","block_size":{bs}"#),
        );
        assert!(
            e.contains("bdev_aio_create") && e.contains("block_size"),
            "{e}"
        );
        assert!(e.contains(&bs.to_string()), "{e}");
    }
}

#[test]
fn other_validation_errors() {
    let small = file("small.img", 100);
    let e = err(
        "bdev_uring_create",
        &format!(r#""name":"F0","filename":"{small}""#),
    );
    assert!(e.contains("smaller than one"), "{e}");
    let path = file("v.img", 1 << 20);
    // bdev_uring_create has no readonly parameter.
    let e = err(
        "bdev_uring_create",
        &format!(r#""name":"F0","filename":"{path}","readonly":true"#),
    );
    assert!(e.contains("readonly"), "{e}");
    let e = err("bdev_aio_create", r#""name":"F0""#);
    assert!(e.contains("filename") && e.contains("missing"), "{e}");
    let e = err("bdev_aio_create", r#""name":"F0","filename":"/proc""#);
    assert!(
        e.contains("neither a regular file nor a block device"),
        "{e}"
    );
}
