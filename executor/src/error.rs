//! The executor's errors. [`ExecError`] is what a run ends with: which rank failed,
//! in which phase, and why. The enums below are the typed reasons of each area
//! (rendezvous and auth, ...); each one's `Display` is the one-line message the
//! CLI prints, and a run folds it into an [`ExecError`]'s `detail`.

use crate::auth::{MIN_SECRET_LEN, SECRET_VAR};
use crate::rendezvous::{MAX_BLOB, MAX_WORLD};
use sextant_planner::ranks::GroupKind;
use std::net::SocketAddr;

/// A failure of one rank. Displayed as one line: `rank 3, step 2 forward
/// micro-batch 1 layer 4 (TP all-gather): rank 5 closed its connection ...`.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
#[error("rank {rank}, {phase}: {detail}")]
pub struct ExecError {
    pub rank: u64,
    pub phase: String,
    pub detail: String,
}

/// The job secret, the handshake's randomness, authenticated messages and the
/// accept loop ([`crate::auth`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum AuthError {
    #[error("{} is {len} bytes long; use at least {} random ASCII characters (e.g. the output of `openssl rand -hex 32`)", SECRET_VAR, MIN_SECRET_LEN)]
    ShortSecret { len: usize },
    /// `what`: "the job secret" or "a nonce".
    #[error("no random numbers for {what}: {detail}")]
    NoRandom { what: &'static str, detail: String },
    #[error("message too long")]
    MessageTooLong,
    #[error("a message of {len} bytes was announced, more than the {max_len} this job can need")]
    Oversized { len: usize, max_len: usize },
    #[error("a message failed its authentication check")]
    BadTag,
    #[error("cannot start a thread to accept a connection: {0}")]
    AcceptThread(String),
    #[error("accepting connections failed: {0}")]
    Accept(String),
    /// A socket's I/O error, as the system words it.
    #[error("{0}")]
    Io(String),
}

impl From<std::io::Error> for AuthError {
    fn from(e: std::io::Error) -> Self {
        AuthError::Io(e.to_string())
    }
}

