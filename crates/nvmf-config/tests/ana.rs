//! Owns the tests of the ANA part of the configuration model: ANA reporting,
//! namespace ANA groups, per-listener ANA states (all groups or one), their
//! errors, and their round trip through `save_config`-shaped JSON.

use nvmf_config::{AnaState, ConfigError, ListenerConfig, TargetConfig};
use serde_json::{json, Value};

const NQN: &str = "nqn.2016-06.io.spdk:ana";

fn listen(port: u16) -> Value {
    json!({"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":port.to_string()})
}

/// Two malloc bdevs, a subsystem (max 4 namespaces, ANA reporting as given),
/// two namespaces, listeners on ports 4420 and 4421, then `extra`.
fn doc(ana_reporting: bool, ns2: Value, extra: &[Value]) -> String {
    let mut nvmf = vec![
        json!({"method":"nvmf_create_transport","params":{"trtype":"TCP"}}),
        json!({"method":"nvmf_create_subsystem","params":{"nqn":NQN,"max_namespaces":4,"ana_reporting":ana_reporting}}),
        json!({"method":"nvmf_subsystem_add_ns","params":{"nqn":NQN,"namespace":{"bdev_name":"Malloc0"}}}),
        json!({"method":"nvmf_subsystem_add_ns","params":{"nqn":NQN,"namespace":ns2}}),
        json!({"method":"nvmf_subsystem_add_listener","params":{"nqn":NQN,"listen_address":listen(4420)}}),
        json!({"method":"nvmf_subsystem_add_listener","params":{"nqn":NQN,"listen_address":listen(4421),"ana_state":"non_optimized"}}),
    ];
    nvmf.extend_from_slice(extra);
    json!({"subsystems":[
        {"subsystem":"bdev","config":[
            {"method":"bdev_malloc_create","params":{"name":"Malloc0","num_blocks":64,"block_size":512}},
            {"method":"bdev_malloc_create","params":{"name":"Malloc1","num_blocks":64,"block_size":512}},
        ]},
        {"subsystem":"nvmf","config":nvmf},
    ]})
    .to_string()
}

fn load(ana: bool, ns2: Value, extra: &[Value]) -> Result<TargetConfig, ConfigError> {
    TargetConfig::from_json_str(&doc(ana, ns2, extra))
}

fn set_state(port: u16, state: &str, grp: Option<u32>) -> Value {
    let mut p = json!({"nqn":NQN,"listen_address":listen(port),"ana_state":state});
    if let Some(g) = grp {
        p["anagrpid"] = json!(g);
    }
    json!({"method":"nvmf_subsystem_listener_set_ana_state","params":p})
}

fn l(port: u16) -> ListenerConfig {
    let c = load(false, json!({"bdev_name":"Malloc1"}), &[]).unwrap();
    c.subsystem(NQN)
        .unwrap()
        .listeners
        .iter()
        .find(|x| x.trsvcid == port.to_string())
        .unwrap()
        .clone()
}

#[test]
fn groups_default_to_the_nsid_and_states_to_optimized() {
    let c = load(true, json!({"bdev_name":"Malloc1","anagrpid":3}), &[]).unwrap();
    let s = c.subsystem(NQN).unwrap();
    assert!(s.ana_reporting);
    assert_eq!(s.namespace(1).unwrap().anagrpid, 1);
    assert_eq!(s.namespace(2).unwrap().anagrpid, 3);
    assert_eq!(s.ana_state(&l(4420), 1), AnaState::Optimized);
    // add_listener's ana_state covers every group of that listener
    for g in 1..=4 {
        assert_eq!(s.ana_state(&l(4421), g), AnaState::NonOptimized);
    }
}

#[test]
fn one_group_or_all_groups() {
    let c = load(
        true,
        json!({"bdev_name":"Malloc1"}),
        &[
            set_state(4420, "inaccessible", Some(2)),
            set_state(4421, "optimized", Some(1)),
        ],
    )
    .unwrap();
    let s = c.subsystem(NQN).unwrap();
    assert_eq!(s.ana_state(&l(4420), 1), AnaState::Optimized);
    assert_eq!(s.ana_state(&l(4420), 2), AnaState::Inaccessible);
    assert_eq!(s.ana_state(&l(4421), 1), AnaState::Optimized);
    assert_eq!(s.ana_state(&l(4421), 2), AnaState::NonOptimized);
    // all groups at once replaces the per-group entries of that listener
    let c = load(
        true,
        json!({"bdev_name":"Malloc1"}),
        &[
            set_state(4420, "inaccessible", Some(2)),
            set_state(4420, "change", None),
        ],
    )
    .unwrap();
    let s = c.subsystem(NQN).unwrap();
    assert_eq!(s.ana_state(&l(4420), 1), AnaState::Change);
    assert_eq!(s.ana_state(&l(4420), 2), AnaState::Change);
    assert_eq!(s.ana_states.len(), 2, "{:?}", s.ana_states);
}

