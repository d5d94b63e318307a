//! xz's custom filter chains: what `xz --x86 --lzma2=dict=32MiB` (and
//! `--arm`, `--delta=dist=4`, `--lzma1=...`) or xz 5.6's `--filters="x86
//! lzma2:dict=32MiB"` ask for, parsed as xz parses them, and built into a
//! liblzma filter chain for each block, with the filter flags an xz block
//! header carries for them.
//!
//! A chain is one to four filters, the last LZMA1 or LZMA2 and only the
//! last: BCJ filters (x86, PowerPC, IA-64, ARM, ARM-Thumb, SPARC, ARM64,
//! RISC-V; option `start=N`) and delta (`dist=N`, 1-256) go before it.
//! LZMA options start from a preset (`preset=N[e]`, 6 by default) and
//! override what they name: `dict`, `lc`, `lp`, `pb`, `mode`, `nice`,
//! `mf`, `depth`.

use crate::block::lzma2_dict_size;
use crate::error::{CodecError, Result};
use liblzma::stream::{Filters, LzmaOptions, MatchFinder, Mode, PRESET_EXTREME};

/// A branch/call/jump converter for one instruction set.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Bcj {
    /// x86 (32-bit and 64-bit).
    X86,
    /// PowerPC (big endian).
    PowerPc,
    /// IA-64 (Itanium).
    Ia64,
    /// ARM.
    Arm,
    /// ARM-Thumb.
    ArmThumb,
    /// SPARC.
    Sparc,
    /// ARM64.
    Arm64,
    /// RISC-V.
    RiscV,
}

impl Bcj {
    const ALL: [Bcj; 8] = [
        Bcj::X86,
        Bcj::PowerPc,
        Bcj::Ia64,
        Bcj::Arm,
        Bcj::ArmThumb,
        Bcj::Sparc,
        Bcj::Arm64,
        Bcj::RiscV,
    ];

    /// xz's option name (`--x86`).
    pub fn name(self) -> &'static str {
        match self {
            Bcj::X86 => "x86",
            Bcj::PowerPc => "powerpc",
            Bcj::Ia64 => "ia64",
            Bcj::Arm => "arm",
            Bcj::ArmThumb => "armthumb",
            Bcj::Sparc => "sparc",
            Bcj::Arm64 => "arm64",
            Bcj::RiscV => "riscv",
        }
    }

    /// The filter id in an xz block header.
    fn id(self) -> u64 {
        match self {
            Bcj::X86 => 0x04,
            Bcj::PowerPc => 0x05,
            Bcj::Ia64 => 0x06,
            Bcj::Arm => 0x07,
            Bcj::ArmThumb => 0x08,
            Bcj::Sparc => 0x09,
            Bcj::Arm64 => 0x0a,
            Bcj::RiscV => 0x0b,
        }
    }
}

/// LZMA1 or LZMA2 options: a preset (with xz's extreme flag) and what
/// overrides it.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Lzma {
    /// 0-9, `| PRESET_EXTREME` for `preset=Ne`.
    pub preset: u32,
    /// Dictionary size (`dict=`).
    pub dict: Option<u32>,
    /// Literal context bits (`lc=`).
    pub lc: Option<u32>,
    /// Literal position bits (`lp=`).
    pub lp: Option<u32>,
    /// Position bits (`pb=`).
    pub pb: Option<u32>,
    /// `mode=fast` (true) or `mode=normal`.
    pub fast: Option<bool>,
    /// Nice length of a match (`nice=`).
    pub nice: Option<u32>,
    /// Match finder (`mf=`), as liblzma numbers them.
    pub mf: Option<u8>,
    /// Search depth (`depth=`; 0 automatic).
    pub depth: Option<u32>,
}

impl Lzma {
    /// Preset `level` (extreme if `extreme`), nothing overridden.
    pub fn preset(level: u32, extreme: bool) -> Lzma {
        Lzma {
            preset: level | if extreme { PRESET_EXTREME } else { 0 },
            dict: None,
            lc: None,
            lp: None,
            pb: None,
            fast: None,
            nice: None,
            mf: None,
            depth: None,
        }
    }