/// The launcher's variables and the TCP rendezvous ([`crate::rendezvous`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum RendezvousError {
    #[error("{name}={value:?} is not a non-negative integer")]
    NotInteger { name: String, value: String },
    #[error(
        "{launcher} says rank {rank} of world size {world}: the rank must be below the world size"
    )]
    RankBeyondWorld {
        launcher: &'static str,
        rank: u64,
        world: u64,
    },
    #[error("{rank_var}/{world_var} are set ({launcher}) but MASTER_ADDR is not: set it to rank 0's host name or address")]
    NoMasterAddr {
        launcher: &'static str,
        rank_var: &'static str,
        world_var: &'static str,
    },
    #[error("MASTER_PORT={0:?} is not a port number (1-65535)")]
    BadPort(String),
    #[error("no launcher variables found (RANK/WORLD_SIZE from torchrun, SLURM_PROCID/SLURM_NTASKS, or OMPI_COMM_WORLD_RANK/SIZE): start under torchrun, srun or mpirun, or use --ranks N to start local ranks")]
    NoLauncher,
    #[error("cannot resolve MASTER_ADDR {addr:?}: {detail}")]
    Resolve { addr: String, detail: String },
    #[error("MASTER_ADDR {0:?} resolves to no address")]
    NoAddress(String),
    #[error("MASTER_PORT {0} is already in use on this host (another job or a leftover process): choose a free port")]
    PortInUse(u16),
    #[error("cannot listen on MASTER_PORT {port}: {detail}")]
    Listen { port: u16, detail: String },
    #[error("world size {0} is more than the {max} ranks the rendezvous serves", max = MAX_WORLD)]
    WorldTooLarge(u64),
    #[error("rank 0's blob is {0} bytes, more than {max}", max = MAX_BLOB)]
    BlobTooLarge(usize),
    #[error("rank 0 at {at} refused this rank's credentials: every rank needs the same {} (or another job holds MASTER_PORT)", SECRET_VAR)]
    Credentials { at: String },
    #[error("could not reach rank 0 at {at} within {secs} s: {detail}")]
    Unreachable {
        at: String,
        secs: u64,
        detail: String,
    },
    #[error("sending this rank's hello to rank 0 failed: {0}")]
    SendHello(AuthError),
    #[error("no answer from rank 0 within {secs} s ({reason})")]
    NoAnswer { secs: u64, reason: AuthError },
    #[error("malformed answer from rank 0: {0}")]
    MalformedAnswer(String),
    #[error("rendezvous refused by rank 0: {0}")]
    Refused(String),
    #[error(
        "rank 0 sent {peers} peer addresses for world size {world} and a blob of {blob} bytes"
    )]
    BadReply {
        peers: usize,
        world: u64,
        blob: usize,
    },
    #[error("rank {claim} sent no readable hello: {detail}")]
    UnreadableHello { claim: u64, detail: String },
    #[error("a process authenticated as rank {claim} says it is rank {said}")]
    WrongClaim { claim: u64, said: u64 },
    #[error("rank {rank} was started with world size {theirs} but rank 0 with {ours}")]
    WorldMismatch { rank: u64, theirs: u64, ours: u64 },
    #[error("a process claims rank {rank} (world size {world}): two launches share MASTER_PORT and {}, or the ranks are numbered wrongly", SECRET_VAR)]
    BadRank { rank: u64, world: u64 },
    #[error("rank {0} arrived twice: two launches share MASTER_PORT and {var}, or the ranks are numbered wrongly", var = SECRET_VAR)]
    Twice(u64),
    #[error("rank {rank} runs a different plan file (hash {theirs}) from rank 0 ({ours}): give every rank the same plan")]
    PlanMismatch {
        rank: u64,
        theirs: String,
        ours: String,
    },
    /// `absent`: the ranks that never arrived; `refused`: connections without the secret.
    #[error("timed out after {secs} s: rank{} {} of world size {world} never arrived{}",
        if .absent.len() > 1 { "s" } else { "" }, join(.absent), refused_note(*.refused))]
    TimedOut {
        secs: u64,
        absent: Vec<u64>,
        world: u64,
        refused: u64,
    },
    /// Rank 0's answer (the peer table or a refusal) could not be sent.
    #[error("answering a rank failed: {0}")]
    Answer(String),
    #[error(transparent)]
    Auth(#[from] AuthError),
    /// A JSON encoding error, as serde words it.
    #[error("{0}")]
    Json(String),
}

fn join(v: &[u64]) -> String {
    v.iter()
        .map(|q| q.to_string())
        .collect::<Vec<_>>()
        .join(", ")
}

fn refused_note(refused: u64) -> String {
    if refused > 0 {
        format!(
            " ({refused} connection{} without this job's {SECRET_VAR} refused)",
            if refused > 1 { "s" } else { "" }
        )
    } else {
        String::new()
    }
}

/// The CPU transport: connecting the mesh, frames to and from peers, a peer's
/// failure ([`crate::mesh`]). `Clone`: the first failure is kept and handed to every
/// blocked receive.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum MeshError {
    #[error("rank {rank} of world size {world} with {addrs} peer addresses")]
    BadWorld { rank: u64, world: u64, addrs: usize },
    #[error(
        "rank {peer} at {addr} refused this rank's credentials (or is not rank {peer} of this job)"
    )]
    Credentials { peer: u64, addr: SocketAddr },
    #[error("could not connect to rank {peer} at {addr} within {secs} s: {detail}")]
    Unreachable {
        peer: u64,
        addr: SocketAddr,
        secs: u64,
        detail: String,
    },
    #[error("a process holding this job's secret claims rank {claim} twice or out of order (world size {world}): are two launches sharing the secret?")]
    BadClaim { claim: u64, world: u64 },
    #[error("ranks {} never connected within {secs} s{}", join(.absent),
        if *.refused > 0 { format!(" ({} connections without this job's secret refused)", .refused) } else { String::new() })]
    NeverConnected {
        absent: Vec<u64>,
        secs: u64,
        refused: u64,
    },
    #[error("cannot start the thread that reads from rank {peer}: {detail} (the CPU mesh needs one thread per peer: {threads} here)")]
    ReaderThread {
        peer: u64,
        detail: String,
        threads: u64,
    },
    #[error("no connection to rank {0}")]
    NoConnection(u64),
    #[error("sending to rank {to} failed: {detail}")]
    Send { to: u64, detail: String },
    #[error("rank {0} closed its connection before finishing (it exited, crashed or was killed)")]
    PeerClosed(u64),
    #[error("rank {peer} announced a message of {len} bytes, more than this plan can need ({max_frame}): its stream is corrupt")]
    PeerOversized { peer: u64, len: u64, max_frame: u64 },
    #[error("rank {0} closed its connection in the middle of a message")]
    PeerCut(u64),
    /// A peer's `ABORT` with its message.
    #[error("rank {peer} failed: {message}")]
    PeerFailed { peer: u64, message: String },
    #[error("this rank failed: {0}")]
    ThisRankFailed(String),
    #[error("rank {from} finished without sending the message this rank waits for (tag {tag:#x}): the ranks disagree on the schedule")]
    Unsent { from: u64, tag: u64 },
    #[error("waited {secs} s for rank {from} (tag {tag:#x}): it is stuck, or the ranks disagree on the plan's schedule")]
    Waited { secs: u64, from: u64, tag: u64 },
    #[error(transparent)]
    Auth(#[from] AuthError),
}

