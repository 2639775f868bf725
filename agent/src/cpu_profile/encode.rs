//! The recorded stacks as pprof's `perftools.profiles.Profile`, laid out as Go's CPU profiles
//! are: two values per sample (`samples`/`count`, `cpu`/`nanoseconds`), the period in CPU
//! nanoseconds, the executable's mappings first and then the libraries', one location per
//! address (the
//! interrupted address as is, a caller's return address less one, so it falls inside the call
//! as pprof expects), and the sampled thread's name as the label `thread`.

use std::collections::HashMap;
use std::time::{Duration, SystemTime};

use proto::perftools::profiles as pb;

use super::Stack;
use super::symbols::Code;

/// What the profile is made of.
pub struct Inputs<'a> {
    pub stacks: &'a HashMap<Stack, i64>,
    /// Samples recorded nowhere (buffers full); shown as one stack of their own.
    pub lost: i64,
    pub started: SystemTime,
    pub duration: Duration,
    /// The process's code, when `/proc/self` could be read.
    pub code: Option<&'a Code>,
    /// Nanoseconds of CPU per sample.
    pub period: i64,
}

/// The name the lost samples' stack shows.
pub const LOST: &str = "[lost: the profile's sample buffer was full]";

#[derive(Default)]
struct Builder {
    profile: pb::Profile,
    strings: HashMap<String, i64>,
    locations: HashMap<u64, u64>,
    /// Function ids by object (its index in [`Code::objects`]) and name's place.
    functions: HashMap<(usize, u32), u64>,
}

impl Builder {
    fn string(&mut self, s: &str) -> i64 {
        if let Some(&i) = self.strings.get(s) {
            return i;
        }
        let i = self.profile.string_table.len() as i64;
        self.profile.string_table.push(s.to_string());
        self.strings.insert(s.to_string(), i);
        i
    }

    fn value_type(&mut self, kind: &str, unit: &str) -> pb::ValueType {
        pb::ValueType {
            r#type: self.string(kind),
            unit: self.string(unit),
        }
    }

    /// A new function named `mangled` (its readable name: demangled, without the hash).
    fn function(&mut self, mangled: &str) -> u64 {
        let id = self.profile.function.len() as u64 + 1;
        let name = format!("{:#}", rustc_demangle::demangle(mangled));
        let function = pb::Function {
            id,
            name: self.string(&name),
            system_name: self.string(mangled),
            ..pb::Function::default()
        };
        self.profile.function.push(function);
        id
    }

    /// The function of `code.objects[object]` whose name is at `at` in its string table.
    fn named(&mut self, code: &Code, object: usize, at: u32) -> Option<u64> {
        if let Some(&id) = self.functions.get(&(object, at)) {
            return Some(id);
        }
        let id = self.function(&code.objects[object].name(at)?);
        self.functions.insert((object, at), id);
        Some(id)
    }

    /// The location of `addr`, named when its object's symbols say.
    fn location(&mut self, addr: u64, code: Option<&Code>) -> u64 {
        if let Some(&id) = self.locations.get(&addr) {
            return id;
        }
        let id = self.profile.location.len() as u64 + 1;
        let mapping = code.and_then(|c| Some((c, c.mapping_of(addr)?)));
        let mapping_id = mapping.map_or(0, |(_, (_, i))| i as u64 + 1);
        let function = mapping.and_then(|(c, (object, _))| {
            let at = c.objects[object].function(addr)?;
            self.named(c, object, at)
        });
        let line = match function {
            Some(function_id) => vec![pb::Line {
                function_id,
                ..pb::Line::default()
            }],
            None => Vec::new(),
        };
        self.profile.location.push(pb::Location {
            id,
            mapping_id,
            address: addr,
            line,
            ..pb::Location::default()
        });
        self.locations.insert(addr, id);
        id
    }

    fn mappings(&mut self, code: &Code) {
        for o in &code.objects {
            let filename = self.string(&o.path);
            let build_id = self.string(&o.build_id);
            for r in &o.ranges {
                let id = self.profile.mapping.len() as u64 + 1;
                self.profile.mapping.push(pb::Mapping {
                    id,
                    memory_start: r.start,
                    memory_limit: r.limit,
                    file_offset: r.offset,
                    filename,
                    build_id,
                    has_functions: o.has_functions(),
                    ..pb::Mapping::default()
                });
            }
        }
    }

