//! Opening the CUDA libraries that [`crate::culibs`] finds, and the NCCL calls.
//!
//! # How a found file reaches cudarc
//!
//! cudarc opens each library itself, by name (`get_lib_name_candidates`: with the
//! `cuda-13000` feature `libcublas.so`, …, `libcublas.so.13`, `libcublas.so.12`, …,
//! `libcuda.so.1`), so it only finds what the system loader's path has. [`ensure`]
//! opens the file found (an absolute path) with `RTLD_NOW | RTLD_GLOBAL` and keeps it
//! open for the life of the process; glibc then answers cudarc's later `dlopen` of
//! the same soname (`libcublas.so.13`, `libcuda.so.1`) with the object already
//! loaded, without searching. [`ensure`] checks that it did (cudarc's
//! `is_culib_present`), so a soname cudarc does not try is an error naming the file,
//! not a later panic. A different `libcublas.so` on the loader's path would still be
//! the one cudarc opens first (its candidates start with the bare name).
//!
//! NCCL's file is `libnccl.so.2`, a name no cudarc candidate list has (it tries
//! `.so`, `.so.<CUDA major>`, `.so.12` … `.so.9`, `.so.1`), so the NCCL calls the
//! backend makes are bound here ([`nccl`]) to the library this module opened, with
//! cudarc's types. Every symbol is resolved when the library is opened: one that is
//! missing is one error naming the file and the symbol.

use std::path::PathBuf;
use std::sync::Mutex;

use libloading::os::unix::{Library, RTLD_GLOBAL, RTLD_NOW};

use crate::culibs::{candidates, python_sites, Lib, NotFound, SearchEnv};
pub use crate::error::LoadError;

/// Libraries opened so far: which, from where (`None`: by name through the system
/// loader), and the handle that keeps it loaded.
static OPENED: Mutex<Vec<Opened>> = Mutex::new(Vec::new());

/// One opened library: which, from where, and its handle (kept, so never closed).
type Opened = (Lib, Option<PathBuf>, Option<Library>);

/// A loader error with its causes (dlerror's text), on one line.
fn one_line(e: impl std::error::Error) -> String {
    let mut s = e.to_string();
    let mut cause = e.source();
    while let Some(c) = cause {
        s = format!("{s}: {c}");
        cause = c.source();
    }
    s.replace(['\n', '\r'], " ")
}

/// Whether cudarc's own loader opens `lib` by its candidate names.
fn cudarc_finds(lib: Lib) -> bool {
    match lib {
        // SAFETY: cudarc's probe only tries to dlopen its candidate file names and
        // returns whether one opened; it calls nothing inside the library.
        Lib::Driver => unsafe { cudarc::driver::sys::is_culib_present() },
        // SAFETY: as above, for cuBLAS.
        Lib::Cublas => unsafe { cudarc::cublas::sys::is_culib_present() },
        // NCCL is bound here, not through cudarc.
        Lib::Nccl => true,
    }
}

fn open_global(file: &std::ffi::OsStr) -> Result<Library, libloading::Error> {
    // SAFETY: opening runs the library's initialisers; the files opened here are the
    // CUDA, cuBLAS and NCCL libraries (or the test fakes) that the process is about to
    // use anyway, found by name in the directories `culibs` searched.
    unsafe { Library::open(Some(file), RTLD_NOW | RTLD_GLOBAL) }
}