impl From<std::io::Error> for MeshError {
    fn from(e: std::io::Error) -> Self {
        MeshError::Auth(AuthError::from(e))
    }
}

/// Collectives over the mesh and the tensors they carry ([`crate::comm`],
/// [`crate::tensor`], the model's communication).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CommError {
    #[error("received {0} bytes, not a whole number of f32 values")]
    Bytes(usize),
    #[error("received {len} values for a {rows} x {cols} tensor")]
    Shape {
        len: usize,
        rows: usize,
        cols: usize,
    },
    #[error("rank {rank} is not in its own {group} group {members:?}")]
    NotMember {
        rank: u64,
        group: &'static str,
        members: Vec<u64>,
    },
    /// `op`: "reduce-scatter" or "all-gather".
    #[error("{group} {op}: rank {from} sent {got} values, expected {expected}")]
    Count {
        group: &'static str,
        op: &'static str,
        from: u64,
        got: usize,
        expected: usize,
    },
    #[error("{group} all-to-all needs {needs} parts, got {got}")]
    Parts {
        group: &'static str,
        needs: usize,
        got: usize,
    },
    #[error("{group} barrier summed to {sum:?}, expected {size} everywhere")]
    Barrier {
        group: &'static str,
        sum: Vec<f32>,
        size: usize,
    },
    #[error(transparent)]
    Mesh(#[from] MeshError),
}

/// From a plan to what this executor runs ([`crate::program::prepare`]): what it
/// cannot run, with the reason.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SetupError {
    #[error("--plan {rank} : the file holds plans 1 to {count}")]
    NoSuchPlan { rank: usize, count: usize },
    #[error("MLA attention is executed as standard multi-head attention; full-size runs of MLA models are refused")]
    FullSizeMla,
    /// The plan's layout refused by the planner, in its words.
    #[error("{0}")]
    Layout(String),
    #[error("{layers} layers: choose --scale-layers between {min} and {max}")]
    Layers { layers: usize, min: usize, max: u64 },
    #[error("--scale-layers {layers} is fewer than the plan's {stages} virtual pipeline stages (each needs a layer)")]
    FewerLayersThanStages { layers: usize, stages: usize },
    #[error("sizes do not divide: heads {heads} and ffn {ffn} by tp {tp}, seq {seq} by cp x tp, experts {experts} by ep {ep}, expert ffn {expert_ffn} by etp {etp}")]
    Indivisible {
        heads: usize,
        ffn: usize,
        tp: usize,
        seq: usize,
        experts: usize,
        ep: u64,
        expert_ffn: usize,
        etp: usize,
    },
    #[error("--micro-batches {micro_batches}: the interleaved schedule needs a multiple of pp {pp}; use --micro-batches {suggest}")]
    Interleaved {
        pp: u64,
        micro_batches: u64,
        /// The nearest multiple of pp within the executor's bounds.
        suggest: u64,
    },
    /// A count beyond what the executor's message tags can number, in words that
    /// name the flag (or the plan) that sets it.
    #[error("{0}")]
    TagBounds(String),
    /// The plan's rank map refused by the planner, in its words.
    #[error("{0}")]
    RankMap(String),
    #[error("micro-batch {mbs} x seq {seq}: one micro-batch's {what} would exceed 2^50 bytes, more than any GPU holds; lower the sequence length or the micro-batch size")]
    TooLarge {
        what: &'static str,
        mbs: usize,
        seq: usize,
    },
}