    fn sample(&mut self, locations: Vec<u64>, count: i64, period: i64, thread: Option<&str>) {
        let label = thread
            .map(|t| pb::Label {
                key: self.string("thread"),
                str: self.string(t),
                ..pb::Label::default()
            })
            .into_iter()
            .collect();
        self.profile.sample.push(pb::Sample {
            location_id: locations,
            value: vec![count, count.saturating_mul(period)],
            label,
        });
    }
}

/// The profile of `i`.
pub fn profile(i: Inputs<'_>) -> pb::Profile {
    let mut b = Builder::default();
    b.string("");
    b.profile.sample_type = vec![
        b.value_type("samples", "count"),
        b.value_type("cpu", "nanoseconds"),
    ];
    b.profile.period_type = Some(b.value_type("cpu", "nanoseconds"));
    b.profile.period = i.period;
    b.profile.time_nanos = i
        .started
        .duration_since(SystemTime::UNIX_EPOCH)
        .map_or(0, |d| i64::try_from(d.as_nanos()).unwrap_or(i64::MAX));
    b.profile.duration_nanos = i64::try_from(i.duration.as_nanos()).unwrap_or(i64::MAX);
    if let Some(code) = i.code {
        b.mappings(code);
    }
    for (stack, &count) in i.stacks {
        let locations = stack
            .pcs
            .iter()
            .enumerate()
            .map(|(n, &pc)| {
                let addr = if n == 0 { pc } else { pc.saturating_sub(1) };
                b.location(addr as u64, i.code)
            })
            .collect();
        b.sample(locations, count, i.period, Some(&stack.thread));
    }
    if i.lost > 0 {
        let function = b.function(LOST);
        let id = b.profile.location.len() as u64 + 1;
        b.profile.location.push(pb::Location {
            id,
            line: vec![pb::Line {
                function_id: function,
                ..pb::Line::default()
            }],
            ..pb::Location::default()
        });
        b.sample(vec![id], i.lost, i.period, None);
    }
    b.profile
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn layout_as_go_cpu_profiles() {
        let code = Code::current().expect("/proc/self");
        let here = layout_as_go_cpu_profiles as *const () as usize;
        let mut stacks = HashMap::new();
        stacks.insert(
            Stack {
                thread: "pilot-agent".into(),
                pcs: vec![here, here + 1, 16].into(),
            },
            3,
        );
        let p = profile(Inputs {
            stacks: &stacks,
            lost: 2,
            started: SystemTime::UNIX_EPOCH + Duration::from_secs(1),
            duration: Duration::from_secs(2),
            code: Some(&code),
            period: 10_000_000,
        });
        let s = |i: i64| p.string_table[i as usize].as_str();
        assert_eq!(s(0), "");
        let types: Vec<_> = p
            .sample_type
            .iter()
            .map(|t| (s(t.r#type), s(t.unit)))
            .collect();
        assert_eq!(types, [("samples", "count"), ("cpu", "nanoseconds")]);
        assert_eq!(p.period, 10_000_000);
        assert_eq!(
            (p.time_nanos, p.duration_nanos),
            (1_000_000_000, 2_000_000_000)
        );
        assert_eq!(s(p.mapping[0].filename), code.objects[0].path);
        assert!(p.mapping[0].has_functions);
        assert_eq!(p.sample.len(), 2);
        let sample = p.sample.iter().find(|s| s.value[0] == 3).unwrap();
        assert_eq!(sample.value, [3, 30_000_000]);
        assert_eq!(s(sample.label[0].key), "thread");
        assert_eq!(s(sample.label[0].str), "pilot-agent");
        // The leaf's address as is, the callers' less one: `here + 1` lands on `here` too,
        // one location; the address outside every mapping has neither mapping nor name.
        assert_eq!(sample.location_id, [1, 1, 2]);
        let named = &p.location[0];
        assert_eq!((named.address, named.mapping_id), (here as u64, 1));
        let f = &p.function[named.line[0].function_id as usize - 1];
        assert!(
            s(f.name).ends_with("layout_as_go_cpu_profiles"),
            "{}",
            s(f.name)
        );
        assert!(s(f.system_name).starts_with("_ZN") || s(f.system_name).starts_with("_R"));
        assert_eq!((p.location[1].mapping_id, p.location[1].line.len()), (0, 0));
        let lost = p.sample.iter().find(|s| s.value[0] == 2).unwrap();
        let loc = &p.location[lost.location_id[0] as usize - 1];
        assert_eq!(
            s(p.function[loc.line[0].function_id as usize - 1].name),
            LOST
        );
    }
}
