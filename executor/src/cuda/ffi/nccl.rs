//! The NCCL calls the backend makes, bound to the library
//! [`crate::cuload::ensure`]`(Lib::Nccl)` opened (`libnccl.so.2` is no cudarc
//! candidate), with cudarc's types. Before [`bind`] succeeds every call returns
//! `ncclInvalidUsage`.
//!
//! A communicator is a [`Comm`], live until it drops (destroyed after a clean run,
//! aborted otherwise); buffers are [`DevSpan`]s, checked against each call's counts
//! (`ncclInvalidArgument` where they do not hold them). The sizes that depend on the
//! group (an all-gather's output, a reduce-scatter's input) use the rank count the
//! communicator was made with: exact for [`Comm::init_rank`], and for
//! [`Comm::split`] the group size the plan gives every member (the same plan on
//! every rank: the rendezvous checks its hash, and the start-up check sums each
//! group's ranks).

use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::OnceLock;

use cudarc::driver::CudaStream;
pub use cudarc::nccl::result::{NcclError, NcclStatus};
use cudarc::nccl::sys::{
    cudaStream_t, ncclComm_t, ncclConfig_t, ncclDataType_t, ncclRedOp_t, ncclResult_t, ncclUniqueId,
};
use libloading::os::unix::Library;

use super::DevSpan;
use crate::culibs::Lib;
use crate::cuload::{one_line, with_opened, LoadError};
use crate::error::CudaError;

type Coll = unsafe extern "C" fn(
    *const c_void,
    *mut c_void,
    usize,
    ncclDataType_t,
    ncclRedOp_t,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;
type P2p = unsafe extern "C" fn(
    *const c_void,
    usize,
    ncclDataType_t,
    c_int,
    ncclComm_t,
    cudaStream_t,
) -> ncclResult_t;

/// NCCL's entry points, resolved when the library is opened.
struct Api {
    get_version: unsafe extern "C" fn(*mut c_int) -> ncclResult_t,
    get_unique_id: unsafe extern "C" fn(*mut ncclUniqueId) -> ncclResult_t,
    comm_init_rank:
        unsafe extern "C" fn(*mut ncclComm_t, c_int, ncclUniqueId, c_int) -> ncclResult_t,
    comm_split: unsafe extern "C" fn(
        ncclComm_t,
        c_int,
        c_int,
        *mut ncclComm_t,
        *mut ncclConfig_t,
    ) -> ncclResult_t,
    comm_destroy: unsafe extern "C" fn(ncclComm_t) -> ncclResult_t,
    comm_abort: unsafe extern "C" fn(ncclComm_t) -> ncclResult_t,
    all_reduce: Coll,
    reduce_scatter: Coll,
    all_gather: unsafe extern "C" fn(
        *const c_void,
        *mut c_void,
        usize,
        ncclDataType_t,
        ncclComm_t,
        cudaStream_t,
    ) -> ncclResult_t,
    send: P2p,
    recv: unsafe extern "C" fn(
        *mut c_void,
        usize,
        ncclDataType_t,
        c_int,
        ncclComm_t,
        cudaStream_t,
    ) -> ncclResult_t,
    group_start: unsafe extern "C" fn() -> ncclResult_t,
    group_end: unsafe extern "C" fn() -> ncclResult_t,
    get_error_string: unsafe extern "C" fn(ncclResult_t) -> *const c_char,
    /// From NCCL 2.13 on.
    get_last_error: Option<unsafe extern "C" fn(ncclComm_t) -> *const c_char>,
}

/// The id every rank of a communicator starts from (128 bytes).
pub(crate) type UniqueId = ncclUniqueId;

static API: OnceLock<Result<Api, LoadError>> = OnceLock::new();

/// The function `name` in `lib` (opened from `from`), or one line saying it is missing.
fn sym<T: Copy>(lib: &Library, from: &str, name: &'static str) -> Result<T, LoadError> {
    // SAFETY: `T` is the function-pointer type NCCL's header (nccl.h, 2.18+) gives
    // `name`; `Api` declares each one, and the pointer is used only while `lib`,
    // kept open by `cuload` for the life of the process, is loaded.
    let f = unsafe { lib.get::<T>(format!("{name}\0").as_bytes()) }.map_err(|e| {
        LoadError::NoSymbol {
            file: from.to_string(),
            symbol: name,
            detail: one_line(e),
        }
    })?;
    Ok(*f)
}

/// Resolves NCCL's symbols in the library [`crate::cuload::ensure`] opened (once).
pub(crate) fn bind() -> Result<(), LoadError> {
    crate::cuload::ensure(Lib::Nccl)?;
    API.get_or_init(|| {
        with_opened(Lib::Nccl, |from, lib| {
            let from = match from {
                Some(p) => p.display().to_string(),
                None => "libnccl.so.2".into(),
            };
            Ok(Api {
                get_version: sym(lib, &from, "ncclGetVersion")?,
                get_unique_id: sym(lib, &from, "ncclGetUniqueId")?,
                comm_init_rank: sym(lib, &from, "ncclCommInitRank")?,
                comm_split: sym(lib, &from, "ncclCommSplit")?,
                comm_destroy: sym(lib, &from, "ncclCommDestroy")?,
                comm_abort: sym(lib, &from, "ncclCommAbort")?,
                all_reduce: sym(lib, &from, "ncclAllReduce")?,
                reduce_scatter: sym(lib, &from, "ncclReduceScatter")?,
                all_gather: sym(lib, &from, "ncclAllGather")?,
                send: sym(lib, &from, "ncclSend")?,
                recv: sym(lib, &from, "ncclRecv")?,
                group_start: sym(lib, &from, "ncclGroupStart")?,
                group_end: sym(lib, &from, "ncclGroupEnd")?,
                get_error_string: sym(lib, &from, "ncclGetErrorString")?,
                // SAFETY: as in `sym`: `ncclGetLastError(ncclComm_t) -> const char*`
                // (NCCL 2.13+), absent in older libraries.
                get_last_error: unsafe { lib.get(b"ncclGetLastError\0") }.ok().map(|s| *s),
            })
        })
        .unwrap_or(Err(LoadError::NcclNotOpened))
    })
    .as_ref()
    .map(|_| ())
    .map_err(Clone::clone)
}

fn api() -> Result<&'static Api, NcclError> {
    API.get()
        .and_then(|r| r.as_ref().ok())
        .ok_or(NcclError(ncclResult_t::ncclInvalidUsage))
}

