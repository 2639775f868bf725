//! The process's code as a profile names it: the executable and the shared libraries it
//! runs (`/proc/self/maps`), each with its GNU build ID and function symbols (the ELF
//! `.symtab`, or `.dynsym` where that was stripped, as in distributions' libc), read at the
//! end of a profile and dropped with it. The symbol table is read whole (24 bytes a symbol:
//! ~0.6 MB for the shipped agent); of the string table only the names the profile uses.
//!
//! A binary stripped of its symbols still gives its mappings and build ID: the profile then
//! carries its addresses only, and `go tool pprof` names them from an unstripped copy of the
//! same build (found by build ID, or given on its command line).

use std::fs::File;
use std::os::unix::fs::FileExt;

/// One executable mapping of a file: `[start, limit)` in memory, from `offset` in the file.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Range {
    pub start: u64,
    pub limit: u64,
    pub offset: u64,
}

/// One mapped file: the executable or a shared library.
#[derive(Debug, Default)]
pub struct Object {
    pub path: String,
    pub ranges: Vec<Range>,
    /// The GNU build ID, lowercase hex; empty when the file has none.
    pub build_id: String,
    /// Run-time address minus link-time address (0 for a binary that is not position
    /// independent).
    bias: u64,
    /// Function symbols sorted by address: (link-time address, size, name's offset in the
    /// string table).
    functions: Vec<(u64, u64, u32)>,
    /// The file and where its string table is: (offset, size).
    names: Option<(File, u64, u64)>,
}

/// The process's code: the executable first, then the libraries in address order.
#[derive(Debug, Default)]
pub struct Code {
    pub objects: Vec<Object>,
}

/// Symbol tables past this are not read (a debug build of the agent has a few MB).
const MAX_TABLE: u64 = 256 << 20;
/// Names past this are not read (Rust's longest are a few KB).
const MAX_NAME: usize = 64 << 10;

impl Code {
    /// The running process's, or `None` when `/proc/self` cannot be read.
    pub fn current() -> Option<Code> {
        let exe = std::fs::read_link("/proc/self/exe").ok()?;
        let exe = exe.to_string_lossy().into_owned();
        let maps = std::fs::read_to_string("/proc/self/maps").ok()?;
        let mut objects: Vec<Object> = Vec::new();
        for (path, range) in code_ranges(&maps) {
            match objects.iter_mut().find(|o| o.path == path) {
                Some(o) => o.ranges.push(range),
                None => objects.push(Object {
                    path: path.to_string(),
                    ranges: vec![range],
                    ..Object::default()
                }),
            }
        }
        // The executable is read through /proc/self/exe (whatever became of its path).
        objects.sort_by_key(|o| o.path != exe);
        for o in &mut objects {
            let file = if o.path == exe {
                "/proc/self/exe"
            } else {
                o.path.as_str()
            };
            if let Ok(file) = File::open(file) {
                o.read_symbols(file);
            }
        }
        Some(Code { objects })
    }

    /// The object holding run-time address `addr` (its index), and the index of its range
    /// among all objects' ranges (the profile's mappings, in order).
    pub fn mapping_of(&self, addr: u64) -> Option<(usize, usize)> {
        let mut index = 0;
        for (i, o) in self.objects.iter().enumerate() {
            for r in &o.ranges {
                if (r.start..r.limit).contains(&addr) {
                    return Some((i, index));
                }
                index += 1;
            }
        }
        None
    }

    /// True when the executable's function names were found.
    pub fn named(&self) -> bool {
        self.objects.first().is_some_and(Object::has_functions)
    }
}

impl Object {
    fn read_symbols(&mut self, file: File) {
        let Some(elf) = Elf::read(&file) else {
            return;
        };
        self.build_id = elf.build_id(&file).unwrap_or_default();
        self.bias = self.ranges.first().map_or(0, |r| elf.bias(r));
        if let Some((functions, (offset, size))) = elf.functions(&file) {
            self.functions = functions;
            self.names = Some((file, offset, size));
        }
    }

