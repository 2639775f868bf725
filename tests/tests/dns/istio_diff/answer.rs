//! DNS answers as comparable lines: a small reader of the wire format of its own (so nothing
//! it compares is hidden by a library's leniency), names in record data decompressed, every
//! section in order.
//!
//! Normalised: nothing but the order of the address records (A, AAAA) of an authoritative
//! answer (a name from the NDS table): Istio shuffles those on every answer
//! (`roundRobinResponse`), so they compare as a set; in a truncated (TC) authoritative answer
//! Istio shuffles before it cuts, so only their number, owners and TTLs compare. Name compression is an encoding choice
//! and does not show in the lines. Everything else compares as sent: id, flags, rcode
//! (extended with EDNS), the question as echoed (case included), each record's owner name
//! (case included), TTL, class, type and data, and the OPT record (payload size, version, DO,
//! extended rcode, options).

use std::fmt::Write;

pub fn hex(b: &[u8]) -> String {
    b.iter().fold(String::new(), |mut s, x| {
        let _ = write!(s, "{x:02x}");
        s
    })
}

pub fn unhex(s: &str) -> Result<Vec<u8>, String> {
    if !s.len().is_multiple_of(2) {
        return Err(format!("odd length {}", s.len()));
    }
    (0..s.len())
        .step_by(2)
        .map(|i| u8::from_str_radix(&s[i..i + 2], 16).map_err(|e| format!("hex at {i}: {e}")))
        .collect()
}

struct Reader<'a> {
    b: &'a [u8],
    pos: usize,
}

impl Reader<'_> {
    fn u8(&mut self) -> Result<u8, String> {
        let v = *self.b.get(self.pos).ok_or("short message")?;
        self.pos += 1;
        Ok(v)
    }
    fn u16(&mut self) -> Result<u16, String> {
        Ok(u16::from(self.u8()?) << 8 | u16::from(self.u8()?))
    }
    fn u32(&mut self) -> Result<u32, String> {
        Ok(u32::from(self.u16()?) << 16 | u32::from(self.u16()?))
    }
    fn bytes(&mut self, n: usize) -> Result<&[u8], String> {
        let end = self.pos + n;
        let s = self.b.get(self.pos..end).ok_or("short message")?;
        self.pos = end;
        Ok(s)
    }
    /// A (possibly compressed) name, as written: case kept, dots between labels, trailing dot.
    fn name(&mut self) -> Result<String, String> {
        let (name, end) = read_name(self.b, self.pos)?;
        self.pos = end;
        Ok(name)
    }
}

/// Reads the name at `pos`; returns it and the position after it (before any pointer jump).
fn read_name(b: &[u8], mut pos: usize) -> Result<(String, usize), String> {
    let mut out = String::new();
    let mut end = None;
    let mut jumps = 0;
    loop {
        let len = *b.get(pos).ok_or("short name")? as usize;
        match len & 0xc0 {
            0xc0 => {
                let lo = *b.get(pos + 1).ok_or("short pointer")? as usize;
                end.get_or_insert(pos + 2);
                pos = (len & 0x3f) << 8 | lo;
                jumps += 1;
                if jumps > 64 {
                    return Err("name pointer loop".into());
                }
            }
            0 if len == 0 => {
                if out.is_empty() {
                    out.push('.');
                }
                return Ok((out, end.unwrap_or(pos + 1)));
            }
            0 => {
                let label = b.get(pos + 1..pos + 1 + len).ok_or("short label")?;
                for &c in label {
                    if c.is_ascii_graphic() && c != b'.' && c != b'\\' {
                        out.push(c as char);
                    } else {
                        let _ = write!(out, "\\{c:03}");
                    }
                }
                out.push('.');
                pos += 1 + len;
            }
            _ => return Err(format!("label type {len:#x}")),
        }
    }
}

