//! Ctrl-C and `kill` must not leave a half-written output behind: while a
//! temporary output file exists, SIGINT, SIGTERM, SIGHUP and SIGPIPE remove
//! it before the process dies of the signal as usual. A signal the caller
//! ignores (`nohup`) is left ignored, as gzip leaves it.
//!
//! A signal handler may only call async-signal-safe functions, so the path
//! is kept as a leaked C string behind an atomic pointer, and the handler
//! does nothing but `unlink`, restore the default action and re-raise.
//! SIGBUS, which a memory-mapped input raises when the file is cut short
//! under it, gets a one-line message and exit status 1 instead.

use std::ffi::{c_char, c_int, CString};
use std::os::unix::ffi::OsStrExt;
use std::path::Path;
use std::ptr;
use std::sync::atomic::{AtomicPtr, AtomicU8, Ordering};
use std::sync::Once;

static PENDING: AtomicPtr<c_char> = AtomicPtr::new(ptr::null_mut());
const SIGNALS: [c_int; 4] = [libc::SIGINT, libc::SIGTERM, libc::SIGHUP, libc::SIGPIPE];

extern "C" fn on_signal(sig: c_int) {
    let path = PENDING.swap(ptr::null_mut(), Ordering::SeqCst);
    // SAFETY: unlink, signal and raise are async-signal-safe; `path` is
    // null or a NUL-terminated string leaked by `register` and never freed
    // while it is published (`unregister` takes it out before freeing).
    unsafe {
        if !path.is_null() {
            libc::unlink(path);
        }
        libc::signal(sig, libc::SIG_DFL);
        libc::raise(sig);
    }
}

fn install() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        for sig in SIGNALS {
            // A signal the caller ignores stays ignored (`nohup gzip big`,
            // `trap '' INT` in a script's background job): it would not
            // have ended the run, so it must not end it now.
            if ignored(sig) {
                continue;
            }
            // SAFETY: `on_signal` is an `extern "C" fn(c_int)` that only
            // performs async-signal-safe calls.
            unsafe {
                libc::signal(sig, on_signal as *const () as libc::sighandler_t);
            }
        }
    });
}

/// Whether `sig` is ignored now (as inherited from the caller, for every
/// signal but SIGPIPE, which Rust's runtime ignores before `main`).
fn ignored(sig: c_int) -> bool {
    // SAFETY: sigaction with a null new action only reads the current
    // one into `old`, a zeroed plain C struct it fills.
    unsafe {
        let mut old: libc::sigaction = std::mem::zeroed();
        libc::sigaction(sig, ptr::null(), &mut old) == 0 && old.sa_sigaction == libc::SIG_IGN
    }
}

/// Remove `path` if a terminating signal arrives before [`unregister`].
pub fn register(path: &Path) {
    let Ok(c) = CString::new(path.as_os_str().as_bytes()) else {
        return;
    };
    install();
    let old = PENDING.swap(c.into_raw(), Ordering::SeqCst);
    free(old);
}

/// The temporary file is gone or renamed: stop guarding it.
pub fn unregister() {
    let old = PENDING.swap(ptr::null_mut(), Ordering::SeqCst);
    free(old);
}

fn free(p: *mut c_char) {
    if !p.is_null() {
        // SAFETY: every non-null pointer in PENDING came from
        // CString::into_raw and was swapped out exactly once.
        drop(unsafe { CString::from_raw(p) });
    }
}

extern "C" fn on_input_cut(_sig: c_int) {
    let path = PENDING.swap(ptr::null_mut(), Ordering::SeqCst);
    const MSG: &[u8] = b"cairn: the input file was cut short while it was being read\n";
    // SAFETY: unlink, write and _exit are async-signal-safe; `path` is as
    // in `on_signal`.
    unsafe {
        if !path.is_null() {
            libc::unlink(path);
        }
        libc::write(2, MSG.as_ptr().cast(), MSG.len());
        libc::_exit(1);
    }
}

