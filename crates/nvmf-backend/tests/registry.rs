//! The backend interface is open: a crate other than nvmf-backend
//! implements `Backend` and registers a constructor for a bdev kind, and
//! `create` (what nvmf-core calls for every bdev entry) builds it.

use std::sync::Arc;

use nvmf_backend::{
    create, kind_key, register, registered_kinds, Backend, BdevError, BlockOp, CompletionSink,
    DsmRanges, IoTag, Submitted,
};
use nvmf_config::{BdevConfig, BdevKind};
use nvmf_wire::status::Status;

/// A backend defined outside nvmf-backend: reads fill the buffer with 0x5a.
#[derive(Debug)]
struct Outside {
    name: String,
    blocks: u64,
}

impl Backend for Outside {
    fn name(&self) -> &str {
        &self.name
    }
    fn kind(&self) -> &'static str {
        "outside"
    }
    fn block_size(&self) -> u32 {
        512
    }
    fn num_blocks(&self) -> u64 {
        self.blocks
    }
    fn deallocate_reads_zeroes(&self) -> bool {
        false
    }
    fn submit(&self, op: BlockOp<'_>, _: IoTag, _: &Arc<CompletionSink>) -> Submitted {
        match op {
            BlockOp::Read { buf, .. } => {
                buf.fill(0x5a);
                Submitted::Done(Status::SUCCESS)
            }
            _ => Submitted::Done(Status::SUCCESS),
        }
    }
    fn deallocate(&self, _: DsmRanges<'_>, _: IoTag, _: &Arc<CompletionSink>) -> Submitted {
        Submitted::Done(Status::SUCCESS)
    }
}

fn outside(cfg: &BdevConfig) -> Result<Arc<dyn Backend>, BdevError> {
    if cfg.name == "refused" {
        return Err(BdevError {
            name: cfg.name.clone(),
            reason: "refused by its constructor".into(),
        });
    }
    Ok(Arc::new(Outside {
        name: cfg.name.clone(),
        blocks: cfg.num_blocks,
    }))
}

fn cfg(name: &str, kind: BdevKind) -> BdevConfig {
    BdevConfig {
        name: name.into(),
        kind,
        block_size: 512,
        num_blocks: 8,
        uuid: None,
        file: None,
        rbd: None,
    }
}

#[test]
fn a_constructor_registered_outside_the_crate_is_used() {
    assert_eq!(registered_kinds(), vec!["file", "malloc", "null", "rbd"]);
    let built_in = create(&cfg("n", BdevKind::Null)).unwrap();
    assert_eq!(built_in.kind(), "null");

    // Replace the constructor of one kind by this crate's.
    let old = register(kind_key(BdevKind::Null), outside).expect("null was registered");
    let b = create(&cfg("n", BdevKind::Null)).unwrap();
    assert_eq!((b.kind(), b.name(), b.num_blocks()), ("outside", "n", 8));
    let mut buf = vec![0u8; 512];
    let sink = CompletionSink::new();
    let tag = IoTag {
        cid: 1,
        bytes: 512,
        write: false,
        nsid: 0,
    };
    let op = BlockOp::Read {
        lba: 0,
        buf: &mut buf,
    };
    assert_eq!(b.submit(op, tag, &sink), Submitted::Done(Status::SUCCESS));
    assert!(buf.iter().all(|&x| x == 0x5a));
    // Its errors come back as they are; the geometry is still checked first.
    let e = create(&cfg("refused", BdevKind::Null)).unwrap_err();
    assert_eq!(e.to_string(), "bdev refused: refused by its constructor");
    let mut bad = cfg("n", BdevKind::Null);
    bad.block_size = 100;
    assert!(create(&bad).is_err());

    // Other kinds are untouched; putting the old one back restores it.
    assert_eq!(
        create(&cfg("m", BdevKind::Malloc)).unwrap().kind(),
        "malloc"
    );
    register(kind_key(BdevKind::Null), old);
    assert_eq!(create(&cfg("n", BdevKind::Null)).unwrap().kind(), "null");
}
