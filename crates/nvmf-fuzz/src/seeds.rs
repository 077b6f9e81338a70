//! Hand-made seed inputs: a tiny encoder that writes bytes the way
//! `arbitrary` (1.x) reads them back into an [`crate::Input`] (integers
//! little-endian, `bool` = low bit of a byte, enum variant k of n = a `u32`
//! x with x·n >> 32 = k, fields in declaration order), and a few meaningful
//! host sessions written with it. `examples/write_seeds.rs` stores them in
//! `fuzz/seeds/connection/`; the replay test checks each still reaches its
//! scenario, so a change to the input types that breaks them is noticed.
//!
//! Variant indices and counts below mirror `input.rs` (and the opcode
//! tables in `harness.rs`); keep them in step.

/// Bytes in `arbitrary`'s decoding order.
#[derive(Default)]
pub struct Enc(pub Vec<u8>);

impl Enc {
    /// Enum variant `k` of `n`.
    pub fn tag(&mut self, k: u32, n: u32) -> &mut Self {
        let x = ((u64::from(k) << 32).div_ceil(u64::from(n))) as u32;
        self.u32(x)
    }
    pub fn bool(&mut self, b: bool) -> &mut Self {
        self.0.push(u8::from(b));
        self
    }
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.0.push(v);
        self
    }
    pub fn u16(&mut self, v: u16) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.0.extend_from_slice(&v.to_le_bytes());
        self
    }

    // ---- input.rs types (variant index, count) ----

    /// `IcSpec` with valid PFV/HPDA.
    pub fn ic(&mut self, hdgst: bool, ddgst: bool) -> &mut Self {
        self.bool(hdgst).bool(ddgst);
        self.tag(0, 4); // Small16::Zero
        self.tag(0, 4); // Small8::Zero
        self.u32(0)
    }

    /// A valid `ConnectSpec` to `subnqn` (`SubNqn` variant index).
    pub fn connect_spec(&mut self, subnqn: u32) -> &mut Self {
        self.tag(0, 5); // SqSize::Typical
        self.tag(0, 5); // Kato::Default
        self.tag(0, 4); // Cattr::None
        self.tag(subnqn, 7);
        self.tag(0, 5); // HostNqn::Default
        self.tag(0, 4); // cntlid Pick16::Auto
        self.tag(0, 4); // qid Pick16::Auto
        self.tag(0, 4); // recfmt Small16::Zero
        self.tag(0, 6) // ConnectData::InCapsule
    }

    /// `Op::Open` (0 of 15) with `Setup::Admin` (enabled) or `Setup::Io`.
    pub fn open(&mut self, conn: u8, io: bool, digests: bool, chunk: Option<u16>) -> &mut Self {
        self.tag(0, 15).u8(conn);
        if io {
            self.tag(3, 4).ic(digests, digests).connect_spec(0);
        } else {
            self.tag(2, 4)
                .ic(digests, digests)
                .connect_spec(0)
                .bool(true);
        }
        match chunk {
            None => self.tag(0, 3),
            Some(n) => self.tag(2, 3).u16(n),
        }
    }

    /// `Op::Open` of an admin queue to the discovery subsystem.
    pub fn open_discovery(&mut self, conn: u8) -> &mut Self {
        self.tag(0, 15).u8(conn);
        self.tag(2, 4).ic(false, false).connect_spec(3).bool(true);
        self.tag(0, 3)
    }

    /// A `CmdSpec`: opcode table index `op`, nsid 1 (or 2 for `null`),
    /// LBA range, selector, default SGL and data.
    #[allow(clippy::too_many_arguments)]
    pub fn cmd(
        &mut self,
        op: u8,
        null: bool,
        slba: u16,
        nlb: u8,
        sel: u8,
        answer: bool,
    ) -> &mut Self {
        self.u8(op);
        self.tag(0, 5); // Cid::Next
        self.tag(if null { 2 } else { 0 }, 6); // Nsid
        self.tag(0, 3).u16(slba); // Lba::Low
        self.u8(nlb).u8(sel);
        for _ in 0..6 {
            self.u32(0);
        }
        self.tag(0, 4); // flags Small8::Zero
        self.tag(0, 6); // Sgl::Auto
        self.tag(0, 5); // Data::Auto
        self.bool(answer)
    }

    /// `Split::Whole` or `Split::Hold(n)`.
    pub fn split(&mut self, hold: Option<u16>) -> &mut Self {
        match hold {
            None => self.tag(0, 5),
            Some(n) => self.tag(4, 5).u16(n),
        }
    }

    /// `Mangle::None`.
    pub fn no_mangle(&mut self) -> &mut Self {
        self.tag(0, 8)
    }

    /// `Op::Admin` (3) with a command.
    #[allow(clippy::too_many_arguments)]
    pub fn admin(&mut self, conn: u8, op: u8, sel: u8, nlb: u8) -> &mut Self {
        self.tag(3, 15).u8(conn);
        self.cmd(op, false, 0, nlb, sel, false);
        self.split(None).no_mangle()
    }

    /// `Op::Io` (4) read/write/... on nsid 1 (or 2).
    #[allow(clippy::too_many_arguments)]
    pub fn io(
        &mut self,
        conn: u8,
        op: u8,
        null: bool,
        slba: u16,
        nlb: u8,
        answer: bool,
        hold: Option<u16>,
    ) -> &mut Self {
        self.tag(4, 15).u8(conn);
        self.cmd(op, null, slba, nlb, 0, answer);
        self.split(hold).no_mangle()
    }

    /// `Op::Io` (4) on nsid 1 with selector `sel`, in-capsule.
    pub fn io_sel(&mut self, conn: u8, op: u8, sel: u8, nlb: u8) -> &mut Self {
        self.tag(4, 15).u8(conn);
        self.cmd(op, false, 0, nlb, sel, false);
        self.split(None).no_mangle()
    }

    /// `Op::H2c` (7): answer R2T `pick` with `pieces` PDUs (0: all) of
    /// `piece` bytes (0: MAXH2CDATA).
    pub fn h2c(&mut self, conn: u8, pick: u8, pieces: u8, piece: u16) -> &mut Self {
        self.tag(7, 15).u8(conn).u8(pick).u8(pieces);
        if piece == 0 {
            self.tag(0, 3);
        } else {
            self.tag(2, 3).u16(piece);
        }
        self.tag(0, 11); // H2cFault::None
        self.split(None).no_mangle()
    }

    /// `Op::TermReq` (9).
    pub fn term_req(&mut self, conn: u8) -> &mut Self {
        self.tag(9, 15).u8(conn).u16(1).u32(0).u8(8)
    }

    /// `Op::Flush` (10).
    pub fn flush(&mut self, conn: u8) -> &mut Self {
        self.tag(10, 15).u8(conn)
    }

    /// `Op::SetReading` (12).
    pub fn reading(&mut self, conn: u8, on: bool) -> &mut Self {
        self.tag(12, 15).u8(conn).bool(on)
    }

    /// `Op::Tick` (13): `Tick::Sec(n)` or `Tick::PastKato`.
    pub fn tick(&mut self, secs: Option<u8>) -> &mut Self {
        self.tag(13, 15);
        match secs {
            Some(n) => self.tag(1, 3).u8(n),
            None => self.tag(2, 3),
        }
    }

    /// `Op::Drop` (14).
    pub fn drop_conn(&mut self, conn: u8) -> &mut Self {
        self.tag(14, 15).u8(conn)
    }
}

