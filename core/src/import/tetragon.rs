//! Tetragon JSON export: one event per line, `{"process_exec": {...}, "node_name": ..., "time": ...}`.
//! `process_exec` and `process_exit` give the process lifecycle; `process_kprobe` and
//! `process_lsm` events of file hooks (`security_file_open`, `security_file_permission`,
//! `fd_install`, `file_open`, the `sys_openat` family) give opens, when the recording's
//! tracing policies loaded them.

use std::collections::VecDeque;

use serde_json::{Map, Value};

use super::{
    jsonl::{rfc3339_ns, Decoder, JsonLines},
    signal_number, Format, Known, Lines,
};
use crate::event::{Event, EventData, Exec, Exit, Open};

/// The top-level keys of Tetragon events (one per line).
pub(super) const EVENT_KEYS: &[&str] = &[
    "process_exec",
    "process_exit",
    "process_kprobe",
    "process_tracepoint",
    "process_uprobe",
    "process_lsm",
    "process_loader",
    "process_throttle",
    "rate_limit_info",
];
const AT_FDCWD: i32 = -100;
/// `MAY_WRITE` in the mask argument of `security_file_permission`.
const MAY_WRITE: i64 = 2;

/// Tetragon's mapping; the host is the first `node_name` seen, unless given at the start.
pub(super) struct Tetragon {
    known: Known,
    host: Option<String>,
}

pub(super) type TetragonSource = JsonLines<Tetragon>;

impl TetragonSource {
    pub(super) fn new(lines: Lines, host: Option<String>) -> TetragonSource {
        JsonLines::with_decoder(lines, Tetragon { known: Known::default(), host })
    }
}

impl Decoder for Tetragon {
    const FORMAT: Format = Format::Tetragon;

    fn decode(&mut self, object: &Map<String, Value>, out: &mut VecDeque<Event>) -> Result<(), String> {
        let Some((&kind, body)) = EVENT_KEYS.iter().find_map(|k| object.get(*k).map(|b| (k, b))) else {
            return Err("not a Tetragon event (no process_* key)".into());
        };
        if self.host.is_none() {
            self.host = object.get("node_name").and_then(Value::as_str).map(str::to_owned);
        }
        let time = match object.get("time").and_then(Value::as_str) {
            Some(text) => rfc3339_ns(text).ok_or_else(|| format!("bad time {text:?}"))?,
            None => 0,
        };
        let process = body.get("process").ok_or_else(|| format!("{kind} without a process"))?;
        let pid = uint(process, "pid").ok_or_else(|| format!("{kind} without process.pid"))?;
        let ppid = body.get("parent").and_then(|p| uint(p, "pid")).unwrap_or(0);
        match kind {
            "process_exec" => {
                if let Some(fork) = self.known.announce(time, ppid, pid) {
                    out.push_back(fork);
                }
                let binary = string(process, "binary");
                let mut args = vec![binary.clone()];
                args.extend(split_arguments(&string(process, "arguments")));
                let seeded = string(process, "flags").split_whitespace().any(|f| f == "procFS");
                out.push_back(Event {
                    time_ns: time,
                    pid,
                    data: EventData::Exec(Exec {
                        ppid,
                        filename: binary.clone(),
                        executable: binary,
                        args,
                        cwd: string(process, "cwd"),
                        uid: uint(process, "uid").unwrap_or(0),
                        seeded,
                        ..Exec::default()
                    }),
                });
            }
            "process_exit" => {
                let status = uint(body, "status").unwrap_or(0);
                let signal = body.get("signal").and_then(Value::as_str).and_then(signal_number).unwrap_or(0);
                self.known.remove(pid);
                out.push_back(Event {
                    time_ns: time,
                    pid,
                    data: EventData::Exit(Exit { code: ((status & 0xff) << 8) | signal }),
                });
            }
            "process_kprobe" | "process_lsm" => {
                let function = body.get("function_name").and_then(Value::as_str).unwrap_or("");
                let Some(open) = file_open(function, body, uint(process, "tid").unwrap_or(pid)) else { return Ok(()) };
                if let Some(fork) = self.known.announce(time, ppid, pid) {
                    out.push_back(fork);
                }
                out.push_back(Event { time_ns: time, pid, data: EventData::Open(open) });
            }
            _ => {}
        }
        Ok(())
    }