    /// The dictionary size these options give.
    pub fn dict_size(&self) -> u32 {
        self.dict
            .unwrap_or_else(|| lzma2_dict_size((self.preset & 0x1f) as i32))
    }

    /// As liblzma takes them, the dictionary at most `max_dict` bytes.
    pub fn options(&self, max_dict: u32) -> Result<LzmaOptions> {
        let mut o = LzmaOptions::new_preset(self.preset).map_err(|e| CodecError::Compress {
            codec: "xz",
            reason: format!("preset {}: {e}", self.preset & 0x1f),
        })?;
        o.dict_size(self.dict_size().min(max_dict.max(4096)));
        if let Some(v) = self.lc {
            o.literal_context_bits(v);
        }
        if let Some(v) = self.lp {
            o.literal_position_bits(v);
        }
        if let Some(v) = self.pb {
            o.position_bits(v);
        }
        if let Some(fast) = self.fast {
            o.mode(if fast { Mode::Fast } else { Mode::Normal });
        }
        if let Some(v) = self.nice {
            o.nice_len(v);
        }
        if let Some(mf) = self.mf {
            o.match_finder(match mf {
                0x03 => MatchFinder::HashChain3,
                0x04 => MatchFinder::HashChain4,
                0x12 => MatchFinder::BinaryTree2,
                0x13 => MatchFinder::BinaryTree3,
                _ => MatchFinder::BinaryTree4,
            });
        }
        if let Some(v) = self.depth {
            o.depth(v);
        }
        Ok(o)
    }

    /// Parse xz's LZMA options (`preset=9e,dict=32MiB,lc=4,...`), in
    /// order: a preset resets what came before it.
    fn parse(opts: &str) -> std::result::Result<Lzma, String> {
        let mut l = Lzma::preset(6, false);
        for (key, value) in pairs(opts)? {
            let num = |lo: u32, hi: u32| number(key, value, lo, hi);
            match key {
                "preset" => {
                    let (digits, extreme) = match value.strip_suffix('e') {
                        Some(d) => (d, true),
                        None => (value, false),
                    };
                    let level = match digits.parse::<u32>() {
                        Ok(n) if n <= 9 && digits.len() == 1 => n,
                        _ => return Err(format!("unsupported LZMA preset: {value}")),
                    };
                    l = Lzma::preset(level, extreme);
                }
                "dict" => l.dict = Some(num(4096, 1536 << 20)?),
                "lc" => l.lc = Some(num(0, 4)?),
                "lp" => l.lp = Some(num(0, 4)?),
                "pb" => l.pb = Some(num(0, 4)?),
                "mode" => {
                    l.fast = Some(match value {
                        "fast" => true,
                        "normal" => false,
                        _ => {
                            return Err(format!(
                                "{key}: unsupported value {value:?} (fast, normal)"
                            ))
                        }
                    })
                }
                "nice" => l.nice = Some(num(2, 273)?),
                "mf" => {
                    l.mf = Some(match value {
                        "hc3" => 0x03,
                        "hc4" => 0x04,
                        "bt2" => 0x12,
                        "bt3" => 0x13,
                        "bt4" => 0x14,
                        _ => {
                            return Err(format!(
                            "{key}: unsupported match finder {value:?} (hc3, hc4, bt2, bt3, bt4)"
                        ))
                        }
                    })
                }
                "depth" => l.depth = Some(num(0, u32::MAX)?),
                _ => return Err(format!("{key}: invalid option name")),
            }
        }
        if l.lc.unwrap_or(3) + l.lp.unwrap_or(0) > 4 {
            return Err("the sum of lc and lp must not exceed 4".into());
        }
        Ok(l)
    }
}

