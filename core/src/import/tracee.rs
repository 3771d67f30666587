//! Tracee JSON events, one per line, in either schema: the legacy `trace.Event`
//! (`eventName`, `hostProcessId`, `args: [{name, type, value}]`) or `v1beta1.Event`
//! (`name`, `workload.process`, `data: [{name, <type>: value}]`).

use std::collections::VecDeque;

use serde_json::{Map, Value};

use super::{
    jsonl::{rfc3339_ns, Decoder, JsonLines},
    makedev, Format, Known, Lines,
};
use crate::{
    container,
    event::{attribution_env, Event, EventData, Exec, Exit, Fork, Open, StatedContainer},
};

const AT_FDCWD: i32 = -100;

/// One event, either schema, reduced to what is used.
struct Common<'a> {
    name: &'a str,
    time: u64,
    pid: u32,
    tid: u32,
    ppid: u32,
    uid: u32,
    ret: i64,
    args: Vec<(&'a str, &'a Value)>,
    container: Option<Box<StatedContainer>>,
}

impl Common<'_> {
    fn arg(&self, name: &str) -> Option<&Value> {
        self.args.iter().find(|(n, _)| *n == name).map(|(_, v)| *v)
    }
    fn str(&self, name: &str) -> Option<String> {
        self.arg(name).and_then(Value::as_str).map(str::to_owned)
    }
    fn int(&self, name: &str) -> Option<i64> {
        self.arg(name).and_then(number)
    }
    fn strings(&self, name: &str) -> Vec<String> {
        let value = self.arg(name);
        // v1beta1 wraps arrays: `{"value": [...]}`.
        let array = value.and_then(|v| v.as_array().or_else(|| v.get("value")?.as_array()));
        array.map(|a| a.iter().filter_map(Value::as_str).map(str::to_owned).collect()).unwrap_or_default()
    }
}

/// A number, a string holding one, or a protobuf wrapper `{"value": n}`.
fn number(value: &Value) -> Option<i64> {
    match value {
        Value::Number(n) => n.as_i64().or_else(|| n.as_u64().map(|u| u as i64)),
        Value::String(s) => s.parse().ok(),
        Value::Object(o) => o.get("value").and_then(number),
        _ => None,
    }
}

fn field<'a>(value: &'a Value, keys: &[&str]) -> Option<&'a Value> {
    keys.iter().find_map(|k| value.get(*k))
}

/// The string at `path` (object keys from `object`).
fn text<'a>(object: &'a Map<String, Value>, path: &[&str]) -> Option<&'a str> {
    let (first, rest) = path.split_first()?;
    rest.iter().try_fold(object.get(*first)?, |value, key| value.get(*key))?.as_str()
}

/// The name of the exec event, the only one whose container is read.
const EXEC: &str = "sched_process_exec";

/// The container and pod of a legacy event: `container{id}` and `kubernetes{podName,
/// podNamespace, podUID}`, or the older top-level `containerId`, `podName`, `podNamespace`,
/// `podUID` (an empty id on the host).
fn legacy_container(object: &Map<String, Value>) -> Option<Box<StatedContainer>> {
    let either = |nested: &[&str], flat: &str| text(object, nested).or_else(|| text(object, &[flat]));
    container::stated(
        either(&["container", "id"], "containerId")?,
        either(&["kubernetes", "podUID"], "podUID"),
        either(&["kubernetes", "podName"], "podName"),
        either(&["kubernetes", "podNamespace"], "podNamespace"),
    )
}

fn legacy(object: &Map<String, Value>) -> Result<Common<'_>, String> {
    let get = |key: &str| object.get(key).and_then(number);
    let args = match object.get("args") {
        Some(Value::Array(args)) => {
            args.iter().filter_map(|a| Some((a.get("name")?.as_str()?, a.get("value")?))).collect()
        }
        _ => Vec::new(),
    };
    let pid = get("hostProcessId").or_else(|| get("processId")).ok_or("no hostProcessId or processId")?;
    Ok(Common {
        name: object.get("eventName").and_then(Value::as_str).unwrap_or(""),
        time: get("timestamp").unwrap_or(0).max(0) as u64,
        pid: pid as u32,
        tid: get("hostThreadId").or_else(|| get("threadId")).unwrap_or(pid) as u32,
        ppid: get("hostParentProcessId").or_else(|| get("parentProcessId")).unwrap_or(0) as u32,
        uid: get("userId").unwrap_or(0) as u32,
        ret: get("returnValue").unwrap_or(0),
        args,
        container: (object.get("eventName").and_then(Value::as_str) == Some(EXEC))
            .then(|| legacy_container(object))
            .flatten(),
    })
}

