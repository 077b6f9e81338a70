//! `nvmf gw`: a gateway group as one of its members sees it
//! (docs/GATEWAY-GROUPS.md).
//!
//! Owns turning `nvmf_gateway_group_status` answers into the operator's
//! table (members with their lease and connected hosts, ANA groups with
//! home, owner, epoch, this member's state and a hand-over waiting for
//! hosts, fencings, counters) and waiting for a requested
//! move (`nvmf_gateway_group_move`) to be carried out.

use std::fmt::Write as _;

use serde_json::Value;

/// The status table of one member's view.
pub fn format_status(v: &Value) -> String {
    let s = |x: &Value| -> String {
        match x {
            Value::String(s) => s.clone(),
            Value::Null => "-".into(),
            other => other.to_string(),
        }
    };
    let mut out = String::new();
    let _ = writeln!(
        out,
        "group {}  seen by member {} ({})  state {}  epoch {}  lease {} ms, last renewed {} ms ago",
        s(&v["group"]),
        s(&v["member"]),
        s(&v["address"]),
        s(&v["state"]),
        s(&v["epoch"]),
        s(&v["lease_ms"]),
        s(&v["lease_age_ms"]),
    );
    let _ = writeln!(
        out,
        "\nMEMBER        LEASE   RENEWED    OWNS        SERVES      HOSTS  LISTENERS             ADDRESS"
    );
    for m in v["members"].as_array().into_iter().flatten() {
        let renewed = m["renewed_ms_ago"]
            .as_u64()
            .map(|ms| format!("{:.1} s ago", ms as f64 / 1000.0))
            .unwrap_or_else(|| "-".into());
        let listeners: Vec<String> = m["listeners"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|x| x.as_str().map(str::to_string))
            .collect();
        let listeners = if listeners.is_empty() {
            "-".to_string()
        } else {
            listeners.join(",")
        };
        let _ = writeln!(
            out,
            "{:<13} {:<7} {:<10} {:<11} {:<11} {:<6} {:<21} {}",
            s(&m["id"]),
            s(&m["lease"]),
            renewed,
            list(&m["owns"]),
            list(&m["serves"]),
            m["hosts"]
                .as_array()
                .map(|h| h.len().to_string())
                .unwrap_or_else(|| "-".into()),
            listeners,
            s(&m["address"]),
        );
    }
    let _ = writeln!(
        out,
        "\nANAGRP  HOME          OWNER         EPOCH  OWNER ALIVE  HERE"
    );
    for g in v["ana_groups"].as_array().into_iter().flatten() {
        let _ = writeln!(
            out,
            "{:<7} {:<13} {:<13} {:<6} {:<12} {}",
            s(&g["anagrpid"]),
            s(&g["home"]),
            s(&g["owner"]),
            s(&g["owner_epoch"]),
            if g["owner_alive"].as_bool() == Some(true) {
                "yes"
            } else {
                "no"
            },
            s(&g["here"]),
        );
        let w = &g["hand_over_waits"];
        if w.is_object() {
            let left = w["wait_left_ms"]
                .as_u64()
                .map(|ms| format!(", at most {:.1} s more", ms as f64 / 1000.0))
                .unwrap_or_default();
            let _ = writeln!(
                out,
                "        hand-over to {} waits for these hosts to connect there{left}: {}",
                s(&w["to"]),
                w["hosts_not_there"]
                    .as_array()
                    .into_iter()
                    .flatten()
                    .filter_map(|h| h.as_str())
                    .collect::<Vec<_>>()
                    .join(", ")
            );
        }
    }
    let fenced = v["fenced"].as_array().cloned().unwrap_or_default();
    if !fenced.is_empty() {
        let _ = writeln!(out, "\nFENCED (newest last)");
        for f in &fenced {
            let _ = writeln!(
                out,
                "  {} {} by {} at {}",
                s(&f["member"]),
                s(&f["address"]),
                s(&f["by"]),
                s(&f["at"])
            );
        }
    }
    if let Some(c) = v["counters"].as_object() {
        let line: Vec<String> = c.iter().map(|(k, x)| format!("{k}={x}")).collect();
        let _ = writeln!(out, "\ncounters: {}", line.join(" "));
    }
    out
}

fn list(v: &Value) -> String {
    let xs: Vec<String> = v
        .as_array()
        .into_iter()
        .flatten()
        .map(|x| x.to_string())
        .collect();
    if xs.is_empty() {
        "-".into()
    } else {
        xs.join(",")
    }
}

/// The owner of ANA group `g` in a status answer, and whether it is alive.
pub fn owner_of(v: &Value, g: u32) -> Option<(String, bool)> {
    v["ana_groups"]
        .as_array()?
        .iter()
        .find(|x| x["anagrpid"].as_u64() == Some(u64::from(g)))
        .and_then(|x| {
            Some((
                x["owner"].as_str()?.to_string(),
                x["owner_alive"].as_bool().unwrap_or(false),
            ))
        })
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn status_table_names_owners_and_fencings() {
        let v = json!({
            "group": "g1", "member": "a", "address": "v2:1/2", "state": "serving",
            "epoch": 7, "lease_ms": 3000, "lease_age_ms": 120,
            "members": [{"id": "a", "lease": "held", "owns": [1, 2], "serves": [1, 2], "address": "v2:1/2",
                         "renewed_ms_ago": 1500, "listeners": ["127.0.0.1:4420"], "hosts": ["nqn.h1"]}],
            "ana_groups": [{"anagrpid": 1, "home": "a", "owner": "a", "owner_epoch": 7, "owner_alive": true, "here": "optimized"},
                           {"anagrpid": 2, "home": "b", "owner": "a", "owner_epoch": 6, "owner_alive": true, "here": "optimized",
                            "hand_over_waits": {"to": "b", "hosts_not_there": ["nqn.h1"], "wait_left_ms": 12500}}],
            "fenced": [{"member": "b", "address": "v2:9/9", "by": "a", "at": 5}],
            "counters": {"takeovers": 1},
        });
        let t = format_status(&v);
        assert!(t.contains("state serving  epoch 7"), "{t}");
        assert!(
            t.contains(
                "a             held    1.5 s ago  1,2         1,2         1      127.0.0.1:4420"
            ),
            "{t}"
        );
        assert!(
            t.contains("1       a             a             7      yes          optimized"),
            "{t}"
        );
        assert!(t.contains("b v2:9/9 by a at 5"), "{t}");
        assert!(
            t.contains("hand-over to b waits for these hosts to connect there, at most 12.5 s more: nqn.h1"),
            "{t}"
        );
        assert_eq!(owner_of(&v, 1), Some(("a".into(), true)));
        assert_eq!(owner_of(&v, 3), None);
    }
}
