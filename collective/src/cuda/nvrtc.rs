//! Compiling CUDA C with NVRTC, loaded at run time by path (the `nvidia-cuda-nvrtc` wheel or
//! the system's toolkit). Needs no GPU: the pack kernel's compilation is tested on CPU-only
//! machines that have the library.

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::sync::OnceLock;

use super::discover::Library;
use super::dylib::{open, symbol, Opened};
use crate::error::{Error, Result};

type Program = *mut c_void;

#[derive(Debug)]
struct Api {
    opened: Opened,
    version: unsafe extern "C" fn(*mut c_int, *mut c_int) -> c_int,
    error_string: unsafe extern "C" fn(c_int) -> *const c_char,
    create: unsafe extern "C" fn(
        *mut Program,
        *const c_char,
        *const c_char,
        c_int,
        *const *const c_char,
        *const *const c_char,
    ) -> c_int,
    compile: unsafe extern "C" fn(Program, c_int, *const *const c_char) -> c_int,
    log_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    log: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    cubin_size: unsafe extern "C" fn(Program, *mut usize) -> c_int,
    cubin: unsafe extern "C" fn(Program, *mut c_char) -> c_int,
    destroy: unsafe extern "C" fn(*mut Program) -> c_int,
}

static API: OnceLock<std::result::Result<Api, String>> = OnceLock::new();

fn load() -> Result<Api> {
    let opened = open(Library::Nvrtc)?;
    // SAFETY: the types are NVRTC's documented signatures.
    unsafe {
        Ok(Api {
            version: symbol(&opened, "nvrtcVersion")?,
            error_string: symbol(&opened, "nvrtcGetErrorString")?,
            create: symbol(&opened, "nvrtcCreateProgram")?,
            compile: symbol(&opened, "nvrtcCompileProgram")?,
            log_size: symbol(&opened, "nvrtcGetProgramLogSize")?,
            log: symbol(&opened, "nvrtcGetProgramLog")?,
            cubin_size: symbol(&opened, "nvrtcGetCUBINSize")?,
            cubin: symbol(&opened, "nvrtcGetCUBIN")?,
            destroy: symbol(&opened, "nvrtcDestroyProgram")?,
            opened,
        })
    }
}

fn api() -> Result<&'static Api> {
    API.get_or_init(|| load().map_err(|e| e.to_string()))
        .as_ref()
        .map_err(|e| Error::Cuda(e.clone()))
}

/// NVRTC's file and version (`"12.4"`), loading it on first use from the places
/// [`super::discover`] describes.
pub fn library() -> Result<(String, String)> {
    let api = api()?;
    let (mut major, mut minor) = (0, 0);
    // SAFETY: two valid out-pointers.
    let code = unsafe { (api.version)(&mut major, &mut minor) };
    check(api, code, "nvrtcVersion")?;
    Ok((api.opened.path.clone(), format!("{major}.{minor}")))
}

fn check(api: &Api, code: c_int, call: &str) -> Result<()> {
    if code == 0 {
        return Ok(());
    }
    // SAFETY: NVRTC returns a static string for every code.
    let text = unsafe { CStr::from_ptr((api.error_string)(code)) }.to_string_lossy();
    Err(Error::Cuda(format!(
        "{call} failed: {text} (NVRTC error {code})"
    )))
}

/// Compiles `source` with `options` into a CUBIN.
pub fn compile(source: &str, name: &str, options: &[String]) -> Result<Vec<u8>> {
    let api = api()?;
    let src = CString::new(source).map_err(|e| Error::Internal(format!("kernel source: {e}")))?;
    let file = CString::new(name).map_err(|e| Error::Internal(format!("kernel name: {e}")))?;
    let opts: Vec<CString> = options
        .iter()
        .map(|o| CString::new(o.as_str()))
        .collect::<std::result::Result<_, _>>()
        .map_err(|e| Error::Internal(format!("NVRTC option: {e}")))?;
    let ptrs: Vec<*const c_char> = opts.iter().map(|o| o.as_ptr()).collect();
    let mut prog: Program = std::ptr::null_mut();
    // SAFETY: valid NUL-terminated strings; no headers.
    let code = unsafe {
        (api.create)(
            &mut prog,
            src.as_ptr(),
            file.as_ptr(),
            0,
            std::ptr::null(),
            std::ptr::null(),
        )
    };
    check(api, code, "nvrtcCreateProgram")?;
    let result = (|| {
        let n = c_int::try_from(ptrs.len()).unwrap_or(c_int::MAX);
        // SAFETY: `prog` was created above; `ptrs` holds `n` valid strings.
        let compiled = unsafe { (api.compile)(prog, n, ptrs.as_ptr()) };
        if compiled != 0 {
            let mut size = 0usize;
            // SAFETY: `prog` is valid; `size` is an out-pointer.
            unsafe { (api.log_size)(prog, &mut size) };
            let mut log = vec![0u8; size.max(1)];
            // SAFETY: `log` has room for `size` bytes.
            unsafe { (api.log)(prog, log.as_mut_ptr().cast()) };
            let text = String::from_utf8_lossy(&log);
            return Err(Error::Cuda(format!(
                "NVRTC could not compile {name} ({options:?}): {}",
                text.trim_end_matches('\0').trim()
            )));
        }
        let mut size = 0usize;
        // SAFETY: `prog` compiled; `size` is an out-pointer.
        let code = unsafe { (api.cubin_size)(prog, &mut size) };
        check(api, code, "nvrtcGetCUBINSize")?;
        let mut cubin = vec![0u8; size];
        // SAFETY: `cubin` has room for `size` bytes.
        let code = unsafe { (api.cubin)(prog, cubin.as_mut_ptr().cast()) };
        check(api, code, "nvrtcGetCUBIN")?;
        Ok(cubin)
    })();
    // SAFETY: `prog` was created above and is destroyed once.
    unsafe { (api.destroy)(&mut prog) };
    result
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::cuda::kernel::{compile_options, KERNEL_NAME, SOURCE};

    /// Compiles the pack kernel for Turing through Hopper (CUDA 13 dropped Volta) when NVRTC is installed (the
    /// nvidia-cuda-nvrtc wheel of the dev environment); says so and passes when it is not.
    #[test]
    fn the_pack_kernel_compiles_for_every_supported_architecture() {
        crate::cuda::discover::tests::use_the_repository_venv();
        let Ok((path, version)) = library() else {
            eprintln!("NVRTC is not installed here; the kernel compile check did not run");
            return;
        };
        eprintln!("NVRTC {version} from {path}");
        for (major, minor) in [(7, 5), (8, 0), (9, 0)] {
            let cubin = compile(SOURCE, "kolo_pack.cu", &compile_options(major, minor))
                .unwrap_or_else(|e| panic!("sm_{major}{minor}: {e}"));
            assert_eq!(&cubin[..4], b"\x7fELF", "a CUBIN is an ELF image");
            let name = KERNEL_NAME.as_bytes();
            assert!(
                cubin.windows(name.len()).any(|w| w == name),
                "exports {KERNEL_NAME}"
            );
        }
        let err = compile("__global__ void f( {", "bad.cu", &compile_options(9, 0)).unwrap_err();
        assert!(
            err.to_string().contains("could not compile bad.cu"),
            "{err}"
        );
    }
}
