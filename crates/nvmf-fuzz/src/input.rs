//! The structured fuzz input: a list of host actions over a few
//! connections. Every type derives `Arbitrary`, so libFuzzer's bytes (or a
//! PRNG's, in the replay test) decode into a plausible host session. Enums
//! list the meaningful choice first and a `Raw` escape hatch last; repeated
//! variants weight the common cases (derive picks variants uniformly).

use arbitrary::{Arbitrary, Unstructured};

/// Connections a single input may drive at once.
pub const MAX_CONNS: usize = 4;

/// Most actions one case plays.
pub const MAX_OPS: usize = 512;

/// One fuzz case.
#[derive(Debug, Clone)]
pub struct Input {
    /// `TcpParams::c2h_success` (reads finish with the C2HData SUCCESS flag
    /// on queues that disabled SQ flow control).
    pub c2h_success: bool,
    pub ops: Vec<Op>,
}

impl<'a> Arbitrary<'a> for Input {
    fn arbitrary(u: &mut Unstructured<'a>) -> arbitrary::Result<Self> {
        Ok(Input {
            c2h_success: u.arbitrary()?,
            ops: u
                .arbitrary_iter()?
                .take(MAX_OPS)
                .collect::<Result<_, _>>()?,
        })
    }

    /// Actions follow one another until the bytes run out (no "one more?"
    /// flag between them, unlike the derived `Vec` decoding, so random
    /// bytes make long sessions).
    fn arbitrary_take_rest(mut u: Unstructured<'a>) -> arbitrary::Result<Self> {
        let c2h_success = u.arbitrary()?;
        let mut ops = Vec::new();
        while !u.is_empty() && ops.len() < MAX_OPS {
            match Op::arbitrary(&mut u) {
                Ok(op) => ops.push(op),
                Err(_) => break,
            }
        }
        Ok(Input { c2h_success, ops })
    }
}

/// One host action. `conn` is taken modulo [`MAX_CONNS`]; an action on a
/// slot without a connection first opens one (slot 0: admin queue, enabled;
/// other slots: an I/O queue of slot 0's controller).
#[derive(Debug, Clone, Arbitrary)]
pub enum Op {
    /// (Re)open a connection with an explicit handshake.
    Open {
        conn: u8,
        setup: Setup,
        chunk: Chunk,
    },
    IcReq {
        conn: u8,
        ic: IcSpec,
        split: Split,
    },
    Connect {
        conn: u8,
        io: bool,
        spec: ConnectSpec,
        split: Split,
    },
    Admin {
        conn: u8,
        cmd: CmdSpec,
        split: Split,
        mangle: Mangle,
    },
    Io {
        conn: u8,
        cmd: CmdSpec,
        split: Split,
        mangle: Mangle,
    },
    Io2 {
        conn: u8,
        cmd: CmdSpec,
        split: Split,
        mangle: Mangle,
    },
    /// A raw 64-byte SQE in a capsule with `data_len` bytes of in-capsule data.
    RawSqe {
        conn: u8,
        sqe: [u8; 64],
        data_len: u16,
        split: Split,
    },
    /// H2CData for an outstanding R2T (or a made-up one).
    H2c {
        conn: u8,
        h2c: H2cSpec,
        split: Split,
        mangle: Mangle,
    },
    /// Arbitrary bytes on the wire.
    Raw {
        conn: u8,
        bytes: Vec<u8>,
    },
    /// H2CTermReq quoting up to `quoted` bytes.
    TermReq {
        conn: u8,
        fes: u16,
        fei: u32,
        quoted: u8,
    },
    /// Deliver every byte held back by a `Split::Hold`.
    Flush {
        conn: u8,
    },
    /// Read at most `max` bytes of output.
    Read {
        conn: u8,
        max: u16,
    },
    /// Stop (or resume) reading output after each action.
    SetReading {
        conn: u8,
        on: bool,
    },
    /// Advance the fake clock and poll every connection.
    Tick {
        ms: Tick,
    },
    /// Close the socket (drop the connection), commands may be outstanding.
    Drop {
        conn: u8,
    },
}

/// How a connection starts.
#[derive(Debug, Clone, Arbitrary)]
pub enum Setup {
    Bare,
    IcOnly(IcSpec),
    Admin {
        ic: IcSpec,
        connect: ConnectSpec,
        enable: bool,
    },
    Io {
        ic: IcSpec,
        connect: ConnectSpec,
    },
}

/// Size of the socket reads the reactor does for this connection.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Chunk {
    Whole,
    Whole2,
    Bytes(u16),
}

/// ICReq fields.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct IcSpec {
    pub hdgst: bool,
    pub ddgst: bool,
    pub pfv: Small16,
    pub hpda: Small8,
    pub maxr2t: u32,
}