    /// True when function names were found.
    pub fn has_functions(&self) -> bool {
        !self.functions.is_empty()
    }

    /// The function holding run-time address `addr`: where its name is in the string table
    /// (one place per function, so [`Object::name`] is asked once for each).
    pub fn function(&self, addr: u64) -> Option<u32> {
        let at = addr.wrapping_sub(self.bias);
        let i = self
            .functions
            .partition_point(|f| f.0 <= at)
            .checked_sub(1)?;
        let (start, size, name) = self.functions[i];
        if size != 0 && at >= start.saturating_add(size) {
            return None;
        }
        Some(name)
    }

    /// The (mangled) name at `at` in the string table, read from the file.
    pub fn name(&self, at: u32) -> Option<String> {
        let (file, offset, size) = self.names.as_ref()?;
        let mut name = Vec::new();
        let mut chunk = [0u8; 256];
        let mut pos = u64::from(at);
        while pos < *size && name.len() < MAX_NAME {
            let want =
                usize::try_from(size - pos).map_or(chunk.len(), |left| left.min(chunk.len()));
            let n = file.read_at(&mut chunk[..want], offset + pos).ok()?;
            if n == 0 {
                break;
            }
            if let Some(end) = chunk[..n].iter().position(|&b| b == 0) {
                name.extend_from_slice(&chunk[..end]);
                return String::from_utf8(name).ok();
            }
            name.extend_from_slice(&chunk[..n]);
            pos += n as u64;
        }
        None
    }
}

/// The executable mappings of files (not `[vdso]` and the like) in a `/proc/<pid>/maps`
/// text, with their paths.
fn code_ranges(maps: &str) -> Vec<(&str, Range)> {
    let mut out = Vec::new();
    for line in maps.lines() {
        let mut rest = line;
        let mut fields = [""; 5];
        for f in &mut fields {
            rest = rest.trim_start();
            let end = rest.find(' ').unwrap_or(rest.len());
            *f = &rest[..end];
            rest = &rest[end..];
        }
        let [range, perms, offset, _dev, _inode] = fields;
        let path = rest.trim_start();
        if !path.starts_with('/') || !perms.contains('x') {
            continue;
        }
        let Some((start, limit)) = range.split_once('-') else {
            continue;
        };
        if let (Ok(start), Ok(limit), Ok(offset)) = (
            u64::from_str_radix(start, 16),
            u64::from_str_radix(limit, 16),
            u64::from_str_radix(offset, 16),
        ) {
            out.push((
                path,
                Range {
                    start,
                    limit,
                    offset,
                },
            ));
        }
    }
    out
}

/// The parts of a 64-bit little-endian ELF file read here (x86_64 and aarch64 Linux).
struct Elf {
    /// (type, flags, file offset, virtual address, file size) of each program header.
    segments: Vec<(u32, u32, u64, u64, u64)>,
    /// (type, file offset, size, link) of each section header.
    sections: Vec<(u32, u64, u64, u32)>,
}

const PT_LOAD: u32 = 1;
const PF_X: u32 = 1;
const SHT_SYMTAB: u32 = 2;
const SHT_NOTE: u32 = 7;
const SHT_DYNSYM: u32 = 11;
const STT_FUNC: u8 = 2;
const NT_GNU_BUILD_ID: u32 = 3;

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}
fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}
fn u64_at(b: &[u8], at: usize) -> Option<u64> {
    Some(u64::from_le_bytes(b.get(at..at + 8)?.try_into().ok()?))
}

/// `len` bytes of `file` from `offset` (at most [`MAX_TABLE`]).
fn read(file: &File, offset: u64, len: u64) -> Option<Vec<u8>> {
    if len > MAX_TABLE {
        return None;
    }
    let mut buf = vec![0; usize::try_from(len).ok()?];
    file.read_exact_at(&mut buf, offset).ok()?;
    Some(buf)
}

