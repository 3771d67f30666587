//! What the agent keeps resident once start-up (or a reload) is over. Start-up runs code and
//! frees memory that watching never needs again: the rules' YAML parser, the kernel BTF parses,
//! aya's loader. Measured on the static release build idle under `watch --sensor tracepoint`:
//! the heap kept 31.4 MB of freed pages before `malloc_trim`, and the binary's pages that
//! start-up touched (with the kernel's fault-around, 64 KiB at a time) were 13.6 MB of RSS.

use std::{
    io::{self, BufRead},
    os::unix::fs::MetadataExt,
};

/// Gives back to the kernel what start-up (or a reload) left resident and watching does not use: glibc's free
/// heap pages, and this program's own clean pages (code and read-only data), which stay in the
/// page cache and come back on a minor fault when next run.
pub fn release_after_loading() {
    // SAFETY: malloc_trim only returns free pages to the kernel.
    unsafe { libc::malloc_trim(0) };
    if let Err(error) = release_clean_binary_pages() {
        tracing::debug!("the binary's pages stay resident: {error}");
    }
}

/// Unmaps the pages of the mappings of this executable that hold none of the process's own
/// (copy-on-write) pages and cannot be written: unmapping them loses nothing, since each comes
/// back from the file as it was. A mapping with private pages (relocated data, RELRO) is left.
fn release_clean_binary_pages() -> io::Result<()> {
    let exe = std::fs::metadata("/proc/self/exe")?;
    let smaps = io::BufReader::new(std::fs::File::open("/proc/self/smaps")?);
    let mut releasable = Vec::new();
    let mut current: Option<Mapping> = None;
    for line in smaps.lines() {
        let line = line?;
        if let Some(mapping) = Mapping::parse_header(&line) {
            releasable.extend(current.take().filter(Mapping::is_clean));
            current = (mapping.is_file(exe.dev(), exe.ino()) && !mapping.writable).then_some(mapping);
        } else if let (Some(mapping), Some(kb)) = (current.as_mut(), line.strip_prefix("Anonymous:")) {
            mapping.private_kb = kilobytes(kb);
        }
    }
    releasable.extend(current.filter(Mapping::is_clean));
    for mapping in releasable {
        // SAFETY: the range is one of this process's read-only file mappings with no private page;
        // MADV_DONTNEED only drops its page table entries, and the next access reads the file.
        let (start, length) = (mapping.start as *mut libc::c_void, mapping.end - mapping.start);
        if unsafe { libc::madvise(start, length, libc::MADV_DONTNEED) } != 0 {
            return Err(io::Error::last_os_error());
        }
    }
    Ok(())
}

/// The figure of a smaps field's value (`      12 kB`).
fn kilobytes(value: &str) -> Option<u64> {
    value.trim().trim_end_matches("kB").trim().parse().ok()
}

/// One mapping of /proc/self/smaps.
#[derive(Debug, PartialEq)]
struct Mapping {
    start: usize,
    end: usize,
    writable: bool,
    /// `major:minor` (hex) and inode of the mapped file; inode 0 for anonymous memory.
    device: (u64, u64),
    inode: u64,
    /// Its `Anonymous:` figure; unknown until that line is read.
    private_kb: Option<u64>,
}

impl Mapping {
    /// `start-end perms offset major:minor inode [path]`; `None` for a field line.
    fn parse_header(line: &str) -> Option<Mapping> {
        let mut fields = line.split_ascii_whitespace();
        let (start, end) = fields.next()?.split_once('-')?;
        let perms = fields.next()?;
        let _offset = fields.next()?;
        let (major, minor) = fields.next()?.split_once(':')?;
        Some(Mapping {
            start: usize::from_str_radix(start, 16).ok()?,
            end: usize::from_str_radix(end, 16).ok()?,
            writable: perms.as_bytes().get(1) == Some(&b'w'),
            device: (u64::from_str_radix(major, 16).ok()?, u64::from_str_radix(minor, 16).ok()?),
            inode: fields.next()?.parse().ok()?,
            private_kb: None,
        })
    }

    fn is_file(&self, dev: u64, inode: u64) -> bool {
        self.inode == inode && self.device == (libc::major(dev).into(), libc::minor(dev).into())
    }

    fn is_clean(&self) -> bool {
        self.private_kb == Some(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_mapping_header_is_parsed_and_a_field_line_is_not() {
        let text = Mapping::parse_header("5581e0a00000-5581e1b2c000 r-xp 00346000 fe:01 1234567 /usr/bin/credwatch");
        assert_eq!(
            text,
            Some(Mapping {
                start: 0x5581e0a00000,
                end: 0x5581e1b2c000,
                writable: false,
                device: (0xfe, 1),
                inode: 1234567,
                private_kb: None,
            })
        );
        let data = Mapping::parse_header("5581e1d00000-5581e1d10000 rw-p 01700000 fe:01 1234567 /usr/bin/credwatch");
        assert!(data.is_some_and(|mapping| mapping.writable));
        assert_eq!(Mapping::parse_header("Anonymous:             0 kB"), None);
        assert_eq!(Mapping::parse_header("VmFlags: rd ex mr mw me sd"), None);
    }

    /// The real thing: this test binary's clean pages are dropped, its relocated read-only data
    /// (private pages) kept, and the code still runs afterwards.
    #[test]
    fn the_clean_pages_of_this_binary_are_released_and_nothing_else() {
        let resident_of_exe = || {
            let exe = std::fs::metadata("/proc/self/exe").unwrap();
            let smaps = std::fs::read_to_string("/proc/self/smaps").unwrap();
            let (mut resident, mut private, mut in_exe) = (0u64, 0u64, false);
            for line in smaps.lines() {
                if let Some(mapping) = Mapping::parse_header(line) {
                    in_exe = mapping.is_file(exe.dev(), exe.ino()) && !mapping.writable;
                } else if let (true, Some(kb)) = (in_exe, line.strip_prefix("Rss:")) {
                    resident += kilobytes(kb).unwrap();
                } else if let (true, Some(kb)) = (in_exe, line.strip_prefix("Anonymous:")) {
                    private += kilobytes(kb).unwrap();
                }
            }
            (resident, private)
        };
        let (before, private_before) = resident_of_exe();
        assert!(before > 0);
        release_clean_binary_pages().unwrap();
        let (after, private_after) = resident_of_exe();
        // Pages the test touches again between the two reads come back.
        assert!(after < before / 2, "{before} kB of the binary resident before, {after} kB after");
        assert_eq!(private_after, private_before, "private pages are never dropped");
    }
}
