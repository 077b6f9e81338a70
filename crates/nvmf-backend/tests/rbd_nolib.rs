//! A machine without Ceph's client libraries: creating an rbd bdev fails
//! with a message naming the missing library and the package to install
//! (simulated with library names that do not exist; its own test binary,
//! since the binding is loaded once per process). Other backends work.

use nvmf_backend::{create, rbd};
use nvmf_config::{BdevConfig, BdevKind, RbdBdev};

#[test]
fn missing_librbd_fails_creation_with_the_package_to_install() {
    assert!(rbd::ffi::use_library_names(
        "libnvmfd-test-missing-rados.so.2",
        "libnvmfd-test-missing-rbd.so.1"
    ));
    let cfg = BdevConfig {
        name: "rbd0".into(),
        kind: BdevKind::Rbd,
        block_size: 4096,
        num_blocks: 0,
        uuid: None,
        file: None,
        rbd: Some(RbdBdev {
            pool_name: "rbd".into(),
            rbd_name: "img".into(),
            user_id: None,
            config_param: [("mon_host".to_string(), "127.0.0.1:1".to_string())].into(),
            cluster_name: None,
            read_only: false,
        }),
    };
    let e = create(&cfg).unwrap_err();
    eprintln!("{e}");
    assert!(e.to_string().starts_with("bdev rbd0: "), "{e}");
    assert!(e.reason.contains("libnvmfd-test-missing-rados.so.2"), "{e}");
    assert!(e.reason.contains("librbd1"), "{e}");
    // Registering a cluster says the same.
    let c = nvmf_config::RbdCluster {
        name: "c".into(),
        user_id: None,
        config_param: Default::default(),
        config_file: None,
        key_file: None,
    };
    let e = rbd::register_cluster(&c).unwrap_err();
    assert!(e.contains("librbd1"), "{e}");
    // The other backends are unaffected.
    let null = BdevConfig {
        name: "n".into(),
        kind: BdevKind::Null,
        num_blocks: 8,
        rbd: None,
        ..cfg
    };
    assert_eq!(create(&null).unwrap().kind(), "null");
}