/// Opcode table indices (`ADMIN_KINDS`, `IO_KINDS` in harness.rs).
pub mod op {
    pub const ADMIN_IDENTIFY: u8 = 0;
    pub const ADMIN_LOG: u8 = 3;
    pub const ADMIN_GET_FEATURES: u8 = 5;
    pub const ADMIN_KEEP_ALIVE: u8 = 7;
    pub const ADMIN_AER: u8 = 8;
    pub const ADMIN_ABORT: u8 = 10;
    pub const IO_READ: u8 = 0;
    pub const IO_WRITE: u8 = 4;
    pub const IO_FLUSH: u8 = 8;
    pub const IO_WRITE_ZEROES: u8 = 9;
    pub const IO_DSM: u8 = 10;
    /// Reservation commands; the selector picks Register (0), Acquire (2),
    /// Release (4) or Report (5).
    pub const IO_RESERVATION: u8 = 15;
    /// Compare (selector bit 0 clear) or Verify; selector 0x80 | FUSE << 1
    /// sets the FUSE bits.
    pub const IO_COMPARE_VERIFY: u8 = 16;
}

/// The hand-made seeds: (file name, bytes).
pub fn all() -> Vec<(&'static str, Vec<u8>)> {
    use op::*;
    let mut v = Vec::new();
    let new = || {
        let mut e = Enc::default();
        e.bool(false); // Input::c2h_success
        e
    };

    // Admin queue bring-up, Identify, logs, features, keep-alive.
    let mut e = new();
    e.admin(0, ADMIN_IDENTIFY, 1, 0)
        .admin(0, ADMIN_IDENTIFY, 0, 0)
        .admin(0, ADMIN_IDENTIFY, 2, 0)
        .admin(0, ADMIN_LOG, 1, 0)
        .admin(0, ADMIN_GET_FEATURES, 4, 0)
        .admin(0, ADMIN_KEEP_ALIVE, 0, 0);
    v.push(("hand-admin", e.0));

    // I/O queue: in-capsule write, read back, flush, write zeroes, deallocate.
    let mut e = new();
    e.io(1, IO_WRITE, false, 8, 3, false, None)
        .io(1, IO_READ, false, 8, 3, false, None)
        .io(1, IO_FLUSH, false, 0, 0, false, None)
        .io(1, IO_WRITE_ZEROES, false, 16, 7, false, None)
        .io(1, IO_DSM, false, 16, 7, false, None);
    v.push(("hand-io-incapsule", e.0));

    // Reservations: register (key 1), acquire Write Exclusive, a write by
    // the holder, Report (C2HData), release.
    let mut e = new();
    e.io_sel(1, IO_RESERVATION, 0, 0)
        .io_sel(1, IO_RESERVATION, 2, 0)
        .io(1, IO_WRITE, false, 8, 0, false, None)
        .io_sel(1, IO_RESERVATION, 5, 0)
        .io_sel(1, IO_RESERVATION, 4, 0)
        .io(1, IO_READ, false, 8, 0, false, None);
    v.push(("hand-reservation", e.0));

    // Fused Compare and Write: a write, then Compare (FUSE first) + Write
    // (FUSE second) that miscompare (Compare Failure, Failed Fused), a
    // lone second half (Missing Fused), and a read back of the unchanged
    // block.
    let mut e = new();
    e.io(1, IO_WRITE, false, 0, 0, false, None)
        .io_sel(1, IO_COMPARE_VERIFY, 0x82, 0)
        .io_sel(1, IO_WRITE, 0x0c, 0)
        .io_sel(1, IO_WRITE, 0x0c, 0)
        .io(1, IO_READ, false, 0, 0, false, None);
    v.push(("hand-caw", e.0));

    // R2T writes (whole, then in 1000-byte pieces), reads via C2HData, on
    // both namespaces.
    let mut e = new();
    e.io(1, IO_WRITE, false, 64, 63, true, None)
        .io(1, IO_READ, false, 64, 63, false, None)
        .io(1, IO_WRITE, true, 4, 3, false, None)
        .h2c(1, 0, 0, 1000)
        .io(1, IO_READ, true, 4, 3, false, None);
    v.push(("hand-r2t", e.0));

    // Header and data digests on both queues; c2h_success with a read.
    let mut e = Enc::default();
    e.bool(true);
    e.open(0, false, true, None)
        .open(1, true, true, None)
        .io(1, IO_WRITE, false, 0, 127, true, None)
        .io(1, IO_READ, false, 0, 127, false, None)
        .io(1, IO_WRITE, false, 0, 3, false, None);
    v.push(("hand-digests", e.0));

    // 7-byte socket reads, PDUs held back mid-way, a 128 KiB H2CData
    // placed directly into the slot buffer.
    let mut e = new();
    e.open(0, false, false, None)
        .open(1, true, false, Some(7))
        .io(1, IO_WRITE, false, 0, 255, true, None)
        .io(1, IO_WRITE, false, 256, 3, false, Some(30))
        .flush(1)
        .io(1, IO_READ, false, 0, 255, false, None);
    v.push(("hand-partial-direct", e.0));

    // AERs outstanding, keep-alive timeout, reconnect.
    let mut e = new();
    e.admin(0, ADMIN_AER, 0, 0)
        .admin(0, ADMIN_AER, 0, 0)
        .io(1, IO_READ, false, 0, 0, false, None)
        .tick(Some(5))
        .tick(None)
        .admin(0, ADMIN_IDENTIFY, 1, 0);
    v.push(("hand-aer-kato", e.0));

    // A host that stops reading with reads queued, then drops the admin
    // queue while commands are outstanding.
    let mut e = new();
    e.io(1, IO_READ, false, 0, 0, false, None).reading(1, false);
    for i in 0..8u16 {
        e.io(1, IO_READ, false, i * 256, 255, false, None);
    }
    e.io(2, IO_WRITE, false, 0, 127, false, None)
        .admin(0, ADMIN_ABORT, 0, 0)
        .drop_conn(0)
        .tick(Some(1))
        .reading(1, true);
    v.push(("hand-stalled-reader", e.0));

    // Discovery controller: Identify and the discovery log page.
    let mut e = new();
    e.open_discovery(0)
        .admin(0, ADMIN_IDENTIFY, 1, 0)
        .admin(0, ADMIN_LOG, 6, 7);
    v.push(("hand-discovery", e.0));

    // ANA: the ANA log page, and I/O to a non-optimized group (namespace 2).
    let mut e = new();
    e.admin(0, ADMIN_LOG, 5, 1)
        .admin(0, ADMIN_IDENTIFY, 0, 0)
        .io(2, IO_READ, false, 0, 0, false, None);
    v.push(("hand-ana", e.0));

    // H2CTermReq in the middle of an R2T transfer.
    let mut e = new();
    e.io(1, IO_WRITE, false, 0, 63, false, None)
        .h2c(1, 0, 1, 4096)
        .term_req(1)
        .io(2, IO_READ, false, 0, 7, false, None);
    v.push(("hand-termreq", e.0));
    v
}