/// A rank's groups and the measurements gathered on rank 0 ([`crate::program`]).
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum ProgramError {
    #[error("no group kind {0}")]
    NoGroupKind(String),
    #[error("rank {rank} sent unreadable measurements: {detail}")]
    UnreadableStats { rank: u64, detail: String },
    /// A JSON encoding error, as serde words it.
    #[error("{0}")]
    Json(String),
    #[error(transparent)]
    Setup(#[from] SetupError),
    #[error(transparent)]
    Comm(#[from] CommError),
    #[error(transparent)]
    Mesh(#[from] MeshError),
}

/// Device programs that would not pair up ([`crate::trace::check`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum TraceError {
    #[error("{programs} programs for a world of {world} ranks")]
    Programs { programs: usize, world: u64 },
    /// `first_issues` and `second_issues`: each op in words.
    #[error("ranks {first} and {second} meet on their {group} group with different collectives: rank {first} op {first_op} issues {first_issues}, rank {second} op {second_op} issues {second_issues}")]
    Collectives {
        first: usize,
        second: u64,
        group: GroupKind,
        first_op: usize,
        first_issues: String,
        second_op: usize,
        second_issues: String,
    },
    #[error("rank {rank} op {op} sends to rank {to}, which is not a peer")]
    NotAPeer { rank: usize, op: usize, to: u64 },
    #[error("rank {rank} op {op} sends {bytes} bytes to rank {to}, which receives {received} bytes from it at op {their_op}")]
    Sizes {
        rank: usize,
        op: usize,
        bytes: u64,
        to: usize,
        received: u64,
        their_op: usize,
    },
    /// `stuck`: each stuck rank, its position and what it waits for, in words.
    #[error("the device programs would hang: {}{}", .stuck.iter().take(4).cloned().collect::<Vec<_>>().join("; "),
        if .stuck.len() > 4 { format!(" (and {} more ranks)", .stuck.len() - 4) } else { String::new() })]
    Hang { stuck: Vec<String> },
}

/// Finding and opening the CUDA libraries and binding NCCL's functions
/// ([`crate::cuload`], feature `cuda`).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum LoadError {
    /// What was searched and why nothing opened, on one line.
    #[error("{}", .0.to_string().replace(['\n', '\r'], " "))]
    NotFound(crate::culibs::NotFound),
    #[error("NCCL was not opened")]
    NcclNotOpened,
    /// `detail`: the loader's words, on one line.
    #[error("{file} is not a usable NCCL 2.18 or later: it has no {symbol} ({detail})")]
    NoSymbol {
        file: String,
        symbol: &'static str,
        detail: String,
    },
}

/// What every function of the CUDA backend says when this sextant was built without
/// the `cuda` feature.
pub const NOT_COMPILED: &str = "this sextant was built without CUDA support: rebuild with `cargo build --release --features cuda`";

/// A CUDA driver status as the driver words it: `CUDA_ERROR_X: text`, or the code's
/// name alone where the driver has no words for it. Read when the call fails (the
/// driver is loaded then), so that showing it calls nothing.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct DriverStatus {
    pub name: String,
    pub text: Option<String>,
}

impl std::fmt::Display for DriverStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match &self.text {
            Some(t) => write!(f, "{}: {t}", self.name),
            None => f.write_str(&self.name),
        }
    }
}

/// A cuBLAS status: its `cublasStatus_t` name, shown as cudarc's `CublasError(..)`.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("CublasError({0})")]
pub struct BlasStatus(pub String);

/// An NCCL status: the `ncclResult_t` name, NCCL's text for it and, where the
/// communicator has one (NCCL 2.13 and later), its last error; read when the call
/// fails.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NcclStatus {
    pub name: String,
    pub general: String,
    pub last: String,
}

impl std::fmt::Display for NcclStatus {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.name)?;
        if !self.general.is_empty() {
            write!(f, " ({})", self.general)?;
        }
        if !self.last.is_empty() {
            write!(f, ": {}", self.last)?;
        }
        Ok(())
    }
}