/// For readers of memory-mapped input: a file cut shorter while mapped
/// raises SIGBUS on the lost pages. Say so in one line, remove the
/// temporary output, and exit with status 1 (instead of a core dump).
pub fn guard_mapped_input() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        // SAFETY: `on_input_cut` is an `extern "C" fn(c_int)` that only
        // performs async-signal-safe calls.
        unsafe {
            libc::signal(
                libc::SIGBUS,
                on_input_cut as *const () as libc::sighandler_t,
            );
        }
    });
}

static STOP: std::sync::atomic::AtomicBool = std::sync::atomic::AtomicBool::new(false);

extern "C" fn on_stop(_sig: c_int) {
    STOP.store(true, Ordering::SeqCst);
}

/// For servers: SIGINT and SIGTERM set the returned flag instead of
/// killing the process, so it can finish requests in flight and flush.
/// SIGPIPE is ignored (a client that vanished is an error on its socket).
pub fn stop_flag() -> &'static std::sync::atomic::AtomicBool {
    for sig in [libc::SIGINT, libc::SIGTERM] {
        // SAFETY: `on_stop` is an `extern "C" fn(c_int)` that only stores
        // to an atomic, which is async-signal-safe.
        unsafe {
            libc::signal(sig, on_stop as *const () as libc::sighandler_t);
        }
    }
    ignore_sigpipe();
    &STOP
}

/// A write to a closed pipe kills the process with SIGPIPE, quietly, as
/// in coreutils (`cairn unpack -c x.gz | head` ends with status 141).
pub fn default_sigpipe() {
    // SAFETY: SIG_DFL is a valid disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_DFL);
    }
}

/// Standard streams the process was started without (`cairn ... >&-`)
/// are reported when used, as gzip reports them (EBADF). Rust's runtime
/// opens /dev/null read-write in their place before `main`, so output
/// meant for a closed stdout vanished without a word. Which ones were
/// closed is seen before that, in [`CLOSED_AT_START`]'s constructor;
/// each gets /dev/null opened the wrong way round instead: standard input
/// for writing, the outputs for reading. (A /dev/null the caller opened,
/// read-write or not, as Python's `subprocess.DEVNULL` is, stays.)
pub fn fill_closed_std_streams() {
    let closed = CLOSED.load(Ordering::Relaxed);
    for (fd, flags) in [
        (0, libc::O_WRONLY),
        (1, libc::O_RDONLY),
        (2, libc::O_RDONLY),
    ] {
        if closed & (1 << fd) == 0 {
            continue;
        }
        // SAFETY: the path is a NUL-terminated literal; `new` is ours, put
        // in `fd`'s place by dup2 and then closed.
        unsafe {
            let new = libc::open(c"/dev/null".as_ptr(), flags);
            if new >= 0 {
                libc::dup2(new, fd);
                libc::close(new);
            }
        }
    }
}

/// Bit `fd` set: standard stream `fd` was closed when the process began.
static CLOSED: AtomicU8 = AtomicU8::new(0);

/// Runs before Rust's runtime fills closed standard streams with
/// /dev/null (the loader calls the executable's `.init_array` entries
/// before `main`, which starts the runtime).
extern "C" fn note_closed_std_streams() {
    let mut closed = 0u8;
    for fd in 0..3 {
        // SAFETY: F_GETFD only asks about a descriptor number.
        if unsafe { libc::fcntl(fd, libc::F_GETFD) } == -1 {
            closed |= 1 << fd;
        }
    }
    CLOSED.store(closed, Ordering::Relaxed);
}

#[used]
#[link_section = ".init_array"]
static CLOSED_AT_START: extern "C" fn() = note_closed_std_streams;

/// A write to a closed pipe or socket returns EPIPE, for code that talks
/// to a peer and must report that it went away.
pub fn ignore_sigpipe() {
    // SAFETY: SIG_IGN is a valid disposition for SIGPIPE.
    unsafe {
        libc::signal(libc::SIGPIPE, libc::SIG_IGN);
    }
}