fn type_name(t: u16) -> String {
    match t {
        1 => "A".into(),
        2 => "NS".into(),
        5 => "CNAME".into(),
        6 => "SOA".into(),
        12 => "PTR".into(),
        15 => "MX".into(),
        16 => "TXT".into(),
        28 => "AAAA".into(),
        33 => "SRV".into(),
        41 => "OPT".into(),
        64 => "SVCB".into(),
        65 => "HTTPS".into(),
        255 => "ANY".into(),
        t => format!("TYPE{t}"),
    }
}

fn class_name(c: u16) -> String {
    match c {
        1 => "IN".into(),
        3 => "CH".into(),
        255 => "ANY".into(),
        c => format!("CLASS{c}"),
    }
}

/// Record data with its names decompressed.
fn rdata(b: &[u8], start: usize, len: usize, rtype: u16) -> Result<String, String> {
    let data = b.get(start..start + len).ok_or("short rdata")?;
    Ok(match rtype {
        1 if len == 4 => std::net::Ipv4Addr::new(data[0], data[1], data[2], data[3]).to_string(),
        28 if len == 16 => {
            let a: [u8; 16] = data.try_into().map_err(|_| "AAAA length")?;
            std::net::Ipv6Addr::from(a).to_string()
        }
        2 | 5 | 12 => read_name(b, start)?.0,
        15 => {
            let pref = u16::from(data[0]) << 8 | u16::from(data[1]);
            format!("{pref} {}", read_name(b, start + 2)?.0)
        }
        33 if len >= 7 => {
            let n = |i: usize| u16::from(data[i]) << 8 | u16::from(data[i + 1]);
            format!("{} {} {} {}", n(0), n(2), n(4), read_name(b, start + 6)?.0)
        }
        6 => {
            let (m, after_m) = read_name(b, start)?;
            let (r, after_r) = read_name(b, after_m)?;
            let rest = b.get(after_r..start + len).ok_or("short SOA")?;
            format!("{m} {r} {}", hex(rest))
        }
        _ => hex(data),
    })
}

/// The answer as lines (see the module's doc), or why it could not be read.
pub fn normalise(answer: Option<&[u8]>) -> Vec<String> {
    let Some(b) = answer else {
        return vec!["no answer".into()];
    };
    match read(b) {
        Ok(lines) => lines,
        Err(e) => vec![format!("unreadable ({e}): {}", hex(b))],
    }
}

fn read(b: &[u8]) -> Result<Vec<String>, String> {
    let mut r = Reader { b, pos: 0 };
    let id = r.u16()?;
    let flags = r.u16()?;
    let counts = [r.u16()?, r.u16()?, r.u16()?, r.u16()?];
    let mut lines = Vec::new();
    let mut rcode = u32::from(flags & 0xf);
    let mut header = format!("header id={id} opcode={}", (flags >> 11) & 0xf);
    for (bit, name) in [
        (0x8000, "qr"),
        (0x0400, "aa"),
        (0x0200, "tc"),
        (0x0100, "rd"),
        (0x0080, "ra"),
        (0x0040, "z"),
        (0x0020, "ad"),
        (0x0010, "cd"),
    ] {
        if flags & bit != 0 {
            header.push(' ');
            header.push_str(name);
        }
    }
    for _ in 0..counts[0] {
        let name = r.name()?;
        let (t, c) = (r.u16()?, r.u16()?);
        lines.push(format!(
            "question {name} {} {}",
            type_name(t),
            class_name(c)
        ));
    }
    let mut edns = None;
    for (section, &n) in ["answer", "authority", "additional"]
        .iter()
        .zip(&counts[1..])
    {
        let mut records = Vec::new();
        for _ in 0..n {
            let name = r.name()?;
            let (t, c, ttl, len) = (r.u16()?, r.u16()?, r.u32()?, r.u16()? as usize);
            let start = r.pos;
            r.bytes(len)?;
            if t == 41 {
                rcode |= (ttl >> 24) << 4;
                edns = Some(format!(
                    "edns owner={name} size={c} version={} do={} z={:#x} options={}",
                    (ttl >> 16) & 0xff,
                    ttl & 0x8000 != 0,
                    ttl & 0x7fff,
                    hex(&b[start..start + len])
                ));
                continue;
            }
            records.push((
                t,
                format!(
                    "{section} {name} {ttl} {} {} {}",
                    class_name(c),
                    type_name(t),
                    rdata(b, start, len, t)?
                ),
            ));
        }
        if flags & 0x0600 == 0x0600 {
            // Authoritative and truncated: Istio shuffles, then cuts, so which of the name's
            // addresses are left is chance; their number, owners and TTLs still compare.
            for r in records.iter_mut().filter(|r| matches!(r.0, 1 | 28)) {
                if let Some(i) = r.1.rfind(' ') {
                    r.1.truncate(i);
                    r.1.push_str(" <one of its addresses>");
                }
            }
        } else if flags & 0x0400 != 0 {
            // Authoritative: the address records compare as a set (Istio shuffles them).
            let slots: Vec<usize> = (0..records.len())
                .filter(|&i| matches!(records[i].0, 1 | 28))
                .collect();
            let mut addrs: Vec<String> = slots.iter().map(|&i| records[i].1.clone()).collect();
            addrs.sort();
            for (slot, a) in slots.into_iter().zip(addrs) {
                records[slot].1 = a;
            }
        }
        lines.extend(records.into_iter().map(|(_, l)| l));
    }
    if r.pos != b.len() {
        lines.push(format!("trailing {}", hex(&b[r.pos..])));
    }
    header.push_str(&format!(" rcode={rcode}"));
    lines.insert(0, header);
    lines.extend(edns);
    Ok(lines)
}

