//! Owns the tests of namespace identifier derivation at scale and NSID
//! assignment.

use std::collections::HashSet;

use nvmf_config::{derive_namespace_ids, random_namespace_ids, TargetConfig, Uuid16};
use serde_json::json;

fn config_with(n: usize, subsystems: usize, with_uuid: bool) -> String {
    let bdevs: Vec<_> = (0..n)
        .map(|i| {
            let mut p = json!({"name": format!("Malloc{i}"), "num_blocks": 16, "block_size": 512});
            if with_uuid {
                p["uuid"] = json!(format!("00000000-0000-4000-8000-{:012x}", i + 1));
            }
            json!({"method":"bdev_malloc_create","params":p})
        })
        .collect();
    let mut nvmf = vec![json!({"method":"nvmf_create_transport","params":{"trtype":"TCP"}})];
    for s in 0..subsystems {
        nvmf.push(json!({"method":"nvmf_create_subsystem","params":{"nqn":format!("nqn.2024-01.io.nvmfd:s{s}"),"max_namespaces":128}}));
    }
    for i in 0..n {
        nvmf.push(json!({"method":"nvmf_subsystem_add_ns","params":{
            "nqn": format!("nqn.2024-01.io.nvmfd:s{}", i % subsystems),
            "namespace": {"bdev_name": format!("Malloc{i}")}}}));
    }
    json!({"subsystems":[{"subsystem":"bdev","config":bdevs},{"subsystem":"nvmf","config":nvmf}]})
        .to_string()
}

fn assert_unique(c: &TargetConfig, expect: usize) {
    let mut nguids = HashSet::new();
    let mut euis = HashSet::new();
    let mut uuids = HashSet::new();
    for s in &c.subsystems {
        for ns in &s.namespaces {
            assert_ne!(ns.nguid, [0; 16]);
            assert_ne!(ns.eui64, [0; 8]);
            assert_ne!(ns.uuid, [0; 16]);
            assert!(nguids.insert(ns.nguid));
            assert!(euis.insert(ns.eui64));
            assert!(uuids.insert(ns.uuid));
        }
    }
    assert_eq!(nguids.len(), expect);
}

#[test]
fn seventy_namespaces_get_distinct_stable_ids() {
    for subsystems in [1, 3] {
        let text = config_with(70, subsystems, false);
        let a = TargetConfig::from_json_str(&text).unwrap_or_else(|e| panic!("{e}"));
        assert_unique(&a, 70);
        for s in &a.subsystems {
            for ns in &s.namespaces {
                assert_eq!(ns.uuid[6] >> 4, 8, "derived UUIDs are version 8");
                assert_eq!(ns.uuid[8] & 0xc0, 0x80, "RFC 9562 variant");
            }
        }
        // same file, same identifiers
        assert_eq!(TargetConfig::from_json_str(&text).unwrap(), a);
        // and they survive save → load
        let saved = a.to_json_string_pretty();
        assert_eq!(TargetConfig::from_json_str(&saved).unwrap(), a);
    }
}

#[test]
fn bdev_uuid_becomes_namespace_uuid_and_nguid() {
    let c = TargetConfig::from_json_str(&config_with(70, 2, true)).unwrap();
    assert_unique(&c, 70);
    for s in &c.subsystems {
        for ns in &s.namespaces {
            let bdev = c.bdev(&ns.bdev_name).unwrap();
            assert_eq!(Some(Uuid16(ns.uuid)), bdev.uuid);
            assert_eq!(ns.nguid, ns.uuid);
        }
    }
}