/// Hand-made inputs of the NVMe/RDMA queue fuzzer (`crate::rdma`): the
/// same encoder over `RdmaInput`'s types. Variant indices and counts
/// mirror `rdma.rs` (`ROp`: 14 variants, `KINDS` for command indices).
pub mod rdma {
    use super::Enc;

    /// `KINDS` indices in rdma.rs.
    pub const READ: u8 = 0;
    pub const WRITE: u8 = 3;
    pub const FLUSH: u8 = 6;
    pub const WRITE_ZEROES: u8 = 7;
    pub const IDENTIFY: u8 = 8;
    pub const KEEP_ALIVE: u8 = 10;
    pub const AER: u8 = 11;
    pub const PROP_SET: u8 = 13;
    /// Compare, FUSE first (selector below 0x80).
    pub const COMPARE: u8 = 16;

    const OPS: u32 = 14;

    /// An encoder for one `RdmaInput`.
    pub struct R(pub Enc);

    impl R {
        /// `srq`: a shared receive queue of `n % 16 + 1` buffers.
        pub fn new(srq: Option<u8>) -> R {
            let mut e = Enc::default();
            match srq {
                None => e.bool(false),
                Some(n) => e.bool(true).u8(n),
            };
            R(e)
        }

        /// `ROp::Accept` with a good request: HSQSIZE 31 or `hsqsize`;
        /// the host's initiator depth `ird` (None: 16).
        pub fn accept(&mut self, q: u8, hsqsize: Option<u8>, ird: Option<u8>) -> &mut Self {
            let e = &mut self.0;
            e.tag(0, OPS).u8(q);
            e.tag(0, 4); // CmSpec::Good
            e.tag(0, 4); // qid Pick16::Auto
            match hsqsize {
                None => e.tag(0, 4),
                Some(n) => e.tag(2, 4).u8(n),
            };
            e.tag(0, 4); // hrqsize Hsq::Auto
            e.tag(0, 4); // cntlid Pick16::Auto
            e.u8(0); // recfmt
            match ird {
                None => e.tag(0, 3),
                Some(n) => e.tag(2, 3).u8(n),
            };
            self
        }

