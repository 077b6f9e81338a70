//! nvmf-rpc: SPDK-compatible JSON-RPC 2.0 control plane (server side for `nvmfd`,
//! client side for `nvmf rpc`). Skeleton: being written.

/// Entry point of `nvmf rpc METHOD [ARGS]`; `args` are the words after `rpc`.
/// Returns the process exit code.
pub fn cli_main(args: &[String]) -> i32 {
    let _ = args;
    eprintln!("nvmf rpc: not implemented yet");
    2
}
