//! Example / manual-test server: serves the nvmf-rpc methods on a Unix
//! socket with no target behind it (`NoLive`), optionally persisting to a
//! state file. Lets SPDK's own scripts/rpc.py (or `nvmf rpc`) be tried
//! against nvmfd's control plane without starting the daemon.
//!
//! usage: cargo run -p nvmf-rpc --example rpc_server -- [SOCKET] [--state FILE]

use std::sync::Arc;

use nvmf_config::TargetConfig;
use nvmf_rpc::{serve, NoLive, RpcService, StateFile, DEFAULT_RPC_SOCKET};

fn main() {
    let args: Vec<String> = std::env::args().skip(1).collect();
    let mut sock = DEFAULT_RPC_SOCKET.to_string();
    let mut state = None;
    let mut i = 0;
    while i < args.len() {
        if args[i] == "--state" {
            i += 1;
            state = args.get(i).map(StateFile::new);
        } else {
            sock = args[i].clone();
        }
        i += 1;
    }
    let config = match &state {
        Some(sf) => match sf.load() {
            Ok(c) => c.unwrap_or_default(),
            Err(e) => {
                eprintln!("rpc_server: {e}");
                std::process::exit(1);
            }
        },
        None => TargetConfig::default(),
    };
    let service = Arc::new(RpcService::new(config, Arc::new(NoLive), state));
    let _server = match serve(&sock, service) {
        Ok(s) => s,
        Err(e) => {
            eprintln!("rpc_server: {e}");
            std::process::exit(1);
        }
    };
    eprintln!("rpc_server: serving on {sock}");
    loop {
        std::thread::park();
    }
}
