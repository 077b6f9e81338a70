//! nvmf-rpc: nvmfd's SPDK-compatible JSON-RPC 2.0 control plane. This file
//! owns the crate layout, the public re-exports and `DEFAULT_RPC_SOCKET`.
//!
//! * [`service::RpcService`]: the methods (SPDK names, parameters, result
//!   shapes and error codes) over the configuration model
//!   [`nvmf_config::TargetConfig`]; state changes go validate-on-a-copy →
//!   [`LiveTarget::apply`] → commit → [`StateFile::write`].
//! * [`serve`]: the server on a Unix stream socket, on its own threads, with
//!   rpc.py's framing (JSON objects back to back, no delimiter needed).
//! * [`LiveTarget`] / [`Change`]: the boundary the daemon implements to make
//!   each change live (phase 2); [`NoLive`] and [`RecordingLive`] for tests.
//! * [`StateFile`]: `--state FILE`, crash-safe save after every change.
//! * [`RpcClient`] and [`cli_main`]: `nvmf rpc`, rpc.py's command line.

pub mod cli;
pub mod client;
pub mod error;
pub mod framing;
pub mod live;
mod params;
pub mod server;
pub mod service;
pub mod state_file;

pub use cli::cli_main;
pub use client::{ClientError, RpcClient};
pub use error::RpcError;
pub use live::{
    Change, GroupRequest, LiveTarget, NamespaceIo, NoLive, RecordingLive, NOT_A_MEMBER,
};
pub use server::{serve, RpcServer};
pub use service::RpcService;
pub use state_file::StateFile;

/// Where the RPC server listens unless told otherwise: SPDK's default, so
/// `scripts/rpc.py` works against nvmfd without `-s`.
pub const DEFAULT_RPC_SOCKET: &str = "/var/tmp/spdk.sock";
