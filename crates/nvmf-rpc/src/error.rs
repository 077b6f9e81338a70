//! Owns `RpcError`: a JSON-RPC error object (code + message), the standard
//! JSON-RPC 2.0 codes, the SPDK `-errno` codes nvmfd uses, and the mapping
//! from `nvmf_config::ConfigError` to the code SPDK would send for the same
//! mistake.

use serde_json::{json, Value};

/// Invalid JSON was received (the connection is closed after this error).
pub const PARSE_ERROR: i32 = -32700;
/// The JSON is not a valid request object.
pub const INVALID_REQUEST: i32 = -32600;
/// No such method.
pub const METHOD_NOT_FOUND: i32 = -32601;
/// Missing, mistyped, unknown or invalid parameter.
pub const INVALID_PARAMS: i32 = -32602;
/// The request was valid but could not be carried out.
pub const INTERNAL_ERROR: i32 = -32603;
/// SPDK's "invalid state" code.
pub const INVALID_STATE: i32 = -1;
/// `-EBUSY`: the object is in use (nvmfd: deleting a bdev a namespace uses).
pub const EBUSY: i32 = -16;
/// `-EEXIST`: an object with that name already exists (SPDK: bdev create).
pub const EEXIST: i32 = -17;
/// `-ENODEV`: no such bdev (SPDK: bdev delete / bdev_get_bdevs).
pub const ENODEV: i32 = -19;
/// `-EINVAL`: invalid argument (SPDK: bdev create with a bad geometry).
pub const EINVAL: i32 = -22;

/// A JSON-RPC error: `{"code": .., "message": ..}`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RpcError {
    pub code: i32,
    pub message: String,
}

impl RpcError {
    pub fn new(code: i32, message: impl Into<String>) -> RpcError {
        RpcError {
            code,
            message: message.into(),
        }
    }

    pub fn invalid_params(message: impl Into<String>) -> RpcError {
        RpcError::new(INVALID_PARAMS, message)
    }

    pub fn internal(message: impl Into<String>) -> RpcError {
        RpcError::new(INTERNAL_ERROR, message)
    }

    /// The `error` member of a response.
    pub fn to_json(&self) -> Value {
        json!({ "code": self.code, "message": self.message })
    }

    /// Maps a model validation error of `method` to SPDK's code for it:
    /// a duplicate bdev name is `-EEXIST`, a bad bdev geometry `-EINVAL`, a
    /// second transport of a type or a duplicate subsystem NQN is an internal
    /// error (SPDK cannot create it), anything else is "invalid parameters".
    pub fn from_config(method: &str, e: &nvmf_config::ConfigError) -> RpcError {
        let msg = e.to_string();
        let param = e.param().unwrap_or("");
        let bdev_create = matches!(
            method,
            "bdev_malloc_create" | "bdev_null_create" | "bdev_rbd_create"
        );
        let code = if bdev_create && param == "name" && msg.contains("already exists") {
            EEXIST
        } else if bdev_create && matches!(param, "block_size" | "num_blocks") {
            EINVAL
        } else if (method == "nvmf_create_transport" && param == "trtype"
            || method == "nvmf_create_subsystem" && param == "nqn")
            && msg.contains("already exists")
        {
            INTERNAL_ERROR
        } else {
            INVALID_PARAMS
        };
        RpcError::new(code, msg)
    }
}

impl std::fmt::Display for RpcError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{} (code {})", self.message, self.code)
    }
}

impl std::error::Error for RpcError {}
