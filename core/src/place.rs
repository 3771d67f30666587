//! Where an alert's process ran (host, container, pod, CI job), as the fleet report and the
//! incident page group alerts: a module of its own so that both can use it.

use serde::Serialize;
use serde_json::Value;

use crate::alert::Alert;

/// Where a package's code ran: the host, and the container, pod and CI job when the alert says.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
pub struct Place {
    pub host: String,
    /// `container.id`, as `<container.runtime>://<id>` when the runtime is given.
    pub container: Option<String>,
    /// From `orchestrator`: `<namespace>/<name> (<uid>)` with what the alert says, `pod <uid>`
    /// when it names the uid only (from a cgroup).
    pub pod: Option<String>,
    /// From `ci.*`: each field as `key=value`, in key order.
    pub ci_job: Option<String>,
}

impl Place {
    /// Read from the alert's identity fields, as the engine writes them; each is optional
    /// (older agents send none, a host process has no container).
    pub(crate) fn of(alert: &Alert) -> Place {
        let container = alert.container.as_ref().map(|c| match &c.runtime {
            Some(runtime) => format!("{runtime}://{}", c.id),
            None => c.id.clone(),
        });
        let pod = alert.orchestrator.as_ref().map(|o| match o.resource.name {
            Some(_) => o.pod_label(),
            None => format!("{} {}", o.resource.kind, o.pod_label()),
        });
        let mut ci = Vec::new();
        if let Some(job) = &alert.ci {
            flatten("", &serde_json::to_value(job).unwrap_or_default(), &mut ci);
        }
        let ci_job = (!ci.is_empty()).then(|| ci.join(" "));
        Place { host: alert.host.name.clone(), container, pod, ci_job }
    }
}

/// `key=value` for each scalar under `value` (nested keys joined by `.`), in key order.
fn flatten(prefix: &str, value: &Value, out: &mut Vec<String>) {
    match value {
        Value::Object(fields) => {
            let mut fields: Vec<_> = fields.iter().collect();
            fields.sort_by(|a, b| a.0.cmp(b.0));
            for (name, value) in fields {
                let name = if prefix.is_empty() { name.clone() } else { format!("{prefix}.{name}") };
                flatten(&name, value, out);
            }
        }
        Value::String(s) if !s.is_empty() => out.push(format!("{prefix}={s}")),
        Value::Number(_) | Value::Bool(_) => out.push(format!("{prefix}={value}")),
        _ => {}
    }
}
