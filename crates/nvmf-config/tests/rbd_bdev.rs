//! Tests of Ceph RBD configuration: `bdev_rbd_register_cluster` and
//! `bdev_rbd_create` load with SPDK's parameter names and defaults, validate
//! (errors name method, parameter and problem), write back clusters before
//! bdevs (save → load → save byte-identical), and what SPDK's own save_config
//! writes for an rbd bdev loads.

use nvmf_config::{BdevKind, TargetConfig};

fn doc(bdev_entries: &str) -> String {
    format!(
        r#"{{"subsystems":[{{"subsystem":"bdev","config":[{bdev_entries}]}},
        {{"subsystem":"nvmf","config":[
          {{"method":"nvmf_create_subsystem","params":{{"nqn":"nqn.2024-01.io.nvmfd:r","allow_any_host":true}}}}]}}]}}"#
    )
}

fn round_trip(cfg: &TargetConfig) -> String {
    let a = cfg.to_json_string_pretty();
    let mut again = TargetConfig::from_json_str(&a).unwrap();
    // Ignored parameters (core_mask) are not written back.
    let mut want = cfg.clone();
    want.ignored_params
        .retain(|p| again.ignored_params.contains(p));
    assert_eq!(again, want);
    again.ignored_params.clear();
    let b = again.to_json_string_pretty();
    assert_eq!(a, b, "save -> load -> save is byte-identical");
    a
}

fn err(entries: &str) -> String {
    TargetConfig::from_json_str(&doc(entries))
        .unwrap_err()
        .to_string()
}

const CLUSTER: &str = r#"{"method":"bdev_rbd_register_cluster","params":{"name":"c1","user_id":"nvmfd",
    "config_param":{"mon_host":"127.0.0.1:6789","rados_osd_op_timeout":"20"},
    "config_file":"/etc/ceph/ceph.conf","key_file":"/etc/ceph/k.keyring","core_mask":"0x3"}}"#;

#[test]
fn cluster_and_bdev_load_and_round_trip() {
    let cfg = TargetConfig::from_json_str(&doc(&format!(
        r#"{CLUSTER},
        {{"method":"bdev_rbd_create","params":{{"name":"R0","pool_name":"rbd","rbd_name":"img0",
          "cluster_name":"c1","uuid":"1b4e28ba-2fa1-11d2-883f-0016d3cca427"}}}},
        {{"method":"bdev_rbd_create","params":{{"pool_name":"rbd","rbd_name":"img1","block_size":4096,
          "user_id":"admin","config":{{"mon_host":"10.0.0.1","key":"AQD=="}}}}}}"#
    )))
    .unwrap();
    assert_eq!(cfg.rbd_clusters.len(), 1);
    let c = &cfg.rbd_clusters[0];
    assert_eq!(c.name, "c1");
    assert_eq!(c.user_id.as_deref(), Some("nvmfd"));
    assert_eq!(c.config_param["rados_osd_op_timeout"], "20");
    assert_eq!(c.key_file.as_deref(), Some("/etc/ceph/k.keyring"));
    assert!(cfg
        .ignored_params
        .contains(&"bdev_rbd_register_cluster.core_mask".to_string()));

    let r0 = &cfg.bdevs[0];
    assert_eq!(
        (r0.kind, r0.block_size, r0.num_blocks),
        (BdevKind::Rbd, 512, 0)
    );
    let rb = r0.rbd.as_ref().unwrap();
    assert_eq!(
        (rb.pool_name.as_str(), rb.rbd_name.as_str()),
        ("rbd", "img0")
    );
    assert_eq!(rb.cluster_name.as_deref(), Some("c1"));
    let r1 = &cfg.bdevs[1];
    assert_eq!(r1.name, "Ceph0", "SPDK's default name");
    assert_eq!(r1.block_size, 4096);
    assert_eq!(r1.rbd.as_ref().unwrap().config_param["key"], "AQD==");

    let saved = round_trip(&cfg);
    let reg = saved.find("bdev_rbd_register_cluster").unwrap();
    let create = saved.find("bdev_rbd_create").unwrap();
    assert!(
        reg < create,
        "clusters are written before the bdevs:\n{saved}"
    );
    assert!(!saved.contains("core_mask"), "ignored: not written back");
    assert!(saved.contains("\"cluster_name\": \"c1\""));
    assert!(
        !saved.contains("num_blocks"),
        "an image's size lives in the cluster"
    );
}

#[test]
fn spdk_save_config_of_an_rbd_bdev_loads() {
    // The shape SPDK's bdev_rbd module writes (bdev_rbd_write_config_json):
    // name, pool_name, rbd_name, block_size, user_id, config, uuid.
    let cfg = TargetConfig::from_json_str(&doc(
        r#"{"method":"bdev_rbd_create","params":{"name":"Ceph0","pool_name":"rbd","rbd_name":"foo",
          "block_size":4096,"user_id":"admin","config":{"mon_host":"192.168.7.1:6789","key":"AQDwf8db7zR1GRAA5k7NKXjS5S5V4mntwUDnGQ=="},
          "uuid":"76210ea4-7920-40a0-a07b-8992a7443c76"}}"#,
    ))
    .unwrap();
    let b = &cfg.bdevs[0];
    assert_eq!(b.name, "Ceph0");
    assert_eq!(
        b.uuid.unwrap().to_string(),
        "76210ea4-7920-40a0-a07b-8992a7443c76"
    );
    let r = b.rbd.as_ref().unwrap();
    assert_eq!(r.user_id.as_deref(), Some("admin"));
    assert_eq!(r.config_param["mon_host"], "192.168.7.1:6789");
    round_trip(&cfg);
}