impl Elf {
    fn read(file: &File) -> Option<Elf> {
        let head = read(file, 0, 64)?;
        // Magic, 64-bit, little-endian.
        if head[..4] != *b"\x7fELF" || head[4] != 2 || head[5] != 1 {
            return None;
        }
        let (phoff, shoff) = (u64_at(&head, 0x20)?, u64_at(&head, 0x28)?);
        let (phentsize, phnum) = (u16_at(&head, 0x36)?, u16_at(&head, 0x38)?);
        let (shentsize, shnum) = (u16_at(&head, 0x3a)?, u16_at(&head, 0x3c)?);
        let phdrs = read(file, phoff, u64::from(phentsize) * u64::from(phnum))?;
        let segments = phdrs
            .chunks_exact(usize::from(phentsize).max(1))
            .filter_map(|p| {
                Some((
                    u32_at(p, 0)?,
                    u32_at(p, 4)?,
                    u64_at(p, 8)?,
                    u64_at(p, 16)?,
                    u64_at(p, 32)?,
                ))
            })
            .collect();
        let shdrs = read(file, shoff, u64::from(shentsize) * u64::from(shnum))?;
        let sections = shdrs
            .chunks_exact(usize::from(shentsize).max(1))
            .filter_map(|s| {
                Some((
                    u32_at(s, 4)?,
                    u64_at(s, 24)?,
                    u64_at(s, 32)?,
                    u32_at(s, 40)?,
                ))
            })
            .collect();
        Some(Elf { segments, sections })
    }

    /// Run-time minus link-time address, from where `range` (an executable mapping) maps the
    /// file: the loadable segment holding that file offset says which address it was linked at.
    fn bias(&self, range: &Range) -> u64 {
        self.segments
            .iter()
            .find(|&&(kind, flags, offset, _, size)| {
                kind == PT_LOAD
                    && flags & PF_X != 0
                    && (offset & !0xffff..offset.saturating_add(size)).contains(&range.offset)
            })
            .map_or(0, |&(_, _, offset, vaddr, _)| {
                range
                    .start
                    .wrapping_sub(vaddr.wrapping_sub(offset).wrapping_add(range.offset))
            })
    }

    /// The function symbols of `.symtab` (else `.dynsym`), sorted, and where its string
    /// table is (offset, size).
    #[allow(clippy::type_complexity)]
    fn functions(&self, file: &File) -> Option<(Vec<(u64, u64, u32)>, (u64, u64))> {
        let table = |kind| self.sections.iter().find(|s| s.0 == kind);
        let &(_, offset, size, link) = table(SHT_SYMTAB).or_else(|| table(SHT_DYNSYM))?;
        let &(_, names_at, names_size, _) = self.sections.get(usize::try_from(link).ok()?)?;
        let table = read(file, offset, size)?;
        let mut functions: Vec<(u64, u64, u32)> = table
            .chunks_exact(24)
            .filter(|s| s[4] & 0xf == STT_FUNC && u16_at(s, 6) != Some(0))
            .filter_map(|s| Some((u64_at(s, 8)?, u64_at(s, 16)?, u32_at(s, 0)?)))
            .filter(|f| f.0 != 0)
            .collect();
        functions.sort_unstable();
        functions.dedup_by_key(|f| f.0);
        Some((functions, (names_at, names_size)))
    }

    /// The GNU build ID note, in hex.
    fn build_id(&self, file: &File) -> Option<String> {
        self.sections
            .iter()
            .filter(|s| s.0 == SHT_NOTE && s.2 <= 1 << 16)
            .find_map(|&(_, offset, size, _)| gnu_build_id(&read(file, offset, size)?))
    }
}