/// A readable one-liner for recorded.jsonl (not compared).
pub fn summary(answer: Option<&[u8]>) -> String {
    let lines = normalise(answer);
    let head = lines.first().cloned().unwrap_or_default();
    let count = |p: &str| lines.iter().filter(|l| l.starts_with(p)).count();
    format!(
        "{} an={} ns={} ar={}{}",
        head.trim_start_matches("header "),
        count("answer "),
        count("authority "),
        count("additional "),
        if lines.iter().any(|l| l.starts_with("edns ")) {
            " edns"
        } else {
            ""
        }
    )
}

/// The lines that differ: Istio's with `-`, ours with `+`, common ones with two spaces.
pub fn diff(want: &[String], got: &[String]) -> String {
    let mut out = String::new();
    for l in want {
        let mark = if got.contains(l) { "  " } else { "- " };
        let _ = writeln!(out, "    {mark}{l}");
    }
    for l in got.iter().filter(|l| !want.contains(l)) {
        let _ = writeln!(out, "    + {l}");
    }
    out
}

/// The deliberate differences (`deliberate.txt` tags, each a line of docs/differences.md).
pub const TAGS: &[&str] = &[
    "ra",
    "edns-echo",
    "opt-options",
    "owner-case",
    "z",
    "qclass",
    "badvers",
    "notify",
];

fn header_without(lines: &mut [String], flag: &str) {
    if let Some(h) = lines.first_mut().filter(|h| h.starts_with("header ")) {
        *h = h
            .split(' ')
            .filter(|t| *t != flag)
            .collect::<Vec<_>>()
            .join(" ");
    }
}

fn header_has(lines: &[String], token: &str) -> bool {
    lines
        .first()
        .is_some_and(|h| h.starts_with("header ") && h.split(' ').any(|t| t == token))
}