/// Finds and opens `lib` once per process: `Ok(Some(path))` for a file found by
/// [`crate::culibs`], `Ok(None)` where only the system loader had it, `Err` with
/// one line saying what was tried. A failure is not remembered (the next call
/// searches again).
pub fn ensure(lib: Lib) -> Result<Option<PathBuf>, LoadError> {
    let mut opened = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    if let Some((_, from, _)) = opened.iter().find(|(l, _, _)| *l == lib) {
        return Ok(from.clone());
    }
    let mut env = SearchEnv::from_process();
    let (mut dirs, mut files) = candidates(lib, &env);
    if files.is_empty() && lib != Lib::Driver {
        env.python_sites = python_sites(&env);
        (dirs, files) = candidates(lib, &env);
    }
    let mut unloadable = Vec::new();
    for file in files {
        if lib == Lib::Cublas {
            // cuBLAS needs cuBLASLt of the same version, which wheels put beside it.
            let name = file.file_name().unwrap_or_default().to_string_lossy();
            let lt = file.with_file_name(name.replacen("libcublas", "libcublasLt", 1));
            if lt.is_file() {
                match open_global(lt.as_os_str()) {
                    Ok(l) => opened.push((lib, Some(lt), Some(l))),
                    Err(e) => {
                        unloadable.push(format!("{} did not load: {}", lt.display(), one_line(e)));
                        continue;
                    }
                }
            }
        }
        match open_global(file.as_os_str()) {
            Ok(l) if cudarc_finds(lib) => {
                opened.push((lib, Some(file.clone()), Some(l)));
                return Ok(Some(file));
            }
            Ok(_) => unloadable.push(format!(
                "{} loaded, but not under a name cudarc opens ({})",
                file.display(),
                cudarc_names(lib)
            )),
            Err(e) => unloadable.push(format!("{} did not load: {}", file.display(), one_line(e))),
        }
    }
    let by_name = match lib {
        Lib::Nccl => ["libnccl.so.2", "libnccl.so"]
            .iter()
            .find_map(|n| open_global(n.as_ref()).ok()),
        _ => None,
    };
    if by_name.is_some() || (lib != Lib::Nccl && cudarc_finds(lib)) {
        opened.push((lib, None, by_name));
        return Ok(None);
    }
    Err(LoadError::NotFound(NotFound {
        lib,
        dirs,
        unloadable,
        system_loader: true,
    }))
}

/// The names cudarc tries for `lib` (for messages).
fn cudarc_names(lib: Lib) -> String {
    let stem = match lib {
        Lib::Driver => "cuda",
        Lib::Cublas => "cublas",
        Lib::Nccl => "nccl",
    };
    let mut names: Vec<String> = Vec::new();
    for n in cudarc::get_lib_name_candidates(stem) {
        if n.starts_with(&format!("lib{stem}.so")) && !names.contains(&n) {
            names.push(n);
        }
    }
    names.join(", ")
}

/// The NCCL calls the backend makes, with cudarc's `nccl::result` signatures, bound
/// to the library [`ensure`]`(Lib::Nccl)` opened. Before that succeeds every call
/// returns `ncclInvalidUsage`.
pub mod nccl {
    use std::ffi::{c_char, c_int, c_void};
    use std::sync::OnceLock;

    pub use cudarc::nccl::result::{NcclError, NcclStatus};
    use cudarc::nccl::sys::{
        cudaStream_t, ncclComm_t, ncclConfig_t, ncclDataType_t, ncclRedOp_t, ncclResult_t,
        ncclUniqueId,
    };

    use super::{one_line, Lib, LoadError, OPENED};

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
    pub(crate) struct Api {
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

    static API: OnceLock<Result<Api, LoadError>> = OnceLock::new();

    /// The function `name` in `lib` (opened from `from`), or one line saying it is missing.
    fn sym<T: Copy>(lib: &super::Library, from: &str, name: &'static str) -> Result<T, LoadError> {
        // SAFETY: `T` is the function-pointer type NCCL's header (nccl.h, 2.18+) gives
        // `name`; `Api` declares each one, and the pointer is used only while `lib`,
        // kept open in `OPENED` for the life of the process, is loaded.
        let f = unsafe { lib.get::<T>(format!("{name}\0").as_bytes()) }.map_err(|e| {
            LoadError::NoSymbol {
                file: from.to_string(),
                symbol: name,
                detail: one_line(e),
            }
        })?;
        Ok(*f)
    }