fn res(r: ncclResult_t) -> Result<NcclStatus, NcclError> {
    r.result()
}

/// The error a span too small for a call gives.
fn too_small() -> NcclError {
    NcclError(ncclResult_t::ncclInvalidArgument)
}

/// The element types the backend moves.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Elem {
    Bf16,
    F32,
}

impl Elem {
    fn dt(self) -> ncclDataType_t {
        match self {
            Elem::Bf16 => ncclDataType_t::ncclBfloat16,
            Elem::F32 => ncclDataType_t::ncclFloat32,
        }
    }

    /// Bytes of `count` elements, or `None` on overflow.
    fn bytes(self, count: usize) -> Option<u64> {
        let size = match self {
            Elem::Bf16 => 2,
            Elem::F32 => 4,
        };
        (count as u64).checked_mul(size)
    }
}

/// A stream as NCCL takes it.
fn cu(stream: &CudaStream) -> cudaStream_t {
    stream.cu_stream() as _
}

pub(crate) fn get_nccl_version() -> Result<c_int, NcclError> {
    let mut v = 0;
    // SAFETY: ncclGetVersion writes one int through a pointer to a local.
    res(unsafe { (api()?.get_version)(&mut v) })?;
    Ok(v)
}

pub(crate) fn get_uniqueid() -> Result<ncclUniqueId, NcclError> {
    let mut id = ncclUniqueId { internal: [0; 128] };
    // SAFETY: ncclGetUniqueId fills the 128-byte id it is given, a local.
    res(unsafe { (api()?.get_unique_id)(&mut id) })?;
    Ok(id)
}

pub(crate) fn group_start() -> Result<NcclStatus, NcclError> {
    // SAFETY: no arguments; NCCL tracks the group per thread.
    res(unsafe { (api()?.group_start)() })
}

pub(crate) fn group_end() -> Result<NcclStatus, NcclError> {
    // SAFETY: no arguments; ends the calling thread's group (NCCL reports an
    // unbalanced end as an error, which `res` returns).
    res(unsafe { (api()?.group_end)() })
}