impl std::fmt::Display for Lzma {
    /// As xz's LZMA options, the preset first (it resets the others):
    /// `preset=9e,dict=8388608,mode=fast`: every option given, so that
    /// xz's option parser reads back the same options.
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let extreme = if self.preset & PRESET_EXTREME != 0 {
            "e"
        } else {
            ""
        };
        write!(f, "preset={}{extreme}", self.preset & 0x1f)?;
        for (key, v) in [
            ("dict", self.dict),
            ("lc", self.lc),
            ("lp", self.lp),
            ("pb", self.pb),
            ("nice", self.nice),
            ("depth", self.depth),
        ] {
            if let Some(v) = v {
                write!(f, ",{key}={v}")?;
            }
        }
        if let Some(fast) = self.fast {
            write!(f, ",mode={}", if fast { "fast" } else { "normal" })?;
        }
        if let Some(mf) = self.mf {
            let name = match mf {
                0x03 => "hc3",
                0x04 => "hc4",
                0x12 => "bt2",
                0x13 => "bt3",
                _ => "bt4",
            };
            write!(f, ",mf={name}")?;
        }
        Ok(())
    }
}

/// One filter of a chain.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Filter {
    /// A BCJ filter and its start offset.
    Bcj(Bcj, u32),
    /// Delta over bytes `dist` apart (1-256).
    Delta(u32),
    /// LZMA1 (the `.lzma` format's).
    Lzma1(Lzma),
    /// LZMA2 (the `.xz` format's).
    Lzma2(Lzma),
}

impl Filter {
    /// The filter xz's option `--NAME[=OPTS]` adds (`name` without the
    /// dashes); `None` when `name` is no filter's.
    pub fn from_option(
        name: &str,
        opts: Option<&str>,
    ) -> Option<std::result::Result<Filter, String>> {
        let opts = opts.unwrap_or("");
        let filter = if let Some(bcj) = Bcj::ALL.into_iter().find(|b| b.name() == name) {
            single(opts, "start", 0, u32::MAX).map(|n| Filter::Bcj(bcj, n.unwrap_or(0)))
        } else {
            match name {
                "delta" => single(opts, "dist", 1, 256).map(|n| Filter::Delta(n.unwrap_or(1))),
                "lzma1" => Lzma::parse(opts).map(Filter::Lzma1),
                "lzma2" => Lzma::parse(opts).map(Filter::Lzma2),
                _ => return None,
            }
        };
        Some(filter.map_err(|e| format!("--{name}: {e}")))
    }

    /// Its name, as xz's option has it.
    pub fn name(&self) -> &'static str {
        match self {
            Filter::Bcj(b, _) => b.name(),
            Filter::Delta(_) => "delta",
            Filter::Lzma1(_) => "lzma1",
            Filter::Lzma2(_) => "lzma2",
        }
    }
}

/// `key=value` pairs of a comma-separated option list.
fn pairs(opts: &str) -> std::result::Result<Vec<(&str, &str)>, String> {
    opts.split(',')
        .filter(|p| !p.is_empty())
        .map(|p| {
            p.split_once('=').ok_or_else(|| {
                format!("{p}: options must be name=value pairs separated with commas")
            })
        })
        .collect()
}

/// The one option `key` a BCJ or delta filter takes, if given.
fn single(opts: &str, key: &str, lo: u32, hi: u32) -> std::result::Result<Option<u32>, String> {
    let mut found = None;
    for (k, v) in pairs(opts)? {
        if k != key {
            return Err(format!("{k}: invalid option name ({key} only)"));
        }
        found = Some(number(k, v, lo, hi)?);
    }
    Ok(found)
}

/// A size as xz reads one: digits and an optional binary suffix (KiB,
/// Ki, k, kB, K, KB, and so on for M and G); `None` if it is none, or
/// overflows.
pub fn xz_number(value: &str) -> Option<u64> {
    let at = value
        .find(|c: char| !c.is_ascii_digit())
        .unwrap_or(value.len());
    let (digits, suffix) = value.split_at(at);
    let shift = match suffix {
        "" => 0,
        "k" | "kB" | "K" | "KB" | "Ki" | "KiB" => 10,
        "M" | "MB" | "Mi" | "MiB" | "m" | "mB" => 20,
        "G" | "GB" | "Gi" | "GiB" | "g" | "gB" => 30,
        _ => return None,
    };
    let n = digits.parse::<u64>().ok()?;
    n.checked_mul(1 << shift)
}