        /// `ROp::Connect`: SQSIZE as the connect request (None) or `sqsize`;
        /// data in the capsule or behind a keyed SGL (RDMA READ).
        pub fn connect(&mut self, q: u8, sqsize: Option<u16>, keyed: bool) -> &mut Self {
            let e = &mut self.0;
            e.tag(1, OPS).u8(q);
            e.tag(0, 4); // qid Pick16::Auto
            match sqsize {
                None => e.tag(0, 5),
                Some(n) => e.tag(4, 5).u16(n),
            };
            e.tag(0, 4); // cntlid Pick16::Auto
            e.tag(0, 7); // SubNqn::Nvm
            e.tag(if keyed { 2 } else { 0 }, 7); // FData
            e.u16(0); // kato
            self
        }

        /// `ROp::Cmd`: `KINDS[op]` on nsid 1, `Sgl::Auto`, data as it says.
        pub fn cmd(&mut self, q: u8, op: u8, slba: u16, nlb: u8, sel: u8) -> &mut Self {
            let e = &mut self.0;
            e.tag(2, OPS).u8(q);
            e.u8(op);
            e.tag(0, 5); // Cid::Next
            e.tag(0, 6); // Nsid::Malloc
            e.tag(0, 3).u16(slba); // Lba::Low
            e.u8(nlb).u8(sel);
            e.u32(0).u32(0);
            e.tag(0, 8); // RSgl::Auto
            e.tag(0, 5); // Data::Auto
            self
        }