    fn host(&self) -> Option<String> {
        self.host.clone()
    }
}

/// `node_name` of an event line.
pub(super) fn node_name(line: &[u8]) -> Option<String> {
    let value: Value = serde_json::from_slice(line).ok()?;
    value.get("node_name")?.as_str().map(str::to_owned)
}

/// An `Open` from a hook with file arguments, for the hooks that mean an open or a read.
fn file_open(function: &str, body: &Value, tid: u32) -> Option<Open> {
    let args: &[Value] = body.get("args").and_then(Value::as_array).map_or(&[], Vec::as_slice);
    let file_path = || args.iter().find_map(|a| a.get("file_arg").or_else(|| a.get("path_arg"))?.get("path")?.as_str());
    let ints = || args.iter().filter_map(|a| a.get("int_arg")?.as_i64());
    let returned = body.get("return").and_then(|r| r.get("int_arg")).and_then(Value::as_i64);
    let syscall_like = function.contains("sys_open");
    let (path, abs_path, flags, dirfd, ret) = if syscall_like {
        let path = args.iter().find_map(|a| a.get("string_arg")?.as_str())?.to_owned();
        let mut ints = ints();
        let dirfd = if function.contains("openat") { ints.next().unwrap_or(AT_FDCWD as i64) as i32 } else { AT_FDCWD };
        let flags = ints.next().unwrap_or(0) as u64;
        let abs = path.starts_with('/').then(|| path.clone());
        (path, abs, flags, dirfd, returned.unwrap_or(0))
    } else {
        let path = file_path()?.to_owned();
        let (flags, ret) = match function {
            // The mask says read or write; a non-zero return means denied.
            "security_file_permission" => {
                let write = ints().next().is_some_and(|mask| mask & MAY_WRITE != 0);
                (if write { libc::O_WRONLY as u64 } else { 0 }, -returned.unwrap_or(0).abs())
            }
            "security_file_open" | "file_open" => (0, -returned.unwrap_or(0).abs()),
            "fd_install" => (0, ints().next().unwrap_or(0)),
            _ => return None,
        };
        (path.clone(), Some(path), flags, AT_FDCWD, ret)
    };
    Some(Open { tid, syscall: function.to_owned(), dirfd, flags, mode: 0, path, abs_path, ret, ..Open::default() })
}

fn uint(value: &Value, key: &str) -> Option<u32> {
    value.get(key)?.as_u64().and_then(|n| u32::try_from(n).ok())
}

fn string(value: &Value, key: &str) -> String {
    value.get(key).and_then(Value::as_str).unwrap_or_default().to_owned()
}