/// Applies `tag`'s difference: checks that our answer `got` shows it, then masks it in both
/// (`want` is Istio's). `query` is the query's own lines.
pub fn excuse(
    tag: &str,
    query: &[String],
    want: &mut Vec<String>,
    got: &mut Vec<String>,
) -> Result<(), String> {
    match tag {
        // Istio leaves RA clear on the answers it makes itself; ours sets it.
        "ra" => {
            if !header_has(got, "ra") || header_has(want, "ra") {
                return Err("ra: ours sets RA where Istio's does not".into());
            }
            header_without(got, "ra");
        }
        // Istio's own answers carry no OPT record; ours echo the client's EDNS (our payload
        // size, the client's DO bit).
        "edns-echo" => {
            let q = query
                .iter()
                .find(|l| l.starts_with("edns "))
                .ok_or("edns-echo: the query has no OPT record")?;
            let expect = format!(
                "edns owner=. size=1232 version=0 do={} z=0x0 options=",
                q.contains(" do=true ")
            );
            if want.iter().any(|l| l.starts_with("edns ")) || !got.contains(&expect) {
                return Err(format!("edns-echo: ours has `{expect}`, Istio's none"));
            }
            got.retain(|l| *l != expect);
        }
        // Istio relays the upstream's OPT options; ours sends its own OPT without them.
        "opt-options" => {
            let mut found = false;
            for l in want.iter_mut().filter(|l| l.starts_with("edns ")) {
                if let Some(i) = l.find(" options=") {
                    found = l.len() > i + " options=".len();
                    l.truncate(i + " options=".len());
                }
            }
            if !found {
                return Err("opt-options: Istio's answer has no OPT options".into());
            }
        }
        // Istio writes the table's (lower-case) name as the owner; ours the name as asked.
        "owner-case" => {
            for l in want.iter_mut().chain(got.iter_mut()) {
                if let Some((section, rest)) = l.split_once(' ')
                    && ["answer", "authority", "additional"].contains(&section)
                    && let Some((owner, data)) = rest.split_once(' ')
                {
                    *l = format!("{section} {} {data}", owner.to_ascii_lowercase());
                }
            }
        }
        // Istio relays the upstream's Z bit (echoed from the query); ours keeps it zero.
        "z" => {
            if !header_has(want, "z") || header_has(got, "z") {
                return Err("z: Istio's answer has Z set, ours not".into());
            }
            header_without(want, "z");
        }
        // A class other than IN: Istio answers from the table (IN data), ours forwards.
        "qclass" => {
            if header_has(got, "aa")
                || query
                    .iter()
                    .any(|l| l.ends_with(" IN") && l.starts_with("question "))
            {
                return Err("qclass: a non-IN question, ours not from the table".into());
            }
            *want = got.clone();
        }
        // EDNS version above 0: ours answers BADVERS (RFC 6891), Istio ignores the version.
        "badvers" => {
            if !got.first().is_some_and(|h| h.ends_with(" rcode=16")) {
                return Err("badvers: ours answers BADVERS".into());
            }
            *want = got.clone();
        }
        // NOTIFY: ours answers NOTIMP, Istio forwards it.
        "notify" => {
            if !header_has(got, "opcode=4") || !header_has(got, "rcode=4") {
                return Err("notify: ours answers NOTIFY with NOTIMP".into());
            }
            *want = got.clone();
        }
        other => return Err(format!("unknown tag {other:?} (known: {TAGS:?})")),
    }
    Ok(())
}

/// Whether `tags` account for every difference between Istio's `want` and our `got`.
pub fn excused(
    tags: &[&str],
    query: &[String],
    want: &[String],
    got: &[String],
) -> Result<(), String> {
    let (mut w, mut g) = (want.to_vec(), got.to_vec());
    for t in tags {
        excuse(t, query, &mut w, &mut g)?;
    }
    if w == g {
        Ok(())
    } else {
        Err(format!("{tags:?} leave differences:\n{}", diff(&w, &g)))
    }
}

/// The smallest set of tags that accounts for the difference, if any (for `ISTIO_DIFF_DUMP`).
pub fn suggest(query: &[String], want: &[String], got: &[String]) -> Option<Vec<&'static str>> {
    let mut sets: Vec<Vec<&'static str>> = (1u32..1 << TAGS.len())
        .map(|m| {
            TAGS.iter()
                .enumerate()
                .filter(|(i, _)| m & (1 << i) != 0)
                .map(|(_, t)| *t)
                .collect()
        })
        .collect();
    sets.sort_by_key(Vec::len);
    sets.into_iter()
        .find(|s| excused(s, query, want, got).is_ok())
}
