//! Helpers shared by the crate's unit tests.

/// Runs `tool args` with `input` on stdin; `None` (after saying so) when
/// the tool is missing and we are not under CI.
pub(crate) fn run(tool: &str, args: &[&str], input: &[u8]) -> Option<Vec<u8>> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let child = Command::new(tool)
        .args(args)
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .spawn();
    let mut child = match child {
        Ok(c) => c,
        Err(e) => {
            assert!(
                std::env::var("CI").as_deref() != Ok("true"),
                "{tool} is required under CI: {e}"
            );
            eprintln!("skipping: {tool} not available ({e})");
            return None;
        }
    };
    let mut stdin = child.stdin.take().unwrap();
    let input = input.to_vec();
    let writer = std::thread::spawn(move || stdin.write_all(&input));
    let out = child.wait_with_output().unwrap();
    writer.join().unwrap().unwrap();
    assert!(out.status.success(), "{tool} {args:?} failed");
    Some(out.stdout)
}