    /// Resolves NCCL's symbols in the library [`super::ensure`] opened (once).
    pub(crate) fn bind() -> Result<&'static Api, LoadError> {
        super::ensure(Lib::Nccl)?;
        API.get_or_init(|| {
            let opened = OPENED.lock().unwrap_or_else(|p| p.into_inner());
            let (from, lib) = opened
                .iter()
                .find(|(l, _, _)| *l == Lib::Nccl)
                .and_then(|(_, from, lib)| lib.as_ref().map(|lib| (from, lib)))
                .ok_or(LoadError::NcclNotOpened)?;
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
        .as_ref()
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

    pub fn get_nccl_version() -> Result<c_int, NcclError> {
        let mut v = 0;
        // SAFETY: ncclGetVersion writes one int through a valid pointer.
        res(unsafe { (api()?.get_version)(&mut v) })?;
        Ok(v)
    }

    pub fn get_uniqueid() -> Result<ncclUniqueId, NcclError> {
        let mut id = ncclUniqueId { internal: [0; 128] };
        // SAFETY: ncclGetUniqueId fills the 128-byte id it is given.
        res(unsafe { (api()?.get_unique_id)(&mut id) })?;
        Ok(id)
    }

    /// # Safety
    /// `comm` must be valid for a write; NCCL's contract for the rest.
    pub unsafe fn comm_init_rank(
        comm: *mut ncclComm_t,
        nranks: c_int,
        id: ncclUniqueId,
        rank: c_int,
    ) -> Result<NcclStatus, NcclError> {
        res((api()?.comm_init_rank)(comm, nranks, id, rank))
    }

    /// # Safety
    /// NCCL's contract for `ncclCommSplit`.
    pub unsafe fn comm_split(
        comm: ncclComm_t,
        color: c_int,
        key: c_int,
        newcomm: *mut ncclComm_t,
        config: *mut ncclConfig_t,
    ) -> Result<NcclStatus, NcclError> {
        res((api()?.comm_split)(comm, color, key, newcomm, config))
    }

    /// # Safety
    /// `comm` must be a live communicator.
    pub unsafe fn comm_destroy(comm: ncclComm_t) -> Result<NcclStatus, NcclError> {
        res((api()?.comm_destroy)(comm))
    }

    /// # Safety
    /// `comm` must be a live communicator.
    pub unsafe fn comm_abort(comm: ncclComm_t) -> Result<NcclStatus, NcclError> {
        res((api()?.comm_abort)(comm))
    }

    /// # Safety
    /// NCCL's contract: device buffers of `count` elements on `comm`'s device.
    pub unsafe fn all_reduce(
        send: *const c_void,
        recv: *mut c_void,
        count: usize,
        dt: ncclDataType_t,
        op: ncclRedOp_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> Result<NcclStatus, NcclError> {
        res((api()?.all_reduce)(send, recv, count, dt, op, comm, stream))
    }

    /// # Safety
    /// NCCL's contract: `recv` holds `recvcount`, `send` `recvcount x ranks` elements.
    pub unsafe fn reduce_scatter(
        send: *const c_void,
        recv: *mut c_void,
        recvcount: usize,
        dt: ncclDataType_t,
        op: ncclRedOp_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> Result<NcclStatus, NcclError> {
        res((api()?.reduce_scatter)(
            send, recv, recvcount, dt, op, comm, stream,
        ))
    }

    /// # Safety
    /// NCCL's contract: `send` holds `sendcount`, `recv` `sendcount x ranks` elements.
    pub unsafe fn all_gather(
        send: *const c_void,
        recv: *mut c_void,
        sendcount: usize,
        dt: ncclDataType_t,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> Result<NcclStatus, NcclError> {
        res((api()?.all_gather)(send, recv, sendcount, dt, comm, stream))
    }

    /// # Safety
    /// NCCL's contract: a device buffer of `count` elements.
    pub unsafe fn send(
        buf: *const c_void,
        count: usize,
        dt: ncclDataType_t,
        peer: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> Result<NcclStatus, NcclError> {
        res((api()?.send)(buf, count, dt, peer, comm, stream))
    }

    /// # Safety
    /// NCCL's contract: a device buffer of `count` elements.
    pub unsafe fn recv(
        buf: *mut c_void,
        count: usize,
        dt: ncclDataType_t,
        peer: c_int,
        comm: ncclComm_t,
        stream: cudaStream_t,
    ) -> Result<NcclStatus, NcclError> {
        res((api()?.recv)(buf, count, dt, peer, comm, stream))
    }

    pub fn group_start() -> Result<NcclStatus, NcclError> {
        // SAFETY: no arguments; NCCL tracks the group per thread.
        res(unsafe { (api()?.group_start)() })
    }

    pub fn group_end() -> Result<NcclStatus, NcclError> {
        // SAFETY: no arguments; ends the calling thread's group (NCCL reports an
        // unbalanced end as an error, which `res` returns).
        res(unsafe { (api()?.group_end)() })
    }

    /// NCCL's text for `r` (empty when unknown or NCCL is not bound).
    pub fn error_string(r: ncclResult_t) -> *const c_char {
        match api() {
            // SAFETY: ncclGetErrorString takes any result code and returns a static
            // string (or null), which the caller reads only if non-null.
            Ok(a) => unsafe { (a.get_error_string)(r) },
            Err(_) => std::ptr::null(),
        }
    }

    /// NCCL's last error on `comm` (null where NCCL is older than 2.13).
    ///
    /// # Safety
    /// `comm` must be a live communicator.
    pub unsafe fn last_error(comm: ncclComm_t) -> *const c_char {
        match api().ok().and_then(|a| a.get_last_error) {
            Some(f) => f(comm),
            None => std::ptr::null(),
        }
    }
}