/// An option's number ([`xz_number`]) within `lo..=hi`.
fn number(key: &str, value: &str, lo: u32, hi: u32) -> std::result::Result<u32, String> {
    xz_number(value)
        .and_then(|v| u32::try_from(v).ok())
        .filter(|v| (lo..=hi).contains(v))
        .ok_or_else(|| {
            format!("{key}={value}: the value must be an integer from {lo} to {hi} (suffixes KiB, MiB, GiB)")
        })
}

/// Most filters in a chain (xz's and liblzma's limit).
pub const MAX_FILTERS: usize = 4;

/// A filter chain: up to four filters, LZMA1 or LZMA2 last.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct FilterChain {
    filters: [Option<Filter>; MAX_FILTERS],
}

impl FilterChain {
    /// The chain of `filters`, checked as xz checks one.
    pub fn new(filters: &[Filter]) -> std::result::Result<FilterChain, String> {
        let Some((last, before)) = filters.split_last() else {
            return Err("an empty filter chain".into());
        };
        if filters.len() > MAX_FILTERS {
            return Err(format!("at most {MAX_FILTERS} filters can be used"));
        }
        if !matches!(last, Filter::Lzma1(_) | Filter::Lzma2(_)) {
            return Err(format!(
                "the filter chain must end with LZMA1 or LZMA2, not {}",
                last.name()
            ));
        }
        if let Some(f) = before
            .iter()
            .find(|f| matches!(f, Filter::Lzma1(_) | Filter::Lzma2(_)))
        {
            return Err(format!(
                "{} can only be the last filter of the chain",
                f.name()
            ));
        }
        let mut chain = FilterChain {
            filters: [None; MAX_FILTERS],
        };
        for (slot, f) in chain.filters.iter_mut().zip(filters) {
            *slot = Some(*f);
        }
        Ok(chain)
    }

    /// Parse a chain as xz 5.6's `--filters` and liblzma's
    /// `lzma_str_to_filters` write one: filters separated by spaces or
    /// `--`, each `NAME` or `NAME:OPTS` (or `NAME=OPTS`).
    pub fn parse(s: &str) -> std::result::Result<FilterChain, String> {
        let mut filters = Vec::new();
        for word in s
            .split(|c: char| c.is_whitespace())
            .flat_map(|w| w.split("--"))
        {
            if word.is_empty() {
                continue;
            }
            let (name, opts) = match word.split_once([':', '=']) {
                Some((n, o)) => (n, Some(o)),
                None => (word, None),
            };
            let f = Filter::from_option(name, opts)
                .ok_or_else(|| format!("{name}: unknown filter name"))??;
            filters.push(f);
        }
        FilterChain::new(&filters)
    }

    /// The filters, in order.
    pub fn filters(&self) -> impl Iterator<Item = &Filter> {
        self.filters.iter().flatten()
    }

    /// The last filter's LZMA options, and whether it is LZMA2.
    pub fn lzma(&self) -> (Lzma, bool) {
        match self.filters().last() {
            Some(Filter::Lzma2(l)) => (*l, true),
            Some(Filter::Lzma1(l)) => (*l, false),
            // `new` makes every chain end with one.
            _ => (Lzma::preset(6, false), true),
        }
    }

    /// The chain with its LZMA dictionary set to `dict` bytes.
    pub fn with_dict(&self, dict: u32) -> FilterChain {
        let mut chain = *self;
        if let Some(Filter::Lzma1(l) | Filter::Lzma2(l)) = chain.filters.iter_mut().flatten().last()
        {
            l.dict = Some(dict);
        }
        chain
    }

    /// Refuse a chain the `.xz` format cannot hold (LZMA1), as xz does.
    pub fn for_xz(&self) -> Result<()> {
        match self.lzma() {
            (_, true) => Ok(()),
            _ => Err(CodecError::Invalid(
                "LZMA1 cannot be used with the .xz format (use --lzma2)".into(),
            )),
        }
    }