/// Tetragon's `arguments` string, split at spaces; double quotes group an argument that
/// holds spaces and a backslash escapes the next character.
/// Tetragon's own quoting, not shell syntax: a single quote or a `#` is an ordinary character
/// there, where shell-word splitters (`shlex`, `shell-words`) fail on `it's` and drop `#x`.
fn split_arguments(text: &str) -> Vec<String> {
    let mut args = Vec::new();
    let mut current = String::new();
    let (mut quoted, mut started) = (false, false);
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        match c {
            '\\' => {
                current.extend(chars.next());
                started = true;
            }
            '"' => {
                quoted = !quoted;
                started = true;
            }
            ' ' if !quoted => {
                if started {
                    args.push(std::mem::take(&mut current));
                    started = false;
                }
            }
            c => {
                current.push(c);
                started = true;
            }
        }
    }
    if started {
        args.push(current);
    }
    args
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::EventSource;

    #[test]
    fn splits_arguments() {
        assert_eq!(split_arguments(r#"-c "cat ~/.npmrc"  x\"y"#), ["-c", "cat ~/.npmrc", "x\"y"]);
        assert!(split_arguments("").is_empty());
        assert_eq!(split_arguments("echo it's #1"), ["echo", "it's", "#1"]);
    }

    #[test]
    fn maps_exec_kprobe_and_exit() {
        let text = concat!(
            r#"{"process_exec":{"process":{"exec_id":"a","pid":10,"uid":1000,"cwd":"/home/alice/app","binary":"/usr/bin/npm","arguments":"install","flags":"execve clone","parent_exec_id":"p"},"parent":{"pid":1,"binary":"/bin/bash"}},"node_name":"n1","time":"2024-04-14T02:18:14.376304204Z"}"#,
            "\n",
            r#"{"process_exec":{"process":{"exec_id":"b","pid":11,"uid":1000,"cwd":"/home/alice/app","binary":"/bin/sh","arguments":"-c \"cat ~/.npmrc\"","flags":"execve clone"},"parent":{"pid":10,"binary":"/usr/bin/npm"}},"node_name":"n1","time":"2024-04-14T02:18:14.4Z"}"#,
            "\n",
            r#"{"process_kprobe":{"process":{"exec_id":"b","pid":11,"tid":12,"binary":"/bin/sh"},"parent":{"pid":10},"function_name":"security_file_permission","args":[{"file_arg":{"path":"/home/alice/.npmrc","permission":"-rw-------"}},{"int_arg":4}],"return":{"int_arg":0},"action":"KPROBE_ACTION_POST","policy_name":"file-monitoring"},"node_name":"n1","time":"2024-04-14T02:18:14.5Z"}"#,
            "\n",
            r#"{"process_kprobe":{"process":{"pid":11},"parent":{"pid":10},"function_name":"tcp_connect","args":[]},"time":"2024-04-14T02:18:14.6Z"}"#,
            "\n",
            r#"{"process_exit":{"process":{"pid":11,"binary":"/bin/sh"},"parent":{"pid":10},"signal":"SIGKILL","status":0},"node_name":"n1","time":"2024-04-14T02:18:14.7Z"}"#,
            "\n",
        );
        let mut source = TetragonSource::new(Lines::from_bytes("t.json", text.as_bytes()), None);
        let events: Vec<Event> = std::iter::from_fn(|| source.next_event().unwrap()).collect();
        assert_eq!(source.host().as_deref(), Some("n1"));
        let kinds: Vec<String> = events
            .iter()
            .map(|e| format!("{}:{}", e.pid, serde_json::to_value(&e.data).unwrap()["kind"].as_str().unwrap()))
            .collect();
        assert_eq!(kinds, ["1:fork", "10:exec", "10:fork", "11:exec", "11:open", "11:exit"]);
        assert_eq!(events[1].time_ns, 1_713_061_094_376_304_204);
        let EventData::Exec(sh) = &events[3].data else { panic!() };
        assert_eq!(sh.args, ["/bin/sh", "-c", "cat ~/.npmrc"]);
        let EventData::Open(open) = &events[4].data else { panic!() };
        assert_eq!((open.tid, open.abs_path.as_deref(), open.ret, open.flags), (12, Some("/home/alice/.npmrc"), 0, 0));
        assert_eq!(events[5].data, EventData::Exit(Exit { code: 9 }));
    }

    #[test]
    fn bad_lines_are_recoverable_errors() {
        let text = "{\"process_exec\":{\"process\":{\"pid\":1}}}\n[1,2]\n{\"foo\":1}\n{\"process_exec\":{}}\n{\"process_exit\":{\"process\":{\"pid\":1}}\n";
        let mut source = TetragonSource::new(Lines::from_bytes("t.json", text.as_bytes()), None);
        let mut errors = Vec::new();
        let mut events = 0;
        loop {
            match source.next_event() {
                Ok(Some(_)) => events += 1,
                Ok(None) => break,
                Err(e) => errors.push(e.to_string()),
            }
        }
        assert_eq!(events, 1);
        let lines: Vec<&str> = errors.iter().map(|e| e.split(": ").next().unwrap()).collect();
        assert_eq!(lines, ["t.json:2", "t.json:3", "t.json:4", "t.json:5"], "{errors:?}");
    }
}