        /// `ROp::Hold`.
        pub fn hold(&mut self, q: u8, on: bool) -> &mut Self {
            self.0.tag(6, OPS).u8(q).bool(on);
            self
        }

        /// `ROp::Complete`: work request `pick` (modulo those in flight).
        pub fn complete(&mut self, q: u8, pick: u8, ok: bool) -> &mut Self {
            self.0.tag(7, OPS).u8(q).u8(pick).bool(ok);
            self
        }

        /// `ROp::Run`.
        pub fn run(&mut self, q: u8) -> &mut Self {
            self.0.tag(9, OPS).u8(q);
            self
        }

        /// `ROp::Flush`.
        pub fn flush(&mut self, q: u8) -> &mut Self {
            self.0.tag(10, OPS).u8(q);
            self
        }

        /// `ROp::Bogus` with `BogusId::Stale(i)`.
        pub fn stale(&mut self, q: u8, i: u8, ok: bool) -> &mut Self {
            self.0.tag(11, OPS).u8(q).tag(0, 3).u8(i).bool(ok);
            self
        }

        /// `ROp::Tick`: `RTick::Idle` (11 s).
        pub fn idle(&mut self) -> &mut Self {
            self.0.tag(12, OPS).tag(2, 4);
            self
        }

        /// `ROp::Disconnect`.
        pub fn disconnect(&mut self, q: u8) -> &mut Self {
            self.0.tag(13, OPS).u8(q);
            self
        }

        /// Admin queue in slot 0 (Connect data by RDMA READ, as Linux
        /// sends it), enabled; I/O queue in slot 1.
        pub fn bring_up(&mut self) -> &mut Self {
            self.accept(0, None, None)
                .connect(0, None, true)
                .cmd(0, PROP_SET, 0, 0, 0)
                .accept(1, None, None)
                .connect(1, None, false)
        }
    }

