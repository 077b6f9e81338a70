//! Owns the tests of the embedded default config and its example file.

use nvmf_config::{load_file, AddressFamily, BdevKind, TargetConfig, TransportType, DISCOVERY_NQN};

const EXAMPLE: &str = concat!(env!("CARGO_MANIFEST_DIR"), "/examples/default.json");

#[test]
fn example_file_is_the_embedded_default() {
    let from_file = load_file(EXAMPLE).expect("examples/default.json loads");
    assert_eq!(from_file, TargetConfig::embedded_default());
    // and the file is exactly what we would write
    let text = std::fs::read_to_string(EXAMPLE).unwrap();
    assert_eq!(
        text,
        TargetConfig::embedded_default().to_json_string_pretty()
    );
}

#[test]
fn embedded_default_matches_design() {
    let c = TargetConfig::embedded_default();
    assert_eq!(c.bdevs.len(), 1);
    let b = &c.bdevs[0];
    assert_eq!(
        (b.name.as_str(), b.kind, b.block_size),
        ("Malloc0", BdevKind::Malloc, 512)
    );
    assert_eq!(b.size_bytes(), 1 << 30);
    assert_eq!(c.transports.len(), 1);
    let t = &c.transports[0];
    assert_eq!(t.trtype, TransportType::Tcp);
    assert_eq!(
        (
            t.max_queue_depth,
            t.max_io_qpairs_per_ctrlr,
            t.in_capsule_data_size,
            t.max_io_size,
            t.io_unit_size,
            t.max_aq_depth,
            t.c2h_success
        ),
        (128, 127, 4096, 131072, 131072, 128, true)
    );
    assert_eq!(c.subsystems.len(), 1);
    let s = &c.subsystems[0];
    assert_eq!(s.nqn, "nqn.2024-01.io.nvmfd:default");
    assert_eq!(s.serial_number, "NVMFD0000000001");
    assert_eq!(s.model_number, "nvmfd RAM disk");
    assert!(s.allow_any_host);
    assert!(s.host_allowed("nqn.2014-08.org.nvmexpress:uuid:6ba7b810-9dad-11d1-80b4-00c04fd430c8"));
    assert_eq!(s.namespaces.len(), 1);
    assert_eq!(s.namespaces[0].nsid, 1);
    assert_eq!(s.namespaces[0].bdev_name, "Malloc0");
    assert_ne!(s.namespaces[0].nguid, [0; 16]);
    assert_ne!(s.namespaces[0].eui64, [0; 8]);
    assert_ne!(s.namespaces[0].uuid, [0; 16]);
    assert_eq!(s.listeners.len(), 1);
    let l = &s.listeners[0];
    assert_eq!(
        (l.trtype, l.adrfam, l.traddr.as_str(), l.trsvcid.as_str()),
        (TransportType::Tcp, AddressFamily::Ipv4, "127.0.0.1", "4420")
    );
    assert_eq!(l.port(), Some(4420));
    assert_eq!(c.discovery_listeners, vec![l.clone()]);
    assert_eq!(c.listen_addresses(), vec![l]);
    assert!(c.skipped.is_empty());
    assert!(c.subsystem(DISCOVERY_NQN).is_none());
}