/// Why a BF16 GEMM was refused or failed in cuBLAS ([`CudaError::Gemm`]).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum GemmError {
    /// `(m, n, k, lda, ldb, ldc, batch)` in cuBLAS's column-major terms.
    #[error("cuBLAS arguments {0:?} do not describe column-major operands")]
    Arguments([i32; 7]),
    /// `operand`: "first operand", "second operand" or "output".
    #[error(
        "the {operand} needs {stride} x {batch} BF16 elements but its buffer holds {bytes} bytes"
    )]
    Span {
        operand: &'static str,
        stride: u64,
        batch: i32,
        bytes: u64,
    },
    #[error(transparent)]
    Status(BlasStatus),
}

/// The CUDA backend's device layer ([`crate::cuda`]): loading the libraries, the
/// driver, devices and contexts, allocations, cuBLAS and NCCL calls. The same type in
/// a build without the `cuda` feature, whose functions return [`CudaError::NotCompiled`].
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum CudaError {
    #[error("{}", NOT_COMPILED)]
    NotCompiled,
    /// A library not found, or NCCL without a symbol it needs.
    #[error(transparent)]
    Load(#[from] LoadError),
    /// A panic inside cudarc (a missing symbol, an `expect`), with its message.
    #[error("CUDA library call failed: {0}")]
    Panic(String),
    #[error("no CUDA driver found (only the CUDA toolkit's stub libcuda.so was loaded): run on a machine with an NVIDIA GPU and driver, or use --backend cpu")]
    StubDriver,
    #[error("the CUDA driver failed to initialise: {0}")]
    Init(DriverStatus),
    /// `version`: `cuDriverGetVersion`'s code, e.g. 12040.
    #[error("the CUDA driver supports CUDA {}.{}; the CUDA backend needs 12.8 or later (driver 570 or newer): update the driver, or use --backend cpu", .version / 1000, .version % 1000 / 10)]
    OldDriver { version: i32 },
    #[error("reading the CUDA driver's version: {0}")]
    DriverVersion(DriverStatus),
    #[error("counting CUDA devices: {0}")]
    Count(DriverStatus),
    /// `visible`: `CUDA_VISIBLE_DEVICES` when set.
    #[error("CUDA device {ordinal} does not exist ({count} {} visible{})",
        if *.count == 1 { "device" } else { "devices" },
        .visible.as_ref().map(|v| format!("; CUDA_VISIBLE_DEVICES is '{v}'")).unwrap_or_default())]
    NoDevice {
        ordinal: usize,
        count: usize,
        visible: Option<String>,
    },
    #[error("opening CUDA device {ordinal}: {status}")]
    Open {
        ordinal: usize,
        status: DriverStatus,
    },
    /// `what`: the property read, e.g. "the name" or "the SM count".
    #[error("reading {what} of CUDA device {ordinal}: {status}")]
    Query {
        what: String,
        ordinal: usize,
        status: DriverStatus,
    },
    #[error("creating a CUDA context on device {ordinal}: {status}")]
    Context {
        ordinal: usize,
        status: DriverStatus,
    },
    #[error("creating a CUDA stream on device {ordinal}: {status}")]
    Stream {
        ordinal: usize,
        status: DriverStatus,
    },
    #[error("cuMemGetInfo on device {ordinal}: {status}")]
    MemInfo {
        ordinal: usize,
        status: DriverStatus,
    },
    #[error("setting up the memory pool of CUDA device {ordinal}: {status}")]
    Pool {
        ordinal: usize,
        status: DriverStatus,
    },
    /// `counter`: which of the pool's counts (reserved / used bytes and their peaks).
    #[error("reading the memory pool's {counter}: {status}")]
    PoolBytes {
        counter: String,
        status: DriverStatus,
    },
    /// A driver call that failed, with no more to say than its status.
    #[error("{0}")]
    Driver(DriverStatus),
    /// A driver call that failed: `call` names it or says what it did.
    #[error("{call}: {status}")]
    DriverCall { call: String, status: DriverStatus },
    /// `free`: the device's `(free, total)` bytes, or why they could not be read.
    #[error("out of memory on CUDA device {ordinal}: {what} needs {bytes} bytes ({:.2} GiB); the device has {}",
        *.bytes as f64 / GIB, free_note(.free))]
    OutOfMemory {
        ordinal: usize,
        what: String,
        bytes: u64,
        free: Result<(u64, u64), Box<CudaError>>,
    },
    #[error("allocating {bytes} bytes for {what} on CUDA device {ordinal}: {status}")]
    Alloc {
        ordinal: usize,
        what: String,
        bytes: u64,
        status: DriverStatus,
    },
    #[error("{what}: {bytes} bytes do not fit this machine's address space")]
    AddressSpace { what: String, bytes: u64 },
    #[error("creating a cuBLAS handle on device {ordinal}: {status}")]
    BlasHandle { ordinal: usize, status: BlasStatus },
    #[error("cublasGetVersion failed: {0}")]
    BlasVersion(BlasStatus),
    #[error("dimension {0} is outside cuBLAS's range 1..={max}", max = i32::MAX)]
    GemmDimension(u64),
    #[error("batch {0} is outside cuBLAS's range")]
    GemmBatch(u64),
    /// Row-major `m x n x k`, `batch` products.
    #[error("cuBLAS GEMM {m}x{n}x{k} (batch {batch}) failed: {error}")]
    Gemm {
        m: u64,
        n: u64,
        k: u64,
        batch: u64,
        error: GemmError,
    },
    /// An NCCL call that failed: `call` names it or says what it did.
    #[error("{call} failed: {status}")]
    Nccl { call: String, status: NcclStatus },
    /// `call`: "ncclGroupStart" or "ncclGroupEnd"; `what`: what the group was for.
    #[error("{what}: {call} failed: {status}")]
    NcclGroup {
        what: String,
        call: &'static str,
        status: NcclStatus,
    },
    /// `device`: the rank's device, where one thread drives several.
    #[error("ncclCommInitRank (rank {rank} of {ranks}{}) failed: {status}",
        .device.map(|d| format!(", device {d}")).unwrap_or_default())]
    NcclInit {
        rank: u64,
        ranks: u64,
        device: Option<usize>,
        status: NcclStatus,
    },
    #[error("ncclCommSplit for the {kind} groups failed (NCCL 2.18 or later is needed): {status}")]
    NcclSplit { kind: GroupKind, status: NcclStatus },
}