    /// Refuse a chain the `.lzma` format cannot hold: LZMA1 alone.
    pub fn for_lzma(&self) -> Result<Lzma> {
        match (self.filters().count(), self.lzma()) {
            (1, (l, false)) => Ok(l),
            _ => Err(CodecError::Invalid(
                "the .lzma format supports only the LZMA1 filter (--lzma1)".into(),
            )),
        }
    }

    /// The liblzma chain, the LZMA dictionary at most `max_dict` bytes.
    pub fn build(&self, max_dict: u32) -> Result<Filters> {
        let mut f = Filters::new();
        for filter in self.filters() {
            match filter {
                Filter::Bcj(bcj, start) => {
                    let props = start.to_le_bytes();
                    let r = match bcj {
                        Bcj::X86 => f.x86_properties(&props),
                        Bcj::PowerPc => f.powerpc_properties(&props),
                        Bcj::Ia64 => f.ia64_properties(&props),
                        Bcj::Arm => f.arm_properties(&props),
                        Bcj::ArmThumb => f.arm_thumb_properties(&props),
                        Bcj::Sparc => f.sparc_properties(&props),
                        Bcj::Arm64 => f.arm64_properties(&props),
                        Bcj::RiscV => f.riscv_properties(&props),
                    };
                    r.map_err(|e| CodecError::Invalid(format!("--{}: {e}", bcj.name())))?;
                }
                Filter::Delta(dist) => {
                    let props = [u8::try_from(dist - 1).unwrap_or(u8::MAX)];
                    f.delta_properties(&props)
                        .map_err(|e| CodecError::Invalid(format!("--delta: {e}")))?;
                }
                Filter::Lzma1(l) => {
                    f.lzma1(&l.options(max_dict)?);
                }
                Filter::Lzma2(l) => {
                    f.lzma2(&l.options(max_dict)?);
                }
            }
        }
        Ok(f)
    }

    /// The filter flags of an xz block header for the filters before the
    /// LZMA2 one (whose flags the caller writes, knowing the dictionary):
    /// id, size of the properties, properties.
    pub fn header_flags(&self, out: &mut Vec<u8>) {
        for filter in self.filters() {
            match *filter {
                Filter::Bcj(bcj, start) => {
                    out.push(bcj.id() as u8);
                    if start == 0 {
                        out.push(0);
                    } else {
                        out.push(4);
                        out.extend_from_slice(&start.to_le_bytes());
                    }
                }
                Filter::Delta(dist) => {
                    out.extend_from_slice(&[0x03, 1, u8::try_from(dist - 1).unwrap_or(u8::MAX)])
                }
                Filter::Lzma1(_) | Filter::Lzma2(_) => {}
            }
        }
    }

    /// How many filters.
    pub fn len(&self) -> usize {
        self.filters().count()
    }

    /// Never: a chain has one filter at least.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }
}

impl std::fmt::Display for FilterChain {
    /// As xz's options: `--x86 --lzma2=dict=32MiB` (the options given).
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let words: Vec<String> = self
            .filters()
            .map(|filter| match filter {
                Filter::Bcj(b, 0) => format!("--{}", b.name()),
                Filter::Bcj(b, s) => format!("--{}=start={s}", b.name()),
                Filter::Delta(d) => format!("--delta=dist={d}"),
                Filter::Lzma1(l) | Filter::Lzma2(l) => format!("--{}={l}", filter.name()),
            })
            .collect();
        f.write_str(&words.join(" "))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn opt(name: &str, opts: &str) -> std::result::Result<Filter, String> {
        Filter::from_option(name, Some(opts)).unwrap_or_else(|| Err("no such filter".into()))
    }

    #[test]
    fn lzma_options_are_written_as_they_are_read() {
        for opts in [
            "preset=9,mode=fast",
            "preset=1",
            "preset=6e,dict=32MiB,lc=4,lp=0,pb=0,mode=normal,nice=273,mf=hc4,depth=8",
            "dict=1MiB",
        ] {
            let l = Lzma::parse(opts).unwrap();
            assert_eq!(Lzma::parse(&l.to_string()), Ok(l), "{opts} -> {l}");
        }
    }

