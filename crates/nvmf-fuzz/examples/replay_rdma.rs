//! Replays one input file (e.g. a libFuzzer crash) through the NVMe/RDMA
//! queue harness: `NVMF_FUZZ_TRACE=1 cargo run -p nvmf-fuzz --example
//! replay_rdma -- FILE` prints every action, work request and response.
fn main() {
    let path = std::env::args().nth(1).expect("usage: replay_rdma FILE");
    let bytes = std::fs::read(&path).expect("read input");
    match nvmf_fuzz::rdma::run_rdma_bytes(&bytes) {
        Some(r) => println!("{r:?}"),
        None => println!("input does not decode"),
    }
}
