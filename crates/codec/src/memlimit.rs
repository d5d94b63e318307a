//! How much memory this process may use: the machine's, or its control
//! group's limit when that is lower (a container's), and the share of it
//! a decoder's buffers may take by default: half (xz takes a quarter for
//! threaded decompression). The buffers' bound is a worst case (a
//! parallel gunzip's whole-chunk buffers are counted full, 128 MiB each,
//! where os2.img's chunks fill a quarter of theirs), so half of the limit
//! for it leaves the rest to what a decode really touches. In a 1 GiB
//! control group os2.img's `gzip -6` then decodes on two workers with two
//! whole-chunk buffers (a quarter would have left none: every chunk
//! streamed, 0.68-0.72 s in another run): 0.47-0.55 s against 0.45-0.51 s with
//! no limit, peak RSS 312-326 MiB (147 MiB of it the input, mapped).
//!
//! Why hand-written: reading `/proc/self/cgroup` and one file of the
//! memory controller is a few lines; the crates that do it bring a whole
//! system-information layer with them.

use std::path::{Path, PathBuf};
use std::sync::OnceLock;

/// The memory limit is divided by this for a decoder's default budget.
pub const DEFAULT_SHARE: u64 = 2;

/// The memory this process may use: physical memory, or the limit of its
/// memory control group (v1 or v2, this group's or an ancestor's) when
/// lower; `None` when neither can be read. Read once per process.
pub fn limit() -> Option<u64> {
    static LIMIT: OnceLock<Option<u64>> = OnceLock::new();
    *LIMIT.get_or_init(read_limit)
}

fn read_limit() -> Option<u64> {
    let cgroup = std::fs::read_to_string("/proc/self/cgroup")
        .ok()
        .and_then(|s| {
            cgroup_limit(&s, Path::new("/sys/fs/cgroup"), |p| {
                std::fs::read_to_string(p).ok()
            })
        });
    match (physical(), cgroup) {
        (Some(p), Some(c)) => Some(p.min(c)),
        (p, c) => p.or(c),
    }
}

/// Half of [`limit`]: what a decoder's buffers may take when the user
/// says nothing.
pub fn default_budget() -> Option<u64> {
    limit().map(|l| l / DEFAULT_SHARE)
}

/// The budget a decode runs under: the one `given` (`unpack -M`), else
/// [`default_budget`].
pub fn budget(given: Option<u64>) -> Option<u64> {
    given.or_else(default_budget)
}

/// The machine's physical memory, as xz reads it for a limit in percent.
pub fn physical() -> Option<u64> {
    // SAFETY: sysconf reads a system constant; no memory is passed.
    let (pages, size) = unsafe {
        (
            libc::sysconf(libc::_SC_PHYS_PAGES),
            libc::sysconf(libc::_SC_PAGESIZE),
        )
    };
    let pages = u64::try_from(pages).ok()?;
    let size = u64::try_from(size).ok()?;
    pages.checked_mul(size).filter(|&b| b > 0)
}

/// The lowest memory limit on the path of this process's group, from the
/// text of `/proc/self/cgroup`, with `root` where the hierarchies are
/// mounted and `read` to read a file. A limit of `max` (v2) or one at or
/// above 2^62 (v1's "unlimited", a page-rounded `i64::MAX`) is none.
fn cgroup_limit(
    proc_cgroup: &str,
    root: &Path,
    read: impl Fn(&Path) -> Option<String>,
) -> Option<u64> {
    let mut best: Option<u64> = None;
    for line in proc_cgroup.lines() {
        let mut parts = line.splitn(3, ':');
        let (Some(id), Some(controllers), Some(path)) = (parts.next(), parts.next(), parts.next())
        else {
            continue;
        };
        let (dir, file) = if id == "0" && controllers.is_empty() {
            (root.join("unified"), "memory.max")
        } else if controllers.split(',').any(|c| c == "memory") {
            (root.join("memory"), "memory.limit_in_bytes")
        } else {
            continue;
        };
        // A v2-only machine mounts the unified hierarchy at the root.
        let dirs: Vec<PathBuf> = match file {
            "memory.max" => vec![dir, root.to_path_buf()],
            _ => vec![dir],
        };
        for base in dirs {
            let mut at = Some(Path::new(path.trim_start_matches('/')));
            while let Some(rel) = at {
                let value = read(&base.join(rel).join(file));
                if let Some(v) = value.as_deref().map(str::trim) {
                    if let Ok(n) = v.parse::<u64>() {
                        if n < 1 << 62 {
                            best = Some(best.map_or(n, |b| b.min(n)));
                        }
                    }
                }
                at = rel.parent();
            }
        }
    }
    best
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    fn files(entries: &[(&str, &str)]) -> impl Fn(&Path) -> Option<String> {
        let map: HashMap<PathBuf, String> = entries
            .iter()
            .map(|(p, v)| (PathBuf::from(p), v.to_string()))
            .collect();
        move |p: &Path| map.get(p).cloned()
    }

    #[test]
    fn a_v1_memory_group_limit_is_read_and_the_lowest_ancestor_wins() {
        let proc = "4:memory:/outer/inner\n3:cpuset:/\n0::/\n";
        let read = files(&[
            (
                "/cg/memory/outer/inner/memory.limit_in_bytes",
                "9223372036854771712\n",
            ),
            ("/cg/memory/outer/memory.limit_in_bytes", "536870912\n"),
            ("/cg/memory/memory.limit_in_bytes", "9223372036854771712\n"),
        ]);
        assert_eq!(cgroup_limit(proc, Path::new("/cg"), read), Some(512 << 20));
    }

    #[test]
    fn a_v2_limit_is_read_where_the_unified_hierarchy_is_mounted() {
        let proc = "0::/user.slice/job\n";
        let read = files(&[
            ("/cg/user.slice/job/memory.max", "max\n"),
            ("/cg/user.slice/memory.max", "1073741824\n"),
        ]);
        assert_eq!(cgroup_limit(proc, Path::new("/cg"), read), Some(1 << 30));
        let hybrid = files(&[("/cg/unified/user.slice/job/memory.max", "268435456")]);
        assert_eq!(
            cgroup_limit(proc, Path::new("/cg"), hybrid),
            Some(256 << 20)
        );
    }

    #[test]
    fn no_limit_and_unreadable_groups_are_none() {
        let proc = "4:memory:/a\n0::/\n";
        let read = files(&[("/cg/memory/a/memory.limit_in_bytes", "9223372036854771712")]);
        assert_eq!(cgroup_limit(proc, Path::new("/cg"), read), None);
        assert_eq!(cgroup_limit("garbage", Path::new("/cg"), files(&[])), None);
        assert_eq!(cgroup_limit("", Path::new("/cg"), files(&[])), None);
    }

    #[test]
    fn this_machine_has_a_limit() {
        let l = limit().expect("physical memory is readable on Linux");
        assert!(l >= 64 << 20, "{l}");
        assert_eq!(default_budget(), Some(l / DEFAULT_SHARE));
        assert_eq!(budget(None), default_budget());
        assert_eq!(budget(Some(5)), Some(5));
    }
}