const GIB: f64 = (1u64 << 30) as f64;

fn free_note(free: &Result<(u64, u64), Box<CudaError>>) -> String {
    match free {
        Ok((free, total)) => format!(
            "{free} bytes ({:.2} GiB) free of {:.1} GiB",
            *free as f64 / GIB,
            *total as f64 / GIB
        ),
        Err(e) => format!("free memory unknown ({e})"),
    }
}

/// The device program's interpreter ([`crate::device`]): the job's bounds, the
/// communicators and scratch, the checks before the timed steps, each op's issue.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum DeviceError {
    #[error("this rank's step is {0} ops, more than the {max} the CUDA backend times: cut it down with --micro-batches or --scale-layers", max = crate::device::MAX_PROGRAM_OPS)]
    TooManyOps(usize),
    #[error("an NCCL unique id is 128 bytes, got {0}")]
    UniqueId(usize),
    #[error("ncclCommInitRank (rank {rank} of {world}) made no communicator")]
    NoCommunicator { rank: u64, world: u64 },
    #[error("rank {rank} is not in its own {kind} group")]
    NotInGroup { rank: u64, kind: GroupKind },
    #[error("filling scratch: {size} bytes run past its buffer")]
    ScratchSize { size: u64 },
    #[error("filling scratch: {0}")]
    FillScratch(DriverStatus),
    /// `what`: the op, in words.
    #[error(
        "{what}: {bytes} bytes at offset {offset} run past a scratch buffer of {scratch} bytes"
    )]
    PastScratch {
        what: String,
        offset: u64,
        bytes: u64,
        scratch: u64,
    },
    #[error("the {class} GEMM: {error}")]
    Gemm {
        class: sextant_planner::walk::OpClass,
        error: Box<CudaError>,
    },
    #[error("element-wise copy of {bytes} bytes: {status}")]
    Copy { bytes: u64, status: DriverStatus },
    #[error("step {step}: {status}")]
    Step { step: u64, status: DriverStatus },
    #[error("checking the communicators: {0}")]
    CommCheck(CudaError),
    #[error("checking the communicators: float {0} is past its buffer")]
    CommCheckBuffer(u64),
    #[error("the {kind} communicator of rank {rank} summed its members' rank + 1 to {got}, but its members {members:?} sum to {want}: NCCL grouped the ranks differently from the plan")]
    CommSum {
        kind: &'static str,
        rank: u64,
        got: f32,
        members: Vec<u64>,
        want: f32,
    },
    /// `gemm`: the GEMM checked, in words ("the mlp GEMM 64x64x64 (batch 1)").
    #[error("{gemm}: {error}")]
    GemmCheck { gemm: String, error: Box<CudaError> },
    #[error("{gemm}: its result runs past scratch C")]
    GemmResultPastScratch { gemm: String },
    /// `at`: (product, row, column) of C.
    #[error("{gemm}: C[{}][{}][{}] is {got}, the host computes {want:.6} (relative error {rel:.2e}, more than {tolerance:.2e}): cuBLAS was called with arguments that do not describe the operands", .at.0, .at.1, .at.2)]
    GemmMismatch {
        gemm: String,
        at: (u64, u64, u64),
        got: f64,
        want: f64,
        rel: f64,
        tolerance: f64,
    },
    #[error(transparent)]
    Cuda(#[from] CudaError),
}