    #[test]
    fn xz_options_parse_as_xz_reads_them() {
        assert_eq!(opt("x86", ""), Ok(Filter::Bcj(Bcj::X86, 0)));
        assert_eq!(
            opt("arm64", "start=4096"),
            Ok(Filter::Bcj(Bcj::Arm64, 4096))
        );
        assert_eq!(opt("delta", "dist=4"), Ok(Filter::Delta(4)));
        assert_eq!(opt("delta", ""), Ok(Filter::Delta(1)));
        let Ok(Filter::Lzma2(l)) = opt(
            "lzma2",
            "dict=32MiB,lc=4,lp=0,pb=0,mode=fast,nice=273,mf=hc4,depth=8",
        ) else {
            panic!("lzma2 options");
        };
        assert_eq!(l.dict_size(), 32 << 20);
        assert_eq!(
            (l.lc, l.pb, l.fast, l.nice, l.mf, l.depth),
            (Some(4), Some(0), Some(true), Some(273), Some(4), Some(8))
        );
        assert!(l.options(u32::MAX).is_ok());
        // A preset resets what came before it.
        let Ok(Filter::Lzma2(l)) = opt("lzma2", "dict=1MiB,preset=9e") else {
            panic!("preset");
        };
        assert_eq!(
            (l.dict, l.dict_size(), l.preset),
            (None, 64 << 20, 9 | PRESET_EXTREME)
        );
        for (name, bad) in [
            ("delta", "dist=0"),
            ("delta", "dist=257"),
            ("x86", "dist=1"),
            ("x86", "start"),
            ("lzma2", "dict=1KiB"),
            ("lzma2", "dict=2GiB"),
            ("lzma2", "lc=3,lp=2"),
            ("lzma2", "mf=bt5"),
            ("lzma2", "mode=slow"),
            ("lzma2", "preset=10"),
            ("lzma2", "nice=1"),
            ("lzma2", "dict=8XB"),
            ("lzma2", "dict=99999999999999999999"),
            ("lzma2", "foo=1"),
        ] {
            assert!(opt(name, bad).is_err(), "{name}={bad}");
        }
        assert!(Filter::from_option("lzma3", None).is_none());
    }

    #[test]
    fn chains_end_with_lzma_and_only_there() {
        let x86 = Filter::Bcj(Bcj::X86, 0);
        let l2 = Filter::Lzma2(Lzma::preset(6, false));
        let l1 = Filter::Lzma1(Lzma::preset(6, false));
        assert!(FilterChain::new(&[x86, l2]).is_ok());
        assert!(FilterChain::new(&[l2, x86]).is_err());
        assert!(FilterChain::new(&[x86]).is_err());
        assert!(FilterChain::new(&[]).is_err());
        assert!(FilterChain::new(&[x86, x86, x86, x86, l2]).is_err());
        assert!(FilterChain::new(&[l2, l2]).is_err());
        assert!(FilterChain::new(&[x86, l1]).map(|c| c.for_xz().is_err()) == Ok(true));
        assert!(FilterChain::new(&[x86, l1]).map(|c| c.for_lzma().is_err()) == Ok(true));
        assert!(FilterChain::new(&[l1]).map(|c| c.for_lzma().is_ok()) == Ok(true));
        let c = FilterChain::parse("x86 lzma2:dict=32MiB").unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(
            c,
            FilterChain::parse("--x86 --lzma2=dict=32MiB").unwrap_or_else(|e| panic!("{e}"))
        );
        assert_eq!(c.to_string(), "--x86 --lzma2=preset=6,dict=33554432");
        assert!(FilterChain::parse("x86 lzma9").is_err());
        let mut flags = Vec::new();
        FilterChain::parse("delta:dist=4 arm:start=16 lzma2")
            .unwrap_or_else(|e| panic!("{e}"))
            .header_flags(&mut flags);
        assert_eq!(flags, [0x03, 1, 3, 0x07, 4, 16, 0, 0, 0]);
    }
}
