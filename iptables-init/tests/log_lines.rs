//! `istio-iptables` logs in Istio's layout, as the agent does (`go_syntax::istio_log`): text
//! lines `<RFC 3339 time>\t<level>\t<message>` that Istio's own reader takes, or JSON objects
//! with Istio's keys under `--log_as_json`. A dry run changes nothing on the host; it only reads
//! the addresses of the namespace it runs in.

use std::process::Command;

use go_syntax::istio_log::testing::{is_istio_time, parse_plain};

/// stdout and stderr of a dry run with `extra` arguments.
fn dry_run(extra: &[&str]) -> (String, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_istio-iptables"))
        .args(["--dry-run", "-p", "15001", "-u", "1337"])
        .args(extra)
        .env_clear()
        .env("PATH", "/usr/sbin:/usr/bin:/sbin:/bin")
        .output()
        .expect("run istio-iptables");
    assert!(out.status.success(), "{out:?}");
    (
        String::from_utf8(out.stdout).expect("stdout"),
        String::from_utf8(out.stderr).expect("stderr"),
    )
}

#[test]
fn text_lines_are_istios_layout() {
    let (stream, log) = dry_run(&[]);
    assert!(stream.contains("-A ISTIO_OUTPUT"), "{stream}");
    let lines: Vec<&str> = log.lines().collect();
    assert!(!lines.is_empty(), "no log");
    for line in &lines {
        // A message may span lines (the configuration's Debug form does not); every line that
        // starts an event is Istio's.
        let (time, level, text) =
            parse_plain(line).unwrap_or_else(|| panic!("not Istio's: {line:?}"));
        assert!(is_istio_time(&time), "{line}");
        assert_eq!(level, "info", "{line}");
        // The default scope: no scope column before the message.
        assert!(!text.starts_with("default\t"), "{line}");
    }
    assert!(
        lines
            .iter()
            .any(|l| l.ends_with("\tinfo\trunning in dry-run mode, no rule changes will be made")),
        "{log}"
    );
    assert!(!log.contains('\u{1b}'), "no colour: {log}");
}

#[test]
fn json_lines_carry_istios_keys() {
    let (_, log) = dry_run(&["--log_as_json"]);
    let mut seen = false;
    for line in log.lines() {
        let v: serde_json::Value =
            serde_json::from_str(line).unwrap_or_else(|e| panic!("{e}: {line:?}"));
        assert_eq!(v["level"], "info", "{line}");
        assert!(is_istio_time(v["time"].as_str().expect("time")), "{line}");
        assert!(
            v.get("scope").is_none(),
            "the default scope has no key: {line}"
        );
        seen |= v["msg"] == "running in dry-run mode, no rule changes will be made";
    }
    assert!(seen, "{log}");
}

#[test]
fn log_target_names_where_the_lines_go() {
    let dir = tempfile::tempdir().expect("tempdir");
    let file = dir.path().join("init.log");
    let target = format!("--log_target={}", file.display());
    let (stream, log) = dry_run(&[&target]);
    assert!(stream.contains("-A ISTIO_OUTPUT"), "{stream}");
    assert!(log.is_empty(), "nothing on stderr: {log}");
    let written = std::fs::read_to_string(&file).expect("the log file");
    assert!(
        written
            .lines()
            .any(|l| parse_plain(l)
                .is_some_and(|(_, _, t)| t.starts_with("running in dry-run mode"))),
        "{written}"
    );
    // stdout: the lines follow the stream there, as asked.
    let (out, log) = dry_run(&["--log_target=stdout"]);
    assert!(log.is_empty(), "{log}");
    assert!(
        out.contains("-A ISTIO_OUTPUT") && out.contains("\tinfo\trunning in dry-run mode"),
        "{out}"
    );
}