#[test]
fn config_param_is_an_alias_of_config() {
    let cfg = TargetConfig::from_json_str(&doc(
        r#"{"method":"bdev_rbd_create","params":{"name":"R","pool_name":"p","rbd_name":"i",
          "config_param":{"rbd_cache":"true"}}}"#,
    ))
    .unwrap();
    assert_eq!(
        cfg.bdevs[0].rbd.as_ref().unwrap().config_param["rbd_cache"],
        "true"
    );
    let saved = round_trip(&cfg);
    assert!(saved.contains("\"config\": {"), "written with SPDK's name");
}

#[test]
fn user_id_and_config_beside_a_cluster_are_noted_as_ignored() {
    let cfg = TargetConfig::from_json_str(&doc(&format!(
        r#"{CLUSTER},{{"method":"bdev_rbd_create","params":{{"name":"R","pool_name":"p","rbd_name":"i",
          "cluster_name":"c1","user_id":"x","config":{{"a":"b"}}}}}}"#
    )))
    .unwrap();
    for p in ["bdev_rbd_create.user_id", "bdev_rbd_create.config"] {
        assert!(cfg.ignored_params.contains(&p.to_string()), "{p}");
        assert!(nvmf_config::ignored_param_names().contains(&p.to_string()));
    }
    round_trip(&cfg);
}

/// `read_only` (rpc.py v26.05 sends it on every `bdev_rbd_create`, false
/// unless `-r`): false loads as a writable bdev and is not written back (the
/// entry stays as SPDK writes it); true is kept, written back and read again.
#[test]
fn read_only_loads_and_round_trips() {
    let cfg = TargetConfig::from_json_str(&doc(
        r#"{"method":"bdev_rbd_create","params":{"name":"RW","pool_name":"rbd","rbd_name":"a",
          "block_size":512,"read_only":false}},
        {"method":"bdev_rbd_create","params":{"name":"RO","pool_name":"rbd","rbd_name":"b",
          "block_size":4096,"read_only":true}}"#,
    ))
    .unwrap();
    let (rw, ro) = (&cfg.bdevs[0], &cfg.bdevs[1]);
    assert!(!rw.rbd.as_ref().unwrap().read_only && !rw.read_only());
    assert!(ro.rbd.as_ref().unwrap().read_only && ro.read_only());
    let saved = round_trip(&cfg);
    let v: serde_json::Value = serde_json::from_str(&saved).unwrap();
    let entries = v["subsystems"][0]["config"].as_array().unwrap();
    let params = |name: &str| {
        entries
            .iter()
            .find(|e| e["params"]["name"] == name)
            .map(|e| e["params"].clone())
            .unwrap()
    };
    assert!(params("RW").get("read_only").is_none(), "{saved}");
    assert_eq!(params("RO")["read_only"], true, "{saved}");
    let again = TargetConfig::from_json_str(&saved).unwrap();
    assert!(again.bdev("RO").unwrap().read_only());
    assert!(!again.bdev("RW").unwrap().read_only());
}

#[test]
fn validation_errors_name_the_parameter() {
    let rbd = |extra: &str| {
        format!(
            r#"{{"method":"bdev_rbd_create","params":{{"name":"R","pool_name":"p","rbd_name":"i"{extra}}}}}"#
        )
    };
    for (entries, want) in [
        (
            rbd(r#","cluster_name":"nope""#),
            r#"cluster_name": no cluster "nope" (bdev_rbd_register_cluster must come first)"#,
        ),
        (
            rbd(r#","block_size":1000"#),
            "1000 is not a power of two in 512..=4096",
        ),
        (
            rbd(r#","block_size":8192"#),
            "8192 is not a power of two in 512..=4096",
        ),
        (rbd(r#","config":{"a":1}"#), "config.a"),
        (
            rbd(r#","config":{"a":"1"},"config_param":{"b":"2"}"#),
            "give the librados configuration once",
        ),
        (rbd(r#","pool":"x""#), "unknown parameter"),
        (rbd(r#","read_only":"yes""#), "read_only"),
        (
            r#"{"method":"bdev_rbd_create","params":{"name":"R","rbd_name":"i"}}"#.to_string(),
            "pool_name",
        ),
        (
            r#"{"method":"bdev_rbd_create","params":{"name":"R","pool_name":"","rbd_name":"i"}}"#
                .to_string(),
            "pool_name\": must not be empty",
        ),
        (
            format!("{},{}", rbd(""), rbd("")),
            r#"a bdev named "R" already exists"#,
        ),
        (
            format!("{CLUSTER},{CLUSTER}"),
            r#"a cluster named "c1" is already registered"#,
        ),
        (
            r#"{"method":"bdev_rbd_register_cluster","params":{"user_id":"a"}}"#.to_string(),
            "name\": missing required parameter",
        ),
        (
            r#"{"method":"bdev_rbd_register_cluster","params":{"name":"c","keyfile":"k"}}"#
                .to_string(),
            "keyfile",
        ),
    ] {
        let e = err(&entries);
        assert!(e.contains(want), "{entries}\n-> {e}\nwanted: {want}");
    }
}