#[test]
fn save_config_round_trips_groups_and_states() {
    let c = load(
        true,
        json!({"bdev_name":"Malloc1","anagrpid":4}),
        &[
            set_state(4420, "inaccessible", Some(4)),
            set_state(4421, "persistent_loss", Some(1)),
        ],
    )
    .unwrap();
    let text = c.to_json_string_pretty();
    assert!(
        text.contains("nvmf_subsystem_listener_set_ana_state"),
        "{text}"
    );
    assert!(text.contains("\"anagrpid\": 4"), "{text}");
    let back = TargetConfig::from_json_str(&text).unwrap();
    assert_eq!(back, c);
}

#[test]
fn set_ns_ana_group_moves_a_namespace() {
    let c = load(
        true,
        json!({"bdev_name":"Malloc1"}),
        &[json!({"method":"nvmf_subsystem_set_ns_ana_group","params":{"nqn":NQN,"nsid":2,"anagrpid":1}})],
    )
    .unwrap();
    assert_eq!(c.subsystem(NQN).unwrap().namespace(2).unwrap().anagrpid, 1);
}

#[track_caller]
fn expect_err(r: Result<TargetConfig, ConfigError>, method: &str, param: &str, problem: &str) {
    let e = r.expect_err("config must be rejected");
    let msg = e.to_string();
    assert_eq!(e.method(), Some(method), "{msg}");
    assert_eq!(e.param(), Some(param), "{msg}");
    assert!(
        msg.contains(problem),
        "{msg:?} does not mention {problem:?}"
    );
}

#[test]
fn bad_groups_states_and_listeners_are_refused() {
    let ns = || json!({"bdev_name":"Malloc1"});
    expect_err(
        load(true, json!({"bdev_name":"Malloc1","anagrpid":5}), &[]),
        "nvmf_subsystem_add_ns",
        "namespace.anagrpid",
        "outside 1..=4",
    );
    expect_err(
        load(true, ns(), &[set_state(4420, "sleepy", None)]),
        "nvmf_subsystem_listener_set_ana_state",
        "ana_state",
        "not an ANA state",
    );
    expect_err(
        load(true, ns(), &[set_state(4420, "optimized", Some(9))]),
        "nvmf_subsystem_listener_set_ana_state",
        "anagrpid",
        "outside 1..=4",
    );
    expect_err(
        load(true, ns(), &[set_state(4999, "optimized", None)]),
        "nvmf_subsystem_listener_set_ana_state",
        "listen_address",
        "no listener",
    );
    expect_err(
        load(false, ns(), &[set_state(4420, "inaccessible", None)]),
        "nvmf_subsystem_listener_set_ana_state",
        "nqn",
        "without ana_reporting",
    );
    expect_err(
        load(
            true,
            ns(),
            &[
                json!({"method":"nvmf_subsystem_set_ns_ana_group","params":{"nqn":NQN,"nsid":3,"anagrpid":1}}),
            ],
        ),
        "nvmf_subsystem_set_ns_ana_group",
        "nsid",
        "no namespace 3",
    );
    expect_err(
        load(
            true,
            ns(),
            &[
                json!({"method":"nvmf_subsystem_set_ns_ana_group","params":{"nqn":NQN,"nsid":2,"anagrpid":0}}),
            ],
        ),
        "nvmf_subsystem_set_ns_ana_group",
        "anagrpid",
        "outside 1..=4",
    );
}

#[test]
fn ana_log_must_fit_one_transfer() {
    let doc = |max_ns: u32| {
        json!({"subsystems":[{"subsystem":"nvmf","config":[
            {"method":"nvmf_create_transport","params":{"trtype":"TCP","max_io_size":65536}},
            {"method":"nvmf_create_subsystem","params":{"nqn":NQN,"max_namespaces":max_ns,"ana_reporting":true}},
        ]}]})
        .to_string()
    };
    // (65536 - 16) / 36 = 1820 namespaces fit, 1821 do not
    TargetConfig::from_json_str(&doc(1820)).unwrap();
    expect_err(
        TargetConfig::from_json_str(&doc(1821)),
        "nvmf_create_subsystem",
        "ana_reporting",
        "max_namespaces <= 1820",
    );
}
