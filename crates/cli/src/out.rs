//! Printing that never panics. `println!` panics when standard output
//! cannot be written (a full disk, `>/dev/full`, a closed descriptor), and
//! `eprintln!` the same for standard error. Reports go through [`outln!`]
//! instead: the first failure is kept and the command ends with it, one
//! line and a non-zero status, after its work is done (the work is not
//! undone: a pack whose summary could not be printed has still packed).
//! Diagnostics go through [`errln!`], which drops what cannot be written:
//! there is nowhere else to say it. A closed pipe never gets here: SIGPIPE
//! ends the process first (see `signals::default_sigpipe`).

use std::fmt;
use std::io::{self, Write};
use std::os::fd::FromRawFd;
use std::sync::Mutex;

/// The first write to standard output that failed.
static FAILED: Mutex<Option<io::Error>> = Mutex::new(None);

/// Print a line on standard output, keeping the first failure.
#[macro_export]
macro_rules! outln {
    () => { $crate::out::stdout(format_args!("\n")) };
    ($($t:tt)*) => { $crate::out::stdout(format_args!("{}\n", format_args!($($t)*))) };
}

/// Print on standard output, keeping the first failure.
#[macro_export]
macro_rules! out {
    ($($t:tt)*) => { $crate::out::stdout(format_args!($($t)*)) };
}

/// Print a line on standard error, dropping it if that fails.
#[macro_export]
macro_rules! errln {
    () => { $crate::out::stderr(format_args!("\n")) };
    ($($t:tt)*) => { $crate::out::stderr(format_args!("{}\n", format_args!($($t)*))) };
}

/// Print on standard error, dropping it if that fails.
#[macro_export]
macro_rules! err {
    ($($t:tt)*) => { $crate::out::stderr(format_args!($($t)*)) };
}

/// Written straight to descriptor 1, not through `std::io::stdout()`,
/// which takes EBADF (a closed stdout, see
/// `signals::fill_closed_std_streams`) for success.
pub fn stdout(args: fmt::Arguments<'_>) {
    let text = args.to_string();
    // One writer at a time, so lines from threads do not interleave.
    let _one = LOCK.lock().unwrap_or_else(|p| p.into_inner());
    // SAFETY: descriptor 1 is open for the whole life of the process (the
    // runtime and `fill_closed_std_streams` see to it), and ManuallyDrop
    // never closes it.
    let mut fd1 = std::mem::ManuallyDrop::new(unsafe { std::fs::File::from_raw_fd(1) });
    if let Err(e) = fd1.write_all(text.as_bytes()) {
        keep(e);
    }
}

static LOCK: Mutex<()> = Mutex::new(());

pub fn stderr(args: fmt::Arguments<'_>) {
    let _ = io::stderr().lock().write_fmt(args);
}

fn keep(e: io::Error) {
    let mut failed = FAILED.lock().unwrap_or_else(|p| p.into_inner());
    failed.get_or_insert(e);
}

/// The first write to standard output that failed, if any.
pub fn finish() -> Option<io::Error> {
    FAILED.lock().unwrap_or_else(|p| p.into_inner()).take()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_first_failure_is_kept_and_given_once() {
        keep(io::Error::from_raw_os_error(libc::ENOSPC));
        keep(io::Error::from_raw_os_error(libc::EBADF));
        let e = FAILED.lock().unwrap().take();
        assert_eq!(e.and_then(|e| e.raw_os_error()), Some(libc::ENOSPC));
        assert!(FAILED.lock().unwrap().is_none());
    }
}
