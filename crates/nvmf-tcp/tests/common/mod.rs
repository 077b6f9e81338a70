//! Shared test helpers: the test host codec and the test target config.
#![allow(dead_code)]
pub mod host;

/// A small target: `nqn.2024-01.io.nvmfd:default` (any host, 1 MiB malloc
/// namespace, 512-byte blocks) and `nqn.2024-01.io.nvmfd:restricted` (only
/// `ALLOWED_HOST`), both on 127.0.0.1:`port`.
pub fn config_json(port: u16) -> String {
    let l =
        format!(r#"{{"trtype":"TCP","adrfam":"IPv4","traddr":"127.0.0.1","trsvcid":"{port}"}}"#);
    format!(
        r#"{{"subsystems":[
 {{"subsystem":"bdev","config":[
   {{"method":"bdev_malloc_create","params":{{"name":"Malloc0","block_size":512,"num_blocks":2048}}}},
   {{"method":"bdev_malloc_create","params":{{"name":"Malloc1","block_size":512,"num_blocks":2048}}}}]}},
 {{"subsystem":"nvmf","config":[
   {{"method":"nvmf_create_transport","params":{{"trtype":"TCP","in_capsule_data_size":4096,"max_io_size":131072}}}},
   {{"method":"nvmf_create_subsystem","params":{{"nqn":"{d}","allow_any_host":true,"serial_number":"NVMFDTEST0001"}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{d}","namespace":{{"nsid":1,"bdev_name":"Malloc0"}}}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{d}","listen_address":{l}}}}},
   {{"method":"nvmf_create_subsystem","params":{{"nqn":"{r}","allow_any_host":false}}}},
   {{"method":"nvmf_subsystem_add_host","params":{{"nqn":"{r}","host":"{a}"}}}},
   {{"method":"nvmf_subsystem_add_ns","params":{{"nqn":"{r}","namespace":{{"nsid":1,"bdev_name":"Malloc1"}}}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"{r}","listen_address":{l}}}}},
   {{"method":"nvmf_subsystem_add_listener","params":{{"nqn":"nqn.2014-08.org.nvmexpress.discovery","listen_address":{l}}}}}
 ]}}]}}"#,
        d = host::DEFAULT_NQN,
        r = RESTRICTED_NQN,
        a = ALLOWED_HOST,
    )
}

pub const RESTRICTED_NQN: &str = "nqn.2024-01.io.nvmfd:restricted";
pub const ALLOWED_HOST: &str =
    "nqn.2014-08.org.nvmexpress:uuid:11111111-2222-3333-4444-555555555555";