fn v1beta1(value: &Map<String, Value>) -> Result<Common<'_>, String> {
    let time = match value.get("timestamp") {
        Some(Value::String(text)) => rfc3339_ns(text).ok_or_else(|| format!("bad timestamp {text:?}"))?,
        Some(stamp @ Value::Object(_)) => {
            let seconds = stamp.get("seconds").and_then(number).unwrap_or(0).max(0) as u64;
            let nanos = stamp.get("nanos").and_then(number).unwrap_or(0).max(0) as u64;
            seconds.saturating_mul(1_000_000_000).saturating_add(nanos)
        }
        _ => 0,
    };
    let process = value.get("workload").and_then(|w| w.get("process")).ok_or("no workload.process")?;
    let pid = field(process, &["host_pid", "hostPid", "pid"]).and_then(number).ok_or("no workload.process.pid")?;
    let thread = process.get("thread");
    let tid = thread.and_then(|t| field(t, &["host_tid", "hostTid", "tid"])).and_then(number).unwrap_or(pid);
    let parent = process.get("ancestors").and_then(|a| a.get(0));
    let ppid = parent.and_then(|p| field(p, &["host_pid", "hostPid", "pid"])).and_then(number).unwrap_or(0);
    let uid = process.get("real_user").or_else(|| process.get("realUser")).and_then(|u| u.get("id")).and_then(number);
    let args: Vec<(&str, &Value)> = match value.get("data") {
        Some(Value::Array(data)) => data
            .iter()
            .filter_map(|d| {
                let object = d.as_object()?;
                let name = object.get("name")?.as_str()?;
                let value = object.iter().find(|(k, _)| k.as_str() != "name")?.1;
                Some((name, value))
            })
            .collect(),
        _ => Vec::new(),
    };
    let ret = args
        .iter()
        .find(|(n, _)| matches!(*n, "returnValue" | "return_value"))
        .and_then(|(_, v)| number(v))
        .unwrap_or(0);
    // `workload.container{id}`, `workload.k8s{pod{name, uid}, namespace{name}}`.
    let container = text(value, &["workload", "container", "id"])
        .filter(|_| value.get("name").and_then(Value::as_str) == Some(EXEC))
        .and_then(|id| {
            container::stated(
                id,
                text(value, &["workload", "k8s", "pod", "uid"]),
                text(value, &["workload", "k8s", "pod", "name"]),
                text(value, &["workload", "k8s", "namespace", "name"]),
            )
        });
    Ok(Common {
        container,
        name: value.get("name").and_then(Value::as_str).unwrap_or(""),
        time,
        pid: pid as u32,
        tid: tid as u32,
        ppid: ppid as u32,
        uid: uid.unwrap_or(0) as u32,
        ret,
        args,
    })
}

/// Tracee's mapping, for both schemas.
#[derive(Default)]
pub(super) struct Tracee {
    known: Known,
}

pub(super) type TraceeSource = JsonLines<Tracee>;

impl TraceeSource {
    pub(super) fn new(lines: Lines) -> TraceeSource {
        JsonLines::with_decoder(lines, Tracee::default())
    }
}

impl Decoder for Tracee {
    const FORMAT: Format = Format::Tracee;