/// A NUL-terminated string NCCL returned, or empty for null.
fn text(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: NCCL returns NUL-terminated strings that stay valid at least until
        // its next call on this thread (static ones for error codes); copied at once.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

/// NCCL's text for `r` (empty when unknown or NCCL is not bound).
pub(crate) fn error_string(r: ncclResult_t) -> String {
    match api() {
        // SAFETY: ncclGetErrorString takes any result code and returns a static
        // string (or null, which `text` handles).
        Ok(a) => text(unsafe { (a.get_error_string)(r) }),
        Err(_) => String::new(),
    }
}

/// An NCCL communicator: destroyed after a clean run ([`Comm::finish`]), aborted on
/// any early exit (`ncclCommDestroy` may wait for peers; `ncclCommAbort` never does).
pub(crate) struct Comm {
    raw: ncclComm_t,
    /// How many ranks it has (see the module's note).
    ranks: u64,
    finished: bool,
}

impl Comm {
    /// `ncclCommInitRank` for rank `rank` of `ranks`; the communicator is pushed onto
    /// `made` whenever NCCL returned one, also when the call (or, inside a group, the
    /// group's end) fails, so that the caller aborts it.
    pub(crate) fn init_rank(
        ranks: u64,
        id: ncclUniqueId,
        rank: u64,
        made: &mut Vec<Comm>,
    ) -> Result<NcclStatus, NcclError> {
        let (n, r) = match (c_int::try_from(ranks), c_int::try_from(rank)) {
            (Ok(n), Ok(r)) => (n, r),
            _ => return Err(NcclError(ncclResult_t::ncclInvalidArgument)),
        };
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: `raw` is a local NCCL writes; the id is a value.
        let r = res(unsafe { (api()?.comm_init_rank)(&mut raw, n, id, r) });
        if !raw.is_null() {
            made.push(Comm {
                raw,
                ranks,
                finished: false,
            });
        }
        r
    }

    /// `ncclCommSplit` of this communicator: the ranks passing the same `color`
    /// form a new one of `ranks` ranks, ordered by `key`.
    pub(crate) fn split(&self, color: u64, key: u64, ranks: u64) -> Result<Comm, NcclError> {
        let (c, k) = match (c_int::try_from(color), c_int::try_from(key)) {
            (Ok(c), Ok(k)) => (c, k),
            _ => return Err(NcclError(ncclResult_t::ncclInvalidArgument)),
        };
        let mut raw: ncclComm_t = std::ptr::null_mut();
        // SAFETY: a live parent communicator; `raw` is a local NCCL writes; a null
        // config asks for the parent's.
        res(unsafe { (api()?.comm_split)(self.raw, c, k, &mut raw, std::ptr::null_mut()) })?;
        Ok(Comm {
            raw,
            ranks,
            finished: false,
        })
    }

    /// Waits for `stream` and destroys the communicator.
    pub(crate) fn finish(&mut self, stream: &CudaStream) -> Result<(), CudaError> {
        stream.synchronize().map_err(crate::cuda::driver)?;
        self.finished = true;
        let destroy = |a: &Api| {
            // SAFETY: the communicator is live and its stream has finished; `finished`
            // keeps Drop from aborting it again.
            res(unsafe { (a.comm_destroy)(self.raw) })
        };
        api()
            .and_then(destroy)
            .map(|_| ())
            .map_err(crate::cuda::nccl_failed("ncclCommDestroy", None))
    }

    /// NCCL's last error on this communicator (empty where NCCL is older than 2.13).
    pub(crate) fn last_error(&self) -> String {
        match api().ok().and_then(|a| a.get_last_error) {
            // SAFETY: a live communicator (it is aborted or destroyed only by `self`).
            Some(f) => text(unsafe { f(self.raw) }),
            None => String::new(),
        }
    }

    /// `ncclAllReduce` of `count` elements from `send` into `recv`.
    pub(crate) fn all_reduce(
        &self,
        (send, recv): (DevSpan, DevSpan),
        count: usize,
        elem: Elem,
        stream: &CudaStream,
    ) -> Result<NcclStatus, NcclError> {
        let b = elem.bytes(count);
        if !send.holds(b) || !recv.holds(b) {
            return Err(too_small());
        }
        let (ps, pr) = (send.addr as *const c_void, recv.addr as *mut c_void);
        let sum = ncclRedOp_t::ncclSum;
        // SAFETY: both spans hold `count` elements (checked above) and live until the
        // stream has run the call; a live communicator and stream.
        res(unsafe { (api()?.all_reduce)(ps, pr, count, elem.dt(), sum, self.raw, cu(stream)) })
    }

    /// `ncclReduceScatter`: `recvcount` elements into `recv`, from `recvcount x
    /// ranks` in `send`.
    pub(crate) fn reduce_scatter(
        &self,
        (send, recv): (DevSpan, DevSpan),
        recvcount: usize,
        elem: Elem,
        stream: &CudaStream,
    ) -> Result<NcclStatus, NcclError> {
        let all = elem
            .bytes(recvcount)
            .and_then(|b| b.checked_mul(self.ranks));
        if !send.holds(all) || !recv.holds(elem.bytes(recvcount)) {
            return Err(too_small());
        }
        let (ps, pr) = (send.addr as *const c_void, recv.addr as *mut c_void);
        let sum = ncclRedOp_t::ncclSum;
        // SAFETY: `send` holds `recvcount x ranks` and `recv` `recvcount` elements
        // (checked above), live until the stream has run the call.
        res(unsafe {
            (api()?.reduce_scatter)(ps, pr, recvcount, elem.dt(), sum, self.raw, cu(stream))
        })
    }

    /// `ncclAllGather`: `sendcount` elements from `send`, `sendcount x ranks` into
    /// `recv`.
    pub(crate) fn all_gather(
        &self,
        (send, recv): (DevSpan, DevSpan),
        sendcount: usize,
        elem: Elem,
        stream: &CudaStream,
    ) -> Result<NcclStatus, NcclError> {
        let all = elem
            .bytes(sendcount)
            .and_then(|b| b.checked_mul(self.ranks));
        if !send.holds(elem.bytes(sendcount)) || !recv.holds(all) {
            return Err(too_small());
        }
        let (ps, pr) = (send.addr as *const c_void, recv.addr as *mut c_void);
        // SAFETY: `send` holds `sendcount` and `recv` `sendcount x ranks` elements
        // (checked above), live until the stream has run the call.
        res(unsafe { (api()?.all_gather)(ps, pr, sendcount, elem.dt(), self.raw, cu(stream)) })
    }

    /// `ncclSend` of `count` elements of `buf` to `peer`.
    pub(crate) fn send(
        &self,
        buf: DevSpan,
        count: usize,
        elem: Elem,
        peer: u64,
        stream: &CudaStream,
    ) -> Result<NcclStatus, NcclError> {
        let peer = c_int::try_from(peer).map_err(|_| too_small())?;
        if !buf.holds(elem.bytes(count)) {
            return Err(too_small());
        }
        let p = buf.addr as *const c_void;
        // SAFETY: `buf` holds `count` elements (checked above), live until the stream
        // has run the call.
        res(unsafe { (api()?.send)(p, count, elem.dt(), peer, self.raw, cu(stream)) })
    }

    /// `ncclRecv` of `count` elements into `buf` from `peer`.
    pub(crate) fn recv(
        &self,
        buf: DevSpan,
        count: usize,
        elem: Elem,
        peer: u64,
        stream: &CudaStream,
    ) -> Result<NcclStatus, NcclError> {
        let peer = c_int::try_from(peer).map_err(|_| too_small())?;
        if !buf.holds(elem.bytes(count)) {
            return Err(too_small());
        }
        let p = buf.addr as *mut c_void;
        // SAFETY: `buf` holds `count` elements (checked above), live until the stream
        // has run the call.
        res(unsafe { (api()?.recv)(p, count, elem.dt(), peer, self.raw, cu(stream)) })
    }
}

impl Drop for Comm {
    fn drop(&mut self) {
        if !self.finished {
            if let Ok(a) = api() {
                // SAFETY: a live communicator not yet destroyed; abort never waits.
                let _ = unsafe { (a.comm_abort)(self.raw) };
            }
        }
    }
}