/// The microbenchmarks ([`crate::bench`]): their arguments, checked before any
/// library is touched, and what failed while timing.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum BenchError {
    #[error("{iters} timed and {warmup} warm-up calls per point: use 1 to {max} timed calls and at most {max} warm-up calls", max = crate::bench::MAX_ITERS)]
    Timing { iters: u32, warmup: u32 },
    #[error("no GEMM shape to time")]
    NoShape,
    /// `gemm`: the shape, in words ("GEMM 'mlp' 8x8x8 (batch 1)").
    #[error("{gemm}: {error}")]
    Gemm { gemm: String, error: Box<CudaError> },
    #[error("{gemm}: the batch is outside cuBLAS's range")]
    GemmBatch { gemm: String },
    #[error("{gemm}: its buffers' size overflows")]
    GemmOverflow { gemm: String },
    #[error("the GEMM operands' size overflows")]
    OperandsOverflow,
    #[error("no buffer size to time")]
    NoBufferSize,
    #[error("a buffer size of 0 bytes: give sizes of 1 byte or more")]
    ZeroBuffer,
    #[error("the buffers' size overflows")]
    BuffersOverflow,
    /// `op`: "copy" or "memset".
    #[error("{op} of {bytes} bytes: {status}")]
    Memory {
        op: &'static str,
        bytes: u64,
        status: DriverStatus,
    },
    #[error("no device, collective or size to time")]
    NoCollective,
    #[error("the devices {0:?} repeat one: NCCL takes one rank per device")]
    RepeatedDevice(Vec<usize>),
    #[error("a collective of {bytes} bytes over {gpus} GPUs: give a positive multiple of {} bytes (a whole number of BF16 elements per GPU)", 2 * .gpus)]
    CollectiveSize { bytes: u64, gpus: u64 },
    /// `op`: the collective's label, e.g. "all_reduce".
    #[error("nccl {op} of {bytes} bytes on {gpus} GPUs: rank {rank}: {status}")]
    Collective {
        op: &'static str,
        bytes: u64,
        gpus: u64,
        rank: usize,
        status: NcclStatus,
    },
    #[error("NCCL made {made} of {wanted} communicators")]
    Communicators { made: usize, wanted: usize },
    #[error("a peer copy needs two devices: both are {0}")]
    SameDevice(usize),
    #[error("no copy size to time")]
    NoCopySize,
    #[error("a copy of 0 bytes: give sizes of 1 byte or more")]
    ZeroCopy,
    #[error("copying {bytes} bytes from device {src} to {dst}: {status}")]
    PeerCopy {
        bytes: u64,
        src: usize,
        dst: usize,
        status: DriverStatus,
    },
    #[error(transparent)]
    Cuda(#[from] CudaError),
}