    fn decode(&mut self, object: &Map<String, Value>, out: &mut VecDeque<Event>) -> Result<(), String> {
        let e = if object.contains_key("eventName") {
            legacy(object)?
        } else if object.contains_key("name") && object.contains_key("workload") {
            v1beta1(object)?
        } else {
            return Err("not a Tracee event (no eventName, or name and workload)".into());
        };
        let announce = |known: &mut Known, out: &mut VecDeque<Event>| {
            if let Some(fork) = known.announce(e.time, e.ppid, e.pid) {
                out.push_back(fork);
            }
        };
        match e.name {
            EXEC => {
                announce(&mut self.known, out);
                let executable = e.str("pathname").unwrap_or_default();
                let env = e.strings("env").join("\0");
                out.push_back(Event {
                    time_ns: e.time,
                    pid: e.pid,
                    data: EventData::Exec(Exec {
                        ppid: e.ppid,
                        filename: e.str("cmdpath").unwrap_or_else(|| executable.clone()),
                        executable,
                        args: e.strings("argv"),
                        cwd: e.str("cwd").unwrap_or_default(),
                        uid: e.uid,
                        env: attribution_env(env.as_bytes()),
                        stated_container: e.container.clone(),
                        ..Exec::default()
                    }),
                });
            }
            "sched_process_fork" => {
                let child = e.int("child_pid").or_else(|| e.int("child_ns_pid"));
                let child_tid = e.int("child_tid").or_else(|| e.int("child_ns_tid"));
                let Some(child) = child.filter(|&c| c > 0) else {
                    return Err("sched_process_fork without child_pid".into());
                };
                if child_tid.is_some_and(|t| t != child) {
                    // A new thread, not a process.
                    return Ok(());
                }
                let parent = e.int("parent_pid").unwrap_or(e.pid as i64) as u32;
                if !self.known.contains(child as u32) {
                    self.known.insert(child as u32);
                    out.push_back(Event {
                        time_ns: e.time,
                        pid: parent,
                        data: EventData::Fork(Fork { child_pid: child as u32 }),
                    });
                }
            }
            "sched_process_exit" => {
                let group = e.arg("process_group_exit").and_then(Value::as_bool).unwrap_or(e.tid == e.pid);
                if !group {
                    return Ok(());
                }
                let code = e.int("exit_code").unwrap_or(0) as u32;
                self.known.remove(e.pid);
                out.push_back(Event { time_ns: e.time, pid: e.pid, data: EventData::Exit(Exit { code, repeats: 0 }) });
            }
            "open" | "openat" | "openat2" | "creat" | "security_file_open" => {
                let lsm = e.name == "security_file_open";
                let pathname = e.str("pathname").ok_or_else(|| format!("{} without pathname", e.name))?;
                let flags = match e.arg("flags") {
                    Some(Value::String(text)) => super::parse_open_flags(text).unwrap_or(0),
                    Some(other) => number(other).unwrap_or(0) as u64,
                    None if e.name == "creat" => 0o1101,
                    None => 0,
                };
                let dirfd = if e.name == "openat" || e.name == "openat2" {
                    e.int("dirfd").unwrap_or(AT_FDCWD as i64) as i32
                } else {
                    AT_FDCWD
                };
                // security_file_open's pathname is the kernel's path of the opened file; the
                // path the process gave is syscall_pathname, when present.
                let (path, abs_path) = if lsm {
                    (
                        e.str("syscall_pathname").filter(|p| !p.is_empty()).unwrap_or_else(|| pathname.clone()),
                        Some(pathname),
                    )
                } else {
                    (pathname.clone(), pathname.starts_with('/').then_some(pathname))
                };
                let (dev, ino) = if lsm {
                    // Kernel dev_t: major in the high 12 bits, minor in the low 20.
                    let dev = e.int("dev").unwrap_or(0) as u64;
                    (if dev == 0 { 0 } else { makedev(dev >> 20, dev & 0xf_ffff) }, e.int("inode").unwrap_or(0) as u64)
                } else {
                    (0, 0)
                };
                announce(&mut self.known, out);
                out.push_back(Event {
                    time_ns: e.time,
                    pid: e.pid,
                    data: EventData::Open(Open {
                        same_file_as: None,
                        blocked: false,
                        denied: false,
                        fail_closed: false,
                        tid: e.tid,
                        syscall: e.name.to_owned(),
                        dirfd,
                        flags,
                        mode: e.int("mode").unwrap_or(0) as u64,
                        path,
                        abs_path,
                        truncated: false,
                        ret: e.ret,
                        dev,
                        ino,
                        repeats: 0,
                    }),
                });
            }
            _ => {}
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::import::EventSource;

    fn events(text: &str) -> (Vec<Event>, Vec<String>) {
        let mut source = TraceeSource::new(Lines::from_bytes("tracee.json", text.as_bytes()));
        let (mut events, mut errors) = (Vec::new(), Vec::new());
        loop {
            match source.next_event() {
                Ok(Some(event)) => events.push(event),
                Ok(None) => return (events, errors),
                Err(error) => errors.push(error.to_string()),
            }
        }
    }

    fn kinds(events: &[Event]) -> Vec<String> {
        events
            .iter()
            .map(|e| format!("{}:{}", e.pid, serde_json::to_value(&e.data).unwrap()["kind"].as_str().unwrap()))
            .collect()
    }

    #[test]
    fn reads_the_legacy_schema() {
        let text = concat!(
            r#"{"timestamp":1657291777566819000,"processId":1,"threadId":1,"parentProcessId":0,"hostProcessId":300,"hostThreadId":300,"hostParentProcessId":299,"userId":1000,"processName":"sh","eventName":"sched_process_fork","argsNum":4,"returnValue":0,"args":[{"name":"parent_tid","type":"int","value":300},{"name":"parent_pid","type":"int","value":300},{"name":"child_tid","type":"int","value":301},{"name":"child_pid","type":"int","value":301}]}"#,
            "\n",
            r#"{"timestamp":1657291777566819100,"processId":301,"threadId":301,"parentProcessId":300,"hostProcessId":301,"hostThreadId":301,"hostParentProcessId":300,"userId":1000,"processName":"cat","eventName":"sched_process_exec","argsNum":3,"returnValue":0,"args":[{"name":"cmdpath","type":"const char*","value":"/bin/cat"},{"name":"pathname","type":"const char*","value":"/usr/bin/cat"},{"name":"argv","type":"const char**","value":["cat","/home/alice/.npmrc"]},{"name":"env","type":"const char**","value":["NPM_TOKEN=secret","npm_package_name=evil"]}]}"#,
            "\n",
            r#"{"timestamp":1657291777566819200,"processId":301,"threadId":302,"parentProcessId":300,"hostProcessId":301,"hostThreadId":302,"hostParentProcessId":300,"userId":1000,"processName":"cat","eventName":"openat","argsNum":4,"returnValue":3,"args":[{"name":"dirfd","type":"int","value":-100},{"name":"pathname","type":"const char*","value":"/home/alice/.npmrc"},{"name":"flags","type":"int","value":524288},{"name":"mode","type":"mode_t","value":0}]}"#,
            "\n",
            r#"{"timestamp":1657291777566819300,"processId":301,"threadId":301,"parentProcessId":300,"hostProcessId":301,"hostThreadId":301,"hostParentProcessId":300,"userId":1000,"processName":"cat","eventName":"security_file_open","argsNum":6,"returnValue":0,"args":[{"name":"pathname","type":"const char*","value":"/home/alice/.npmrc"},{"name":"flags","type":"string","value":"O_RDONLY|O_LARGEFILE"},{"name":"dev","type":"dev_t","value":265289729},{"name":"inode","type":"unsigned long","value":4242},{"name":"ctime","type":"unsigned long","value":1},{"name":"syscall_pathname","type":"const char*","value":"../.npmrc"}]}"#,
            "\n",
            r#"{"timestamp":1657291777566819400,"processId":301,"threadId":301,"parentProcessId":300,"hostProcessId":301,"hostThreadId":301,"hostParentProcessId":300,"userId":1000,"processName":"cat","eventName":"sched_process_exit","argsNum":2,"returnValue":0,"args":[{"name":"exit_code","type":"long","value":0},{"name":"process_group_exit","type":"bool","value":true}]}"#,
            "\n",
        );
        let (events, errors) = events(text);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(kinds(&events), ["300:fork", "301:exec", "301:open", "301:open", "301:exit"]);
        let EventData::Exec(exec) = &events[1].data else { panic!() };
        assert_eq!((exec.filename.as_str(), exec.executable.as_str(), exec.ppid), ("/bin/cat", "/usr/bin/cat", 300));
        assert_eq!(exec.env.len(), 1, "only attribution variables: {:?}", exec.env);
        let EventData::Open(open) = &events[2].data else { panic!() };
        assert_eq!((open.tid, open.ret, open.flags, open.dirfd), (302, 3, 524288, -100));
        let EventData::Open(lsm) = &events[3].data else { panic!() };
        assert_eq!(
            (lsm.path.as_str(), lsm.abs_path.as_deref(), lsm.ino),
            ("../.npmrc", Some("/home/alice/.npmrc"), 4242)
        );
        assert_eq!(lsm.dev, makedev(253, 1));
        assert_eq!(lsm.flags, 0o100000);
    }

    #[test]
    fn reads_the_v1beta1_schema() {
        let text = concat!(
            r#"{"timestamp":{"seconds":"1732454400","nanos":123456789},"id":"sched_process_exec","name":"sched_process_exec","policies":{"matched":["default-policy"]},"workload":{"process":{"thread":{"name":"sh","host_tid":12345,"tid":12345,"syscall":"execve"},"pid":{"value":12345},"real_user":{"id":{"value":1000}},"executable":{"path":"/usr/bin/sh"},"ancestors":[{"unique_id":9876543210,"host_pid":1234,"pid":1234}]}},"data":[{"name":"pathname","str":"/usr/bin/sh"},{"name":"argv","str_array":{"value":["sh","-c","cat ~/.npmrc"]}}]}"#,
            "\n",
            r#"{"timestamp":{"seconds":"1732454401","nanos":0},"id":"security_file_open","name":"security_file_open","workload":{"process":{"thread":{"host_tid":12345,"tid":12345},"pid":{"value":12345},"ancestors":[{"host_pid":1234}]}},"data":[{"name":"pathname","str":"/home/alice/.npmrc"},{"name":"flags","int32":32768}]}"#,
            "\n",
        );
        let (events, errors) = events(text);
        assert!(errors.is_empty(), "{errors:?}");
        assert_eq!(kinds(&events), ["1234:fork", "12345:exec", "12345:open"]);
        assert_eq!(events[1].time_ns, 1_732_454_400_123_456_789);
        let EventData::Exec(exec) = &events[1].data else { panic!() };
        assert_eq!((exec.args.len(), exec.uid, exec.ppid), (3, 1000, 1234));
        let EventData::Open(open) = &events[2].data else { panic!() };
        assert_eq!((open.abs_path.as_deref(), open.flags), (Some("/home/alice/.npmrc"), 32768));
    }

    #[test]
    fn takes_the_container_and_pod_each_schema_states() {
        const ID: &str = "8d3c0f7b5e2a41c6b9f0e1d2c3b4a5968778695a4b3c2d1e0f9e8d7c6b5a4f3e";
        const UID: &str = "5f3e6c1a-2b7d-4c8e-9a0f-1b2c3d4e5f60";
        let common = r#""timestamp":1,"processId":1,"threadId":1,"parentProcessId":0,"hostProcessId":300,"hostThreadId":300,"hostParentProcessId":299,"userId":0,"processName":"npm","hostName":"kind-worker","eventName":"sched_process_exec","argsNum":1,"returnValue":0,"args":[{"name":"pathname","type":"const char*","value":"/usr/bin/npm"}]"#;
        let lines = [
            // Newer legacy events: `container` and `kubernetes` objects.
            format!(
                r#"{{{common},"container":{{"id":"{ID}","name":"build","image":"docker.io/library/node:20","imageDigest":"sha256:ab"}},"kubernetes":{{"podName":"build-7f9c4d-x2k8q","podNamespace":"ci","podUID":"{UID}"}}}}"#
            ),
            // Older ones: top-level fields.
            format!(
                r#"{{{common},"containerId":"{ID}","containerImage":"node:20","containerName":"build","podName":"build-7f9c4d-x2k8q","podNamespace":"ci","podUID":"{UID}"}}"#
            ),
            // v1beta1: `workload.container` and `workload.k8s`.
            format!(
                r#"{{"timestamp":{{"seconds":"1","nanos":0}},"name":"sched_process_exec","workload":{{"process":{{"pid":{{"value":300}},"ancestors":[{{"host_pid":299}}]}},"container":{{"id":"{ID}","name":"build","image":{{"name":"docker.io/library/node:20"}},"started":true}},"k8s":{{"pod":{{"name":"build-7f9c4d-x2k8q","uid":"{UID}","labels":{{"app":"build"}}}},"namespace":{{"name":"ci"}}}}}},"data":[{{"name":"pathname","str":"/usr/bin/npm"}}]}}"#
            ),
        ];
        for line in &lines {
            let (events, errors) = events(&format!("{line}\n"));
            assert!(errors.is_empty(), "{errors:?}");
            let EventData::Exec(exec) = &events[1].data else { panic!("{events:?}") };
            let stated = exec.stated_container.as_ref().unwrap_or_else(|| panic!("{line}"));
            assert_eq!(
                (stated.id.as_str(), stated.runtime.as_deref(), stated.pod_uid.as_deref()),
                (ID, None, Some(UID)),
                "{line}"
            );
            assert_eq!(
                (stated.namespace.as_deref(), stated.pod_name.as_deref()),
                (Some("ci"), Some("build-7f9c4d-x2k8q"))
            );
        }
        // On the host: an empty id; an absurd one: no container either.
        let host = format!(r#"{{{common},"containerId":"","podName":""}}"#);
        let absurd = format!(r#"{{{common},"container":{{"id":"{}"}}}}"#, "a".repeat(100_000));
        for line in [host, absurd] {
            let (events, _) = events(&format!("{line}\n"));
            let EventData::Exec(exec) = &events[1].data else { panic!("{events:?}") };
            assert_eq!(exec.stated_container, None);
        }
    }

    #[test]
    fn bad_lines_are_recoverable_errors() {
        let text = "{\"eventName\":\"openat\"}\n{\"name\":\"x\",\"workload\":{}}\n\u{1b}[31mred\n{\"eventName\":\"openat\",\"hostProcessId\":5,\"args\":[]}\n{\"eventName\":\"close\",\"processId\":5}\n";
        let (events, errors) = events(text);
        assert!(events.is_empty());
        let lines: Vec<&str> = errors.iter().map(|e| e.split(": ").next().unwrap()).collect();
        assert_eq!(lines, ["tracee.json:1", "tracee.json:2", "tracee.json:3", "tracee.json:4"], "{errors:?}");
    }
}
