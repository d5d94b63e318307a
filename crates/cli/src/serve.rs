//! `cairn serve`: export repository images and plain files or devices
//! over NBD until SIGINT or SIGTERM.

use anyhow::{bail, Context, Result};
use cairn_blockdev::{BlockDev, FileDev, FileOptions};
use cairn_nbd::{Export, Listener, Server, ServerConfig};
use clap::Args;
use std::path::PathBuf;
use std::sync::Arc;

#[derive(Args, Debug)]
pub(crate) struct ServeArgs {
    /// Repository whose images are exported (read-only), also from $CAIRN_REPO.
    #[arg(long = "repo", env = "CAIRN_REPO", value_name = "REPO")]
    pub repo: Option<PathBuf>,
    /// Export this image (NAME: its latest snapshot; NAME@SNAPSHOT: that
    /// one), under that name; repeat for more. Default with --repo: every
    /// image's latest snapshot, named NAME.
    #[arg(long = "image", value_name = "NAME[@SNAPSHOT]")]
    pub images: Vec<String>,
    /// Export a file or block device: [NAME=]PATH[,ro][,direct]. The export
    /// is named NAME, or the file's name; `ro` refuses writes, `direct`
    /// uses O_DIRECT.
    #[arg(long = "file", value_name = "[NAME=]PATH[,ro][,direct]")]
    pub files: Vec<String>,
    /// TCP address to listen on (repeatable; default 127.0.0.1:10809
    /// unless --socket is given). Port 0 picks a free port.
    #[arg(long = "listen", value_name = "ADDR:PORT")]
    pub listen: Vec<String>,
    /// Unix socket to listen on (repeatable).
    #[arg(long = "socket", value_name = "PATH")]
    pub sockets: Vec<PathBuf>,
    /// Requests served at once per connection.
    #[arg(long = "workers", default_value_t = 8)]
    pub workers: usize,
    /// Cache of decompressed chunks per repository image (e.g. 256M).
    #[arg(long = "cache", value_parser = crate::parse_size, default_value = "256M")]
    pub cache: usize,
    /// Threads decoding ahead of sequential readers (default: cores).
    #[arg(short = 'T', long = "threads")]
    pub threads: Option<usize>,
    /// Log connections and protocol errors on stderr.
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
}

/// `[NAME=]PATH[,ro][,direct]`.
fn parse_file_spec(spec: &str) -> Result<(String, PathBuf, FileOptions)> {
    let mut parts = spec.split(',');
    let first = parts.next().unwrap_or_default();
    let mut opts = FileOptions::default();
    for p in parts {
        match p {
            "ro" => opts.read_only = true,
            "rw" => opts.read_only = false,
            "direct" => opts.direct = true,
            other => bail!("--file {spec:?}: unknown option {other:?} (ro, rw, direct)"),
        }
    }
    let (name, path) = match first.split_once('=') {
        Some((n, p)) => (n.to_string(), PathBuf::from(p)),
        None => {
            let path = PathBuf::from(first);
            let name = path
                .file_name()
                .map(|n| n.to_string_lossy().into_owned())
                .unwrap_or_default();
            (name, path)
        }
    };
    if path.as_os_str().is_empty() {
        bail!("--file {spec:?}: no path");
    }
    if name.is_empty() {
        bail!("--file {spec:?}: no export name");
    }
    Ok((name, path, opts))
}

pub(crate) fn serve(a: &ServeArgs) -> Result<()> {
    if a.workers == 0 || a.workers > 256 {
        bail!("--workers must be 1 to 256");
    }
    let mut exports: Vec<Export> = Vec::new();
    for spec in &a.files {
        let (name, path, opts) = parse_file_spec(spec)?;
        let dev = FileDev::open(&path, opts).with_context(|| format!("--file {spec}"))?;
        exports.push(Export {
            description: format!("file {}", path.display()),
            name,
            dev: Arc::new(dev) as Arc<dyn BlockDev>,
            read_only: opts.read_only,
        });
    }
    if let Some(repo) = &a.repo {
        crate::serve_repo::add_images(repo, &a.images, a.cache, a.threads, &mut exports)?;
    } else if !a.images.is_empty() {
        bail!("--image needs --repo (or CAIRN_REPO)");
    }
    if exports.is_empty() {
        bail!("nothing to export: give --file PATH or --repo REPO");
    }
    for (i, e) in exports.iter().enumerate() {
        if exports[..i].iter().any(|o| o.name == e.name) {
            bail!(
                "two exports are named {:?} (name files with --file NAME=PATH; give each --image once)",
                e.name
            );
        }
    }
    let mut listeners = Vec::new();
    for s in &a.sockets {
        listeners
            .push(Listener::unix(s.clone()).with_context(|| format!("listen on {}", s.display()))?);
    }
    let mut addrs = a.listen.clone();
    if addrs.is_empty() && a.sockets.is_empty() {
        addrs.push("127.0.0.1:10809".into());
    }
    for addr in &addrs {
        listeners.push(Listener::tcp(addr).with_context(|| format!("listen on {addr}"))?);
    }
    let stop = crate::signals::stop_flag();
    let names: Vec<String> = exports
        .iter()
        .map(|e| {
            format!(
                "{} ({} bytes{})",
                e.name,
                e.dev.size(),
                if e.is_read_only() { ", ro" } else { "" }
            )
        })
        .collect();
    let server = Server::new(
        exports,
        ServerConfig {
            workers: a.workers,
            verbose: a.verbose,
            ..ServerConfig::default()
        },
    );
    for l in &listeners {
        eprintln!("cairn serve: listening on {}", l.describe());
    }
    eprintln!("cairn serve: exports: {}", names.join(", "));
    let report = server.serve(&listeners, stop)?;
    if a.verbose {
        eprintln!(
            "cairn serve: stopped after {} connections ({} protocol errors)",
            report.connections, report.protocol_errors
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn file_specs() {
        let (n, p, o) = parse_file_spec("disk=/tmp/x.img,ro,direct").unwrap();
        assert_eq!((n.as_str(), p.to_str().unwrap()), ("disk", "/tmp/x.img"));
        assert!(o.read_only && o.direct);
        let (n, _, o) = parse_file_spec("/var/a.raw").unwrap();
        assert_eq!(n, "a.raw");
        assert!(!o.read_only);
        assert!(parse_file_spec("/a,bogus").is_err());
        assert!(parse_file_spec("x=").is_err());
        assert!(parse_file_spec("=/a").is_err());
    }
}