/// A field that is usually 0 (valid) and sometimes anything.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Small16 {
    Zero,
    Zero2,
    Zero3,
    Raw(u16),
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Small8 {
    Zero,
    Zero2,
    Zero3,
    Raw(u8),
}

/// Fabrics Connect fields.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct ConnectSpec {
    pub sqsize: SqSize,
    pub kato: Kato,
    pub cattr: Cattr,
    pub subnqn: SubNqn,
    pub hostnqn: HostNqn,
    pub cntlid: Pick16,
    pub qid: Pick16,
    pub recfmt: Small16,
    pub data: ConnectData,
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum SqSize {
    Typical,
    Typical2,
    Small(u8),
    Zero,
    Raw(u16),
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Kato {
    Default,
    Default2,
    Zero,
    Ms(u16),
    Raw(u32),
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Cattr {
    None,
    None2,
    DisableSqFlow,
    Raw(u8),
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum SubNqn {
    Nvm,
    Nvm2,
    Nvm3,
    Discovery,
    Unknown,
    /// 256 bytes without a NUL.
    Unterminated,
    Empty,
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum HostNqn {
    Default,
    Default2,
    Other,
    Empty,
    Unterminated,
}

/// The harness's natural choice, or a raw value.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Pick16 {
    Auto,
    Auto2,
    Auto3,
    Raw(u16),
}

/// How the 1024-byte Connect data travels.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum ConnectData {
    InCapsule,
    InCapsule2,
    InCapsule3,
    /// Through R2T/H2CData (the harness answers the R2T).
    Transport,
    /// In-capsule, but `n` bytes, SGL claiming 1024.
    Short(u16),
    None,
}

/// One NVMe command (admin or I/O depending on the action).
#[derive(Debug, Clone, Arbitrary)]
pub struct CmdSpec {
    /// Index into the weighted opcode table.
    pub op: u8,
    pub cid: Cid,
    pub nsid: Nsid,
    pub slba: Lba,
    /// 0-based block count.
    pub nlb: u8,
    /// Small selector: CNS, log page id, feature id, property offset, ...
    pub sel: u8,
    pub cdw: [u32; 6],
    pub flags: Small8,
    pub sgl: Sgl,
    pub data: Data,
    /// Answer an R2T for this command right away with correct H2CData.
    pub answer_r2t: bool,
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Cid {
    Next,
    Next2,
    Next3,
    /// An outstanding CID (index modulo their count): a CID conflict.
    Reuse(u8),
    Raw(u16),
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Nsid {
    Malloc,
    Malloc2,
    Null,
    Zero,
    All,
    Raw(u32),
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Lba {
    Low(u16),
    Low2(u16),
    Raw(u64),
}

/// The data pointer.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Sgl {
    /// What a host would use: in-capsule writes up to the in-capsule limit,
    /// transport data blocks otherwise, with the command's length.
    Auto,
    Auto2,
    Auto3,
    InCapsule(Len),
    Transport(Len),
    Raw([u8; 16]),
}

/// A transfer length relative to the command's natural length.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Len {
    Auto,
    Plus(u16),
    Minus(u16),
    Raw(u32),
}

/// In-capsule data actually sent.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Data {
    /// As the SGL says (when in-capsule).
    Auto,
    Auto2,
    Auto3,
    None,
    Len(u16),
}

/// H2CData for an R2T.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub struct H2cSpec {
    /// Which recorded R2T (modulo their count).
    pub pick: u8,
    /// PDUs to send now (0: until the transfer is complete).
    pub pieces: u8,
    pub size: Piece,
    pub fault: H2cFault,
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Piece {
    Max,
    Max2,
    Bytes(u16),
}

#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum H2cFault {
    None,
    None2,
    None3,
    None4,
    Ttag(u16),
    Cccid(u16),
    Datao(i16),
    /// DATAL in the header differs from the payload by this much.
    Datal(i16),
    FlipLast,
    /// One PDU larger than MAXH2CDATA.
    OverMax,
    Empty,
}

/// Corruption applied to an encoded PDU.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Mangle {
    None,
    None2,
    None3,
    None4,
    None5,
    HeaderDigest,
    DataDigest,
    Byte { pos: u16, xor: u8 },
}

/// How much of an action's bytes reach the target now.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Split {
    Whole,
    Whole2,
    Whole3,
    Whole4,
    /// Hold back the last `n % len` bytes until the next delivery.
    Hold(u16),
}

/// Fake-clock advance.
#[derive(Debug, Clone, Copy, Arbitrary)]
pub enum Tick {
    Ms(u8),
    Sec(u8),
    /// Past the default keep-alive timeout.
    PastKato,
}
