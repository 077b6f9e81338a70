//! Per-host namespace visibility in the configuration model: `no_auto_visible`
//! on `nvmf_subsystem_add_ns`, `nvmf_ns_add_host` / `nvmf_ns_remove_host`,
//! and `save_config` writing them back as SPDK does.

use nvmf_config::TargetConfig;
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.spdk:cnode1";
const H1: &str = "nqn.2016-06.io.spdk:host1";
const H2: &str = "nqn.2016-06.io.spdk:host2";

fn base() -> TargetConfig {
    let doc = json!({"subsystems":[
        {"subsystem":"bdev","config":[
            {"method":"bdev_malloc_create","params":{"name":"M0","num_blocks":16,"block_size":512}},
            {"method":"bdev_malloc_create","params":{"name":"M1","num_blocks":16,"block_size":512}}]},
        {"subsystem":"nvmf","config":[
            {"method":"nvmf_create_transport","params":{"trtype":"TCP"}},
            {"method":"nvmf_create_subsystem","params":{"nqn":NQN,"allow_any_host":true}},
            {"method":"nvmf_subsystem_add_ns","params":{"nqn":NQN,"namespace":{"bdev_name":"M0","nsid":1}}},
            {"method":"nvmf_subsystem_add_ns","params":{"nqn":NQN,"namespace":{"bdev_name":"M1","nsid":2,"no_auto_visible":true}}}]}]});
    TargetConfig::from_json_str(&doc.to_string()).unwrap()
}

fn call(cfg: &mut TargetConfig, method: &str, params: Value) -> Result<(), String> {
    cfg.apply_method(method, Some(&params))
        .map_err(|e| e.to_string())
}

fn nvmf_entries(cfg: &TargetConfig) -> Vec<Value> {
    let doc = cfg.to_json_value();
    doc["subsystems"]
        .as_array()
        .unwrap()
        .iter()
        .find(|s| s["subsystem"] == "nvmf")
        .unwrap()["config"]
        .as_array()
        .unwrap()
        .clone()
}

#[test]
fn no_auto_visible_and_ns_add_host_load_and_write_back_as_spdk() {
    let mut cfg = base();
    let s = &cfg.subsystems[0];
    assert!(!s.ns_no_auto_visible(1) && s.ns_no_auto_visible(2));
    assert!(s.ns_visible_to(1, H1) && !s.ns_visible_to(2, H1));

    call(
        &mut cfg,
        "nvmf_ns_add_host",
        json!({"nqn":NQN,"nsid":2,"host":H2}),
    )
    .unwrap();
    call(
        &mut cfg,
        "nvmf_ns_add_host",
        json!({"nqn":NQN,"nsid":2,"host":H1}),
    )
    .unwrap();
    // Again: nothing changes (SPDK answers true too).
    call(
        &mut cfg,
        "nvmf_ns_add_host",
        json!({"nqn":NQN,"nsid":2,"host":H1,"tgt_name":"x"}),
    )
    .unwrap();
    assert_eq!(cfg.subsystems[0].ns_visibility[&2], vec![H2, H1]);
    assert!(cfg.subsystems[0].ns_visible_to(2, H1));

    // save_config: the namespace with no_auto_visible, then one
    // nvmf_ns_add_host per host, right after it; the other namespace as before.
    let entries = nvmf_entries(&cfg);
    let at = entries
        .iter()
        .position(|e| {
            e["method"] == "nvmf_subsystem_add_ns" && e["params"]["namespace"]["nsid"] == 2
        })
        .unwrap();
    assert_eq!(entries[at]["params"]["namespace"]["no_auto_visible"], true);
    assert_eq!(
        entries[at + 1],
        json!({"method":"nvmf_ns_add_host","params":{"nqn":NQN,"nsid":2,"host":H2}})
    );
    assert_eq!(entries[at + 2]["params"]["host"], H1);
    let ns1 = entries
        .iter()
        .find(|e| e["method"] == "nvmf_subsystem_add_ns" && e["params"]["namespace"]["nsid"] == 1)
        .unwrap();
    assert!(ns1["params"]["namespace"].get("no_auto_visible").is_none());
    assert_eq!(
        entries
            .iter()
            .filter(|e| e["method"] == "nvmf_ns_add_host")
            .count(),
        2
    );

    // Round trip.
    let again = TargetConfig::from_json_str(&cfg.to_json_value().to_string()).unwrap();
    assert_eq!(
        again.subsystems[0].ns_visibility,
        cfg.subsystems[0].ns_visibility
    );
    let mut want = cfg.clone();
    want.ignored_params.clear(); // the tgt_name given above
    assert_eq!(again, want);

    // Remove: the namespace stays no_auto_visible with nobody left.
    call(
        &mut cfg,
        "nvmf_ns_remove_host",
        json!({"nqn":NQN,"nsid":2,"host":H2}),
    )
    .unwrap();
    call(
        &mut cfg,
        "nvmf_ns_remove_host",
        json!({"nqn":NQN,"nsid":2,"host":H2}),
    )
    .unwrap();
    call(
        &mut cfg,
        "nvmf_ns_remove_host",
        json!({"nqn":NQN,"nsid":2,"host":H1}),
    )
    .unwrap();
    assert!(cfg.subsystems[0].ns_no_auto_visible(2));
    assert!(cfg.subsystems[0].ns_visibility[&2].is_empty());
    let again = TargetConfig::from_json_str(&cfg.to_json_value().to_string()).unwrap();
    assert!(again.subsystems[0].ns_no_auto_visible(2));
    assert!(!again.subsystems[0].ns_no_auto_visible(1));
}

#[test]
fn ns_add_host_errors_name_what_is_wrong() {
    let mut cfg = base();
    let before = cfg.clone();
    for (method, params, want) in [
        (
            "nvmf_ns_add_host",
            json!({"nqn":"nqn.2016-06.io.spdk:nope","nsid":2,"host":H1}),
            "no subsystem \"nqn.2016-06.io.spdk:nope\"",
        ),
        (
            "nvmf_ns_add_host",
            json!({"nqn":NQN,"nsid":3,"host":H1}),
            "has no namespace 3",
        ),
        (
            "nvmf_ns_remove_host",
            json!({"nqn":NQN,"nsid":0,"host":H1}),
            "NSID 0 is outside 1..=",
        ),
        (
            "nvmf_ns_add_host",
            json!({"nqn":NQN,"nsid":1,"host":H1}),
            "visible to every host: only a namespace added with no_auto_visible",
        ),
        (
            "nvmf_ns_remove_host",
            json!({"nqn":NQN,"nsid":1,"host":H1}),
            "visible to every host",
        ),
        (
            "nvmf_ns_add_host",
            json!({"nqn":NQN,"nsid":2,"host":""}),
            "parameter \"host\"",
        ),
        (
            "nvmf_ns_add_host",
            json!({"nqn":NQN,"nsid":2}),
            "parameter \"host\"",
        ),
        (
            "nvmf_ns_add_host",
            json!({"nqn":NQN,"nsid":2,"host":H1,"bogus":1}),
            "bogus",
        ),
    ] {
        let e = call(&mut cfg, method, params.clone()).expect_err(&params.to_string());
        assert!(e.starts_with(method), "{e}");
        assert!(e.contains(want), "{params}: {e:?} lacks {want:?}");
    }
    assert_eq!(cfg, before, "a refused call changes nothing");
}
