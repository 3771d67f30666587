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
use crate::{
    container,
    event::{Event, EventData, Exec, Exit, Open, StatedContainer},
};

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
                        stated_container: stated_container(process),
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
                    data: EventData::Exit(Exit { code: ((status & 0xff) << 8) | signal, repeats: 0 }),
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

/// The container and pod of `process`: `pod.container.id` (`containerd://<64 hex>`) when present
/// and well-formed, else `docker`, the id's first 31 digits with no runtime.
fn stated_container(process: &Value) -> Option<Box<StatedContainer>> {
    let text = |path: &[&str]| path.iter().try_fold(process, |value, key| value.get(*key))?.as_str();
    let with_id = |id: &str| container::stated(id, None, text(&["pod", "name"]), text(&["pod", "namespace"]));
    text(&["pod", "container", "id"]).and_then(with_id).or_else(|| text(&["docker"]).and_then(with_id))
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
        assert_eq!(events[5].data, EventData::Exit(Exit { code: 9, repeats: 0 }));
    }

    fn stated(line: &str) -> Option<Box<crate::event::StatedContainer>> {
        let mut source = TetragonSource::new(Lines::from_bytes("t.json", line.as_bytes()), None);
        let events: Vec<Event> = std::iter::from_fn(|| source.next_event().unwrap()).collect();
        let EventData::Exec(exec) = &events.last().unwrap().data else { panic!("{events:?}") };
        exec.stated_container.clone()
    }

    #[test]
    fn takes_the_container_and_pod_a_pod_event_states() {
        const ID: &str = "8d3c0f7b5e2a41c6b9f0e1d2c3b4a5968778695a4b3c2d1e0f9e8d7c6b5a4f3e";
        // The shape of Tetragon's export in a Kubernetes pod: `docker` is the id's first 31
        // digits, `pod.container.id` the whole id with the CRI's scheme.
        let event = |container_id: &str, name: &str| {
            format!(
                r#"{{"process_exec":{{"process":{{"exec_id":"a","pid":10,"uid":0,"cwd":"/app","binary":"/usr/bin/npm","arguments":"ci","flags":"execve clone","docker":"{}","pod":{{"namespace":"ci","name":"{name}","container":{{"id":"{container_id}","name":"build","image":{{"id":"docker.io/library/node@sha256:ab","name":"docker.io/library/node:20"}},"start_time":"2024-04-14T02:17:58Z","pid":1}},"pod_labels":{{"app":"build"}},"workload":"build","workload_kind":"Deployment"}}}},"parent":{{"pid":1}}}},"node_name":"kind-worker","time":"2024-04-14T02:18:14Z"}}"#,
                &ID[..31]
            )
        };
        let full = stated(&event(&format!("containerd://{ID}"), "build-7f9c4d-x2k8q")).unwrap();
        assert_eq!((full.id.as_str(), full.runtime.as_deref()), (ID, Some("containerd")));
        assert_eq!((full.namespace.as_deref(), full.pod_name.as_deref()), (Some("ci"), Some("build-7f9c4d-x2k8q")));
        assert_eq!(full.pod_uid, None, "Tetragon names no pod uid");
        // A malformed full id: the 31 digits of `docker`, with no runtime; an odd name is dropped.
        let short = stated(&event("containerd://xyz", "Build\\u001b[2J")).unwrap();
        assert_eq!((short.id.as_str(), short.runtime, short.pod_name, short.namespace), (&ID[..31], None, None, None));
        // On the host: neither field.
        let host = r#"{"process_exec":{"process":{"pid":10,"binary":"/bin/sh"},"parent":{"pid":1}}}"#;
        assert_eq!(stated(host), None);
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