#[test]
fn nsid_zero_or_absent_takes_lowest_free() {
    let text = json!({"subsystems":[
        {"subsystem":"bdev","config":[
            {"method":"bdev_null_create","params":{"name":"A","num_blocks":8,"block_size":512}},
            {"method":"bdev_null_create","params":{"name":"B","num_blocks":8,"block_size":512}},
            {"method":"bdev_null_create","params":{"name":"C","num_blocks":8,"block_size":512}}]},
        {"subsystem":"nvmf","config":[
            {"method":"nvmf_create_transport","params":{"trtype":"TCP"}},
            {"method":"nvmf_create_subsystem","params":{"nqn":"nqn.2024-01.io.nvmfd:x"}},
            {"method":"nvmf_subsystem_add_ns","params":{"nqn":"nqn.2024-01.io.nvmfd:x","namespace":{"bdev_name":"A","nsid":2}}},
            {"method":"nvmf_subsystem_add_ns","params":{"nqn":"nqn.2024-01.io.nvmfd:x","namespace":{"bdev_name":"B","nsid":0}}},
            {"method":"nvmf_subsystem_add_ns","params":{"nqn":"nqn.2024-01.io.nvmfd:x","namespace":{"bdev_name":"C"}}}]}]}).to_string();
    let c = TargetConfig::from_json_str(&text).unwrap();
    let got: Vec<_> = c.subsystems[0]
        .namespaces
        .iter()
        .map(|n| (n.bdev_name.as_str(), n.nsid))
        .collect();
    assert_eq!(got, vec![("A", 2), ("B", 1), ("C", 3)]);
}

#[test]
fn explicit_ids_are_kept_verbatim() {
    let text = json!({"subsystems":[
        {"subsystem":"bdev","config":[{"method":"bdev_malloc_create","params":{"name":"A","num_blocks":8,"block_size":512,"uuid":"11111111-2222-4333-8444-555555555555"}}]},
        {"subsystem":"nvmf","config":[
            {"method":"nvmf_create_transport","params":{"trtype":"TCP"}},
            {"method":"nvmf_create_subsystem","params":{"nqn":"nqn.2024-01.io.nvmfd:x"}},
            {"method":"nvmf_subsystem_add_ns","params":{"nqn":"nqn.2024-01.io.nvmfd:x","namespace":{
                "bdev_name":"A","nguid":"00112233445566778899aabbccddeeff","eui64":"0123456789abcdef","uuid":"6ba7b810-9dad-11d1-80b4-00c04fd430c8"}}}]}]}).to_string();
    let c = TargetConfig::from_json_str(&text).unwrap();
    let ns = &c.subsystems[0].namespaces[0];
    assert_eq!(
        ns.nguid,
        [
            0x00, 0x11, 0x22, 0x33, 0x44, 0x55, 0x66, 0x77, 0x88, 0x99, 0xaa, 0xbb, 0xcc, 0xdd,
            0xee, 0xff
        ]
    );
    assert_eq!(ns.eui64, [0x01, 0x23, 0x45, 0x67, 0x89, 0xab, 0xcd, 0xef]);
    assert_eq!(
        Uuid16(ns.uuid).to_string(),
        "6ba7b810-9dad-11d1-80b4-00c04fd430c8"
    );
    let saved = c.to_json_string_pretty();
    assert!(
        saved.contains("\"nguid\": \"00112233445566778899AABBCCDDEEFF\""),
        "{saved}"
    );
    assert!(saved.contains("\"eui64\": \"0123456789ABCDEF\""));
}

#[test]
fn derivation_and_random_helpers() {
    let a = derive_namespace_ids("nqn.2024-01.io.nvmfd:x", 1, "A", None);
    assert_eq!(
        a,
        derive_namespace_ids("nqn.2024-01.io.nvmfd:x", 1, "A", None)
    );
    assert_ne!(
        a,
        derive_namespace_ids("nqn.2024-01.io.nvmfd:y", 1, "A", None)
    );
    assert_ne!(
        a,
        derive_namespace_ids("nqn.2024-01.io.nvmfd:x", 1, "B", None)
    );
    let mut seen = HashSet::new();
    for _ in 0..100 {
        let r = random_namespace_ids();
        assert!(seen.insert(r.uuid));
        assert_eq!(r.uuid[6] >> 4, 4);
    }
}