/// The descriptor of the `NT_GNU_BUILD_ID` note among `notes`, in hex.
fn gnu_build_id(mut notes: &[u8]) -> Option<String> {
    let align = |n: u32| (n as usize).next_multiple_of(4);
    while notes.len() >= 12 {
        let (name_size, desc_size, kind) =
            (u32_at(notes, 0)?, u32_at(notes, 4)?, u32_at(notes, 8)?);
        let name = notes.get(12..12 + name_size as usize)?;
        let desc_at = 12 + align(name_size);
        let desc = notes.get(desc_at..desc_at + desc_size as usize)?;
        if kind == NT_GNU_BUILD_ID && name == b"GNU\0" {
            return Some(desc.iter().map(|b| format!("{b:02x}")).collect());
        }
        notes = notes.get(desc_at + align(desc_size)..)?;
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn code_ranges_are_the_executable_mappings_of_files() {
        let maps = "\
00400000-00401000 r--p 00000000 fd:01 42    /usr/local/bin/pilot-agent
00401000-00a00000 r-xp 00001000 fd:01 42    /usr/local/bin/pilot-agent
00a00000-00b00000 r--p 00600000 fd:01 42    /usr/local/bin/pilot-agent
7f0000000000-7f0000001000 r-xp 00000000 00:00 0    [vdso]
7f0000002000-7f0000003000 r-xp 00028000 fd:01 43    /usr/lib/x86_64-linux-gnu/libc.so.6
7f0000004000-7f0000005000 r-xp 00000000 fd:01 44    /opt/my dir/pilot-agent
7f0000006000-7f0000007000 rw-p 00000000 00:00 0
";
        assert_eq!(
            code_ranges(maps),
            [
                (
                    "/usr/local/bin/pilot-agent",
                    Range {
                        start: 0x401000,
                        limit: 0xa00000,
                        offset: 0x1000
                    }
                ),
                (
                    "/usr/lib/x86_64-linux-gnu/libc.so.6",
                    Range {
                        start: 0x7f0000002000,
                        limit: 0x7f0000003000,
                        offset: 0x28000
                    }
                ),
                (
                    "/opt/my dir/pilot-agent",
                    Range {
                        start: 0x7f0000004000,
                        limit: 0x7f0000005000,
                        offset: 0
                    }
                ),
            ]
        );
    }

    #[test]
    fn build_id_note() {
        let mut notes = Vec::new();
        // A note of another kind first, then GNU's build ID (a 5-byte descriptor, padded).
        for (name, kind, desc) in [
            (&b"Go\0\0"[..], 4u32, &b"abcd"[..]),
            (b"GNU\0", 3, &[1, 2, 0xab, 4, 5]),
        ] {
            notes.extend((name.len() as u32).to_le_bytes());
            notes.extend((desc.len() as u32).to_le_bytes());
            notes.extend(kind.to_le_bytes());
            notes.extend(name);
            notes.extend(desc);
            notes.resize(notes.len().next_multiple_of(4), 0);
        }
        assert_eq!(gnu_build_id(&notes).as_deref(), Some("0102ab0405"));
        assert_eq!(gnu_build_id(&notes[..20]), None, "cut short");
    }

    /// This test binary names its own functions (tests are built with a symbol table), and
    /// the C library's (from its `.dynsym` when it is a shared library).
    #[test]
    fn names_functions_of_the_running_process() {
        let code = Code::current().expect("/proc/self");
        assert!(code.named(), "{code:?}");
        let name = |addr: u64| {
            let (object, _) = code.mapping_of(addr).expect("mapped");
            let object = &code.objects[object];
            let name = object.name(object.function(addr).expect("named"));
            format!("{:#}", rustc_demangle::demangle(&name.expect("read")))
        };
        let here = names_functions_of_the_running_process as *const () as u64;
        assert!(
            name(here).ends_with("names_functions_of_the_running_process"),
            "{}",
            name(here)
        );
        assert_eq!(code.mapping_of(here).unwrap().1, 0, "the executable first");
        let getpid = libc::getpid as *const () as u64;
        assert!(name(getpid).contains("getpid"), "{}", name(getpid));
        assert!(code.mapping_of(8).is_none(), "outside every mapping");
    }
}