    /// The hand-made RDMA seeds: (file name, bytes).
    pub fn all() -> Vec<(&'static str, Vec<u8>)> {
        let mut v = Vec::new();

        // Bring-up, Identify; keyed writes (RDMA READ), keyed reads (RDMA
        // WRITE + SEND, with Invalidate), in-capsule writes, flush, write
        // zeroes, each read checked against the writes.
        let mut r = R::new(None);
        r.bring_up()
            .cmd(0, IDENTIFY, 0, 0, 1)
            .cmd(1, WRITE, 64, 31, 0)
            .cmd(1, READ, 64, 31, 1)
            .cmd(1, WRITE, 200, 1, 0)
            .cmd(1, READ, 200, 1, 0)
            .cmd(1, FLUSH, 0, 0, 0)
            .cmd(1, WRITE_ZEROES, 64, 7, 0)
            .cmd(1, READ, 64, 15, 0);
        v.push(("hand-rdma-io", r.0 .0));

        // The same over a shared receive queue of 4 buffers shared by both
        // queues: far more capsules than buffers.
        let mut r = R::new(Some(3));
        r.bring_up();
        for k in 0..6u8 {
            r.cmd(1, WRITE, u16::from(k) * 8, 7, 0)
                .cmd(1, READ, u16::from(k) * 8, 7, 0)
                .cmd(0, KEEP_ALIVE, 0, 0, 0);
        }
        r.disconnect(1).cmd(0, KEEP_ALIVE, 0, 0, 0);
        v.push(("hand-rdma-srq", r.0 .0));

        // Fused Compare and Write: a write, Compare (FUSE first) + Write
        // (FUSE second) that miscompare, a lone second half (the model
        // forgets a block whose write failed), a write and its read back.
        let mut r = R::new(None);
        r.bring_up()
            .cmd(1, WRITE, 300, 0, 0)
            .cmd(1, COMPARE, 300, 0, 0)
            .cmd(1, WRITE, 300, 0, 0x0c)
            .cmd(1, WRITE, 300, 0, 0x0c)
            .cmd(1, WRITE, 300, 0, 0)
            .cmd(1, READ, 300, 0, 0);
        v.push(("hand-rdma-caw", r.0 .0));

        // Issue 23 finding 1: the connect request asks for HSQSIZE 1 (a
        // queue of 2 entries), the Connect says SQSIZE 127, then 12 writes
        // whose RDMA READs the device holds stay outstanding.
        let mut r = R::new(None);
        r.bring_up()
            .accept(2, Some(1), Some(16))
            .connect(2, Some(127), false);
        r.hold(2, true);
        for k in 0..12u16 {
            r.cmd(2, WRITE, k * 32, 31, 0);
        }
        r.hold(2, false);
        v.push(("hand-rdma-mismatch", r.0 .0));

        // Completions in any order: reads held at read depth 2, SENDs and
        // READs completed last-first, then an error completion (retry
        // exceeded), a flush, and the same completion delivered again.
        let mut r = R::new(None);
        r.bring_up()
            .accept(2, None, Some(2))
            .connect(2, None, false);
        r.hold(2, true);
        for k in 0..4u16 {
            r.cmd(2, WRITE, k * 32, 31, 0)
                .cmd(2, READ, 512 + k * 8, 7, 0);
        }
        for p in [255u8, 3, 254, 1, 0, 7] {
            r.complete(2, p, true);
        }
        r.complete(2, 1, false)
            .flush(2)
            .stale(2, 0, false)
            .disconnect(2);
        v.push(("hand-rdma-any-order", r.0 .0));

        // Liveness: a quiet queue is probed, the probe answered; quiet
        // again, the probe fails: the queue closes; AERs outstanding while
        // the admin queue is dropped.
        let mut r = R::new(None);
        r.bring_up()
            .cmd(0, AER, 0, 0, 0)
            .cmd(0, AER, 0, 0, 0)
            .hold(1, true)
            .idle()
            .complete(1, 0, true)
            .idle()
            .idle()
            .complete(1, 0, false)
            .disconnect(0);
        v.push(("hand-rdma-probe", r.0 .0));
        v
    }
}
