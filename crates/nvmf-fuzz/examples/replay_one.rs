//! Replays one input file (e.g. a libFuzzer crash) through the harness:
//! `NVMF_FUZZ_TRACE=1 cargo run -p nvmf-fuzz --example replay_one -- FILE`
//! prints every action and every PDU the target sent.
fn main() {
    let path = std::env::args().nth(1).expect("usage: replay_one FILE");
    let bytes = std::fs::read(&path).expect("read input");
    match nvmf_fuzz::run_bytes(&bytes) {
        Some(r) => println!("{r:?}"),
        None => println!("input does not decode"),
    }
}
