//! Rule files that the rules' and the samples' tests both load.

pub(crate) const MINIMAL_RULE: &str = r#"schema: 2
rules:
  - id: demo
    name: Demo
    description: Demo rule.
    category: demo
    severity: high
    kind: target
    access: read
    targets: ["~/.demo-token"]
    samples:
      positive:
        - exec: {pid: 1, args: [npm, install]}
        - open: {pid: 1, path: /home/alice/.demo-token}
      negative:
        - exec: {pid: 1, args: [npm, install]}
        - open: {pid: 1, path: /home/alice/.demo-token.pub}
"#;

pub(crate) const EXEC_RULE: &str = r#"schema: 2
rules:
  - id: demo-exec
    name: Demo
    description: Demo exec rule.
    category: demo
    severity: high
    kind: exec
    exec:
      names: [demo]
      any_args: [--go]
    samples:
      positive:
        - exec: {pid: 1, args: [npm, install]}
        - exec: {pid: 2, ppid: 1, args: [demo, --go]}
      negative:
        - exec: {pid: 1, args: [npm, install]}
        - exec: {pid: 2, ppid: 1, args: [demo, --stop]}
"#;

/// The same rules in schema 1, as files written before schema 2 say them: the kind follows
/// from the key, `access` defaults to `read`.
pub(crate) const MINIMAL_RULE_SCHEMA_1: &str = r#"schema: 1
rules:
  - id: demo
    name: Demo
    description: Demo rule.
    category: demo
    severity: high
    targets: ["~/.demo-token"]
    samples:
      positive:
        - exec: {pid: 1, args: [npm, install]}
        - open: {pid: 1, path: /home/alice/.demo-token}
      negative:
        - exec: {pid: 1, args: [npm, install]}
        - open: {pid: 1, path: /home/alice/.demo-token.pub}
"#;

pub(crate) const EXEC_RULE_SCHEMA_1: &str = r#"schema: 1
rules:
  - id: demo-exec
    name: Demo
    description: Demo exec rule.
    category: demo
    severity: high
    exec:
      names: [demo]
      any_args: [--go]
    samples:
      positive:
        - exec: {pid: 1, args: [npm, install]}
        - exec: {pid: 2, ppid: 1, args: [demo, --go]}
      negative:
        - exec: {pid: 1, args: [npm, install]}
        - exec: {pid: 2, ppid: 1, args: [demo, --stop]}
"#;
