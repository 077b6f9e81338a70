//! Writes the hand-made seed inputs (`nvmf_fuzz::seeds::all`,
//! `nvmf_fuzz::seeds::rdma::all`) into `fuzz/seeds/connection/` and
//! `fuzz/seeds/rdma/` (run after changing the input types):
//! `cargo run -p nvmf-fuzz --example write_seeds`.
use std::path::Path;

fn main() {
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/connection");
    std::fs::create_dir_all(&dir).expect("seed directory");
    for (name, bytes) in nvmf_fuzz::seeds::all() {
        std::fs::write(dir.join(name), &bytes).expect("write seed");
        println!("{name}: {} bytes", bytes.len());
    }
    let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("fuzz/seeds/rdma");
    std::fs::create_dir_all(&dir).expect("seed directory");
    for (name, bytes) in nvmf_fuzz::seeds::rdma::all() {
        std::fs::write(dir.join(name), &bytes).expect("write seed");
        println!("rdma/{name}: {} bytes", bytes.len());
    }
}
