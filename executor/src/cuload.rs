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
//! backend makes are bound ([`crate::cuda::ffi::nccl`]) to the library this module
//! opened ([`with_opened`]), with cudarc's types. Every symbol is resolved when the
//! library is opened: one that is missing is one error naming the file and the symbol.
//!
//! The `unsafe` calls (opening a library, cudarc's probes) are in
//! [`crate::cuda::ffi`].

use std::path::PathBuf;
use std::sync::Mutex;

use libloading::os::unix::Library;

use crate::cuda::ffi::{cublas_present, driver_present, open_global};
use crate::culibs::{candidates, python_sites, Lib, NotFound, SearchEnv};
pub use crate::error::LoadError;

/// Libraries opened so far: which, from where (`None`: by name through the system
/// loader), and the handle that keeps it loaded.
static OPENED: Mutex<Vec<Opened>> = Mutex::new(Vec::new());

/// One opened library: which, from where, and its handle (kept, so never closed).
type Opened = (Lib, Option<PathBuf>, Option<Library>);

/// A loader error with its causes (dlerror's text), on one line.
pub(crate) fn one_line(e: impl std::error::Error) -> String {
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
        Lib::Driver => driver_present(),
        Lib::Cublas => cublas_present(),
        // NCCL is bound here, not through cudarc.
        Lib::Nccl => true,
    }
}

/// Calls `f` with where `lib` was opened from and its handle, where [`ensure`] kept
/// one (`None` otherwise).
pub(crate) fn with_opened<R>(
    lib: Lib,
    f: impl FnOnce(Option<&PathBuf>, &Library) -> R,
) -> Option<R> {
    let opened = OPENED.lock().unwrap_or_else(|p| p.into_inner());
    opened
        .iter()
        .find(|(l, _, _)| *l == lib)
        .and_then(|(_, from, handle)| handle.as_ref().map(|h| f(from.as_ref(), h)))
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
