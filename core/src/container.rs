//! Which container (and Kubernetes pod) a process runs in, from its cgroup paths
//! ([`crate::event::Exec::cgroups`]): the only identity the kernel hands over for a process that
//! may be gone before anyone could ask a container runtime about it.
//!
//! The path's components are read from the leaf up, and the first one that names a container
//! wins, so that a container nested in another (Docker in Docker, a kind node) is named by the
//! inner one, and a sub-cgroup a runtime makes inside the container's (`crun`'s `.../container`)
//! still counts as inside it. The forms (the runtimes' own, cgroupfs and systemd drivers):
//!
//! | component                                    | runtime      |
//! |----------------------------------------------|--------------|
//! | `docker-<id>.scope`                          | `docker`     |
//! | `cri-containerd-<id>.scope`, `nerdctl-<id>.scope` | `containerd` |
//! | `crio-<id>.scope`, `crio-<id>`               | `cri-o`      |
//! | `libpod-<id>.scope`, `libpod-<id>`           | `podman`     |
//! | `<id>` under `docker` or `actions_job` (GitHub's job containers) | `docker` |
//! | `<id>` under a containerd namespace (`default`, `k8s.io`, `moby`, `buildkit`) | `containerd` |
//! | `<id>` under a Kubernetes `pod<uid>` (cgroupfs driver) | `cri`: containerd and cri-dockerd both make this path, and nothing in it says which |
//! | `<id>` under any other parent (`docker run --cgroup-parent`) | none said  |
//! | `<pod slice>:cri-containerd:<id>` (kubelet's systemd driver, containerd's cgroupfs one) | `containerd` |
//!
//! `<id>` is 64 lowercase hex digits, as every one of these runtimes makes it; anything else
//! (`libpod-conmon-<id>.scope`, a `ctr run` container named by hand, `user@1000.service`) names no
//! container. Read, not copied: Falco's `libsinsp/runc.cpp` and its per-engine layouts (a prefix
//! and a suffix per runtime; systemd slices and services are the host; the `:cri-containerd:`
//! form), and Tracee's `getContainerIdFromCgroup` (the components from the leaf up, the innermost
//! id wins, 64 hex digits); Tetragon names a container from the leaf cgroup's name or, better, asks
//! the CRI socket, which credwatch does not (the engine reads events only). Unlike Falco, the id is
//! kept whole (64 digits; `docker ps` shows the first 12), and unlike both, a bare id under a pod
//! is not given a runtime it might not be.
//!
//! The pod: `pod<uid>` (cgroupfs) or `kubepods[-<qos>]-pod<uid>.slice` (systemd, which turns
//! the uid's `-` into `_`) above the container, at or under a component naming `kubepods`; the
//! uid must be a UUID.

use crate::event::StatedContainer;

/// A process's container, and its pod under Kubernetes.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct ContainerIdentity {
    /// 64 lowercase hex digits.
    pub id: String,
    /// `docker`, `containerd`, `cri-o`, `podman` or `cri`; `None` where the path does not say.
    pub runtime: Option<&'static str>,
    /// The Kubernetes pod's uid (a UUID, with dashes), under Kubernetes.
    pub pod_uid: Option<String>,
}

/// Length of a container id (hex digits).
const ID_LEN: usize = 64;

/// `<prefix><id>` components, with or without systemd's `.scope`.
const PREFIXES: &[(&str, &str)] = &[
    ("docker-", "docker"),
    ("cri-containerd-", "containerd"),
    ("nerdctl-", "containerd"),
    ("crio-", "cri-o"),
    ("libpod-", "podman"),
];

/// Parents of a bare `<id>` that say its runtime.
const PARENTS: &[(&str, &str)] = &[
    ("docker", "docker"),
    ("actions_job", "docker"),
    ("default", "containerd"),
    ("k8s.io", "containerd"),
    ("moby", "containerd"),
    ("buildkit", "containerd"),
];

/// The container of a process whose cgroups are `cgroups` (one path per hierarchy), or `None`
/// on the host (or for paths that name no container). The first hierarchy that names one wins;
/// another that names the same container tells what the first left unsaid (a v1 cgroupfs path
/// `/kubepods/.../<id>` beside a v2 `.../cri-containerd-<id>.scope`).
pub fn container_of(cgroups: &[String]) -> Option<ContainerIdentity> {
    let mut found = cgroups.iter().filter_map(|path| parse(path));
    let mut first = found.next()?;
    for other in found.filter(|other| other.id == first.id) {
        if matches!(first.runtime, None | Some("cri")) && other.runtime.is_some() {
            first.runtime = other.runtime;
        }
        first.pod_uid = first.pod_uid.or(other.pod_uid);
    }
    Some(first)
}

fn parse(path: &str) -> Option<ContainerIdentity> {
    let parts: Vec<&str> = path.split('/').filter(|part| !part.is_empty()).collect();
    let (at, id, runtime) = parts.iter().enumerate().rev().find_map(|(at, part)| {
        let (id, runtime) = named(part, at.checked_sub(1).map(|parent| parts[parent]))?;
        Some((at, id, runtime))
    })?;
    // The `:cri-containerd:` form carries the pod's slice in the same component.
    let mut above = parts[..at].to_vec();
    above.extend(parts[at].split_once(':').map(|(slice, _)| slice));
    let pod_uid = pod_uid(&above);
    // A bare id in a pod's cgroup: a CRI runtime with the cgroupfs driver.
    let runtime = runtime.or(pod_uid.as_ref().filter(|_| is_id(parts[at])).map(|_| "cri"));
    Some(ContainerIdentity { id: id.to_owned(), runtime, pod_uid })
}

/// The id and runtime a component names, given its parent component.
fn named<'a>(part: &'a str, parent: Option<&str>) -> Option<(&'a str, Option<&'static str>)> {
    if is_id(part) {
        // Not at the hierarchy's root: a top-level cgroup named like an id is nobody's container.
        let parent = parent?;
        let runtime = PARENTS.iter().find(|(name, _)| *name == parent).map(|(_, runtime)| *runtime);
        return Some((part, runtime));
    }
    if let Some((_, id)) = part.rsplit_once(":cri-containerd:") {
        return is_id(id).then_some((id, Some("containerd")));
    }
    let bare = part.strip_suffix(".scope").unwrap_or(part);
    PREFIXES.iter().find_map(|(prefix, runtime)| {
        let id = bare.strip_prefix(prefix).filter(|id| is_id(id))?;
        Some((id, Some(*runtime)))
    })
}

fn is_id(text: &str) -> bool {
    text.len() == ID_LEN && text.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The pod uid named by the components above a container, under a `kubepods` one.
fn pod_uid(above: &[&str]) -> Option<String> {
    let kubepods = above.iter().position(|part| part.contains("kubepods"))?;
    above[kubepods..].iter().rev().find_map(|part| {
        let uid = match part.strip_suffix(".slice") {
            // `kubepods-besteffort-pod<uid>.slice`, `kubepods-pod<uid>.slice` (kind's nodes:
            // `kubelet-kubepods-...`).
            Some(slice) => slice.contains("kubepods").then(|| slice.rsplit_once("-pod"))??.1.replace('_', "-"),
            None => part.strip_prefix("pod")?.to_owned(),
        };
        is_uuid(&uid).then_some(uid)
    })
}

/// The container a foreign trace states: `id` as `<runtime>://<id>` (CRI's form: Tetragon's
/// `pod.container.id`) or bare, with the pod's uid, name and namespace where given. The trace is
/// untrusted: an id that is not 12 to 64 lowercase hex digits names no container (`None`), and a
/// uid that is not a UUID, or a name or namespace that Kubernetes would not accept, is dropped.
pub fn stated(
    id: &str,
    pod_uid: Option<&str>,
    pod_name: Option<&str>,
    namespace: Option<&str>,
) -> Option<Box<StatedContainer>> {
    let (runtime, id) = match id.split_once("://") {
        // The CRI's scheme names; `cri-o` is CRI-O's, as in the cgroup table above.
        Some((scheme, id)) => (["docker", "containerd", "cri-o"].into_iter().find(|r| *r == scheme), id),
        None => (None, id),
    };
    let hex = id.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'));
    // Below 12 digits (`docker ps`'s short id) an id names nothing one could look up.
    if !(12..=ID_LEN).contains(&id.len()) || !hex {
        return None;
    }
    let pod_name = pod_name.filter(|name| is_dns_name(name, 253, true));
    Some(Box::new(StatedContainer {
        id: id.to_owned(),
        runtime: runtime.map(str::to_owned),
        pod_uid: pod_uid.filter(|uid| is_uuid(uid)).map(str::to_owned),
        // A namespace without its pod names nothing.
        namespace: namespace.filter(|ns| pod_name.is_some() && is_dns_name(ns, 63, false)).map(str::to_owned),
        pod_name: pod_name.map(str::to_owned),
    }))
}

/// A Kubernetes object name: a DNS subdomain (`dots`: pod names) or label (namespaces) of at
/// most `max` bytes, lowercase letters, digits and `-`, starting and ending with one of the first two.
fn is_dns_name(text: &str, max: usize, dots: bool) -> bool {
    let alnum = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit();
    let bytes = text.as_bytes();
    !bytes.is_empty()
        && bytes.len() <= max
        && bytes.iter().all(|&b| alnum(b) || b == b'-' || (dots && b == b'.'))
        && alnum(bytes[0])
        && alnum(bytes[bytes.len() - 1])
}

/// `8-4-4-4-12` lowercase hex digits.
fn is_uuid(text: &str) -> bool {
    let groups: Vec<&str> = text.split('-').collect();
    groups.len() == 5
        && groups
            .iter()
            .zip([8, 4, 4, 4, 12])
            .all(|(group, len)| group.len() == len && group.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f')))
}

#[cfg(test)]
mod tests {
    use super::*;

    const ID: &str = "3f6a1c0b9e8d7c6b5a4f3e2d1c0b9a8f7e6d5c4b3a29181716151413121110ff";
    const INNER: &str = "0123456789abcdef0123456789abcdef0123456789abcdef0123456789abcdef";
    const UID: &str = "5f2b7e3c-1a4d-4e8f-9b0c-6d7e8f9a0b1c";
    const UID_: &str = "5f2b7e3c_1a4d_4e8f_9b0c_6d7e8f9a0b1c";

    fn of(path: &str) -> Option<(String, Option<&'static str>, Option<String>)> {
        container_of(&[path.to_owned()]).map(|c| (c.id, c.runtime, c.pod_uid))
    }

    #[test]
    fn names_each_runtime_under_each_driver() {
        let table: Vec<(String, Option<&str>, Option<&str>)> = vec![
            // Docker: cgroupfs (v1 and v2), systemd.
            (format!("/docker/{ID}"), Some("docker"), None),
            (format!("/system.slice/docker-{ID}.scope"), Some("docker"), None),
            // GitHub Actions' job and service containers (`--cgroup-parent actions_job`).
            (format!("/actions_job/{ID}"), Some("docker"), None),
            // containerd's own namespaces (ctr, nerdctl with cgroupfs), nerdctl with systemd.
            (format!("/default/{ID}"), Some("containerd"), None),
            (format!("/k8s.io/{ID}"), Some("containerd"), None),
            (format!("/system.slice/nerdctl-{ID}.scope"), Some("containerd"), None),
            // Podman: rootful systemd, rootless systemd, cgroupfs.
            (format!("/machine.slice/libpod-{ID}.scope"), Some("podman"), None),
            (
                format!("/user.slice/user-1000.slice/user@1000.service/user.slice/libpod-{ID}.scope"),
                Some("podman"),
                None,
            ),
            (format!("/libpod_parent/libpod-{ID}"), Some("podman"), None),
            // crun's sub-cgroup inside the container's.
            (format!("/machine.slice/libpod-{ID}.scope/container"), Some("podman"), None),
            // Kubernetes, cgroupfs driver (v1): each QoS class; the bare id is ambiguous.
            (format!("/kubepods/besteffort/pod{UID}/{ID}"), Some("cri"), Some(UID)),
            (format!("/kubepods/burstable/pod{UID}/{ID}"), Some("cri"), Some(UID)),
            (format!("/kubepods/pod{UID}/{ID}"), Some("cri"), Some(UID)),
            (format!("/kubepods/besteffort/pod{UID}/crio-{ID}"), Some("cri-o"), Some(UID)),
            // Kubernetes, systemd driver (v2): containerd, CRI-O, cri-dockerd, guaranteed QoS.
            (
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/cri-containerd-{ID}.scope"),
                Some("containerd"),
                Some(UID),
            ),
            (
                format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope"),
                Some("cri-o"),
                Some(UID),
            ),
            (
                format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-{ID}.scope/container"),
                Some("cri-o"),
                Some(UID),
            ),
            (
                format!("/kubepods.slice/kubepods-burstable.slice/kubepods-burstable-pod{UID_}.slice/docker-{ID}.scope"),
                Some("docker"),
                Some(UID),
            ),
            (format!("/kubepods.slice/kubepods-pod{UID_}.slice/cri-containerd-{ID}.scope"), Some("containerd"), Some(UID)),
            // Kubelet with the systemd driver, containerd with cgroupfs (k3s, rke2 set-ups).
            (
                format!("/system.slice/containerd.service/kubepods-burstable-pod{UID_}.slice:cri-containerd:{ID}"),
                Some("containerd"),
                Some(UID),
            ),
            // A bare id under an unknown parent (`docker run --cgroup-parent /ci`): no runtime said.
            (format!("/ci/{ID}"), None, None),
        ];
        for (path, runtime, pod) in table {
            assert_eq!(of(&path), Some((ID.to_owned(), runtime, pod.map(str::to_owned))), "{path}");
        }
    }

    #[test]
    fn the_innermost_container_wins() {
        // Docker in Docker (v2, cgroupfs inside a systemd-driven outer container).
        assert_eq!(
            of(&format!("/system.slice/docker-{ID}.scope/docker/{INNER}")),
            Some((INNER.to_owned(), Some("docker"), None))
        );
        // A pod in a kind node (itself a docker container).
        let kind = format!(
            "/system.slice/docker-{ID}.scope/kubelet.slice/kubelet-kubepods.slice/kubelet-kubepods-besteffort.slice/kubelet-kubepods-besteffort-pod{UID_}.slice/cri-containerd-{INNER}.scope"
        );
        assert_eq!(of(&kind), Some((INNER.to_owned(), Some("containerd"), Some(UID.to_owned()))));
    }

    #[test]
    fn the_first_hierarchy_naming_a_container_wins() {
        let cgroups = ["/".to_owned(), format!("/docker/{ID}"), format!("/system.slice/docker-{INNER}.scope")];
        assert_eq!(container_of(&cgroups).map(|c| c.id), Some(ID.to_owned()));
        assert_eq!(container_of(&[]), None);
        // The same container: the v2 path names the runtime the v1 one could not.
        let both = [
            format!("/kubepods/besteffort/pod{UID}/{ID}"),
            format!("/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/cri-containerd-{ID}.scope"),
        ];
        let expected = ContainerIdentity { id: ID.into(), runtime: Some("containerd"), pod_uid: Some(UID.into()) };
        assert_eq!(container_of(&both), Some(expected));
        let unsaid = [format!("/ci/{ID}"), format!("/system.slice/docker-{ID}.scope")];
        assert_eq!(container_of(&unsaid).and_then(|c| c.runtime), Some("docker"));
    }

    #[test]
    fn host_paths_junk_and_odd_ids_name_no_container() {
        let long = "a".repeat(100_000);
        let paths = [
            "/".to_owned(),
            String::new(),
            "/user.slice/user-1000.slice/session-3.scope".to_owned(),
            "/system.slice/docker.service".to_owned(),
            "/system.slice/containerd.service".to_owned(),
            "/init.scope".to_owned(),
            // A top-level cgroup named like an id.
            format!("/{ID}"),
            // conmon, beside the container.
            format!("/machine.slice/libpod-conmon-{ID}.scope"),
            format!(
                "/kubepods.slice/kubepods-besteffort.slice/kubepods-besteffort-pod{UID_}.slice/crio-conmon-{ID}.scope"
            ),
            // Not 64 lowercase hex digits.
            format!("/docker/{}", ID.to_uppercase()),
            format!("/docker/{}", &ID[..63]),
            format!("/docker/{ID}0"),
            format!("/system.slice/docker-{}g.scope", &ID[..63]),
            "/default/my-container".to_owned(),
            format!("/docker/{}\u{e9}", &ID[..62]),
            format!("/docker/{}\u{1b}[2J", &ID[..60]),
            long.clone(),
            format!("/docker/{long}"),
            "//////".to_owned(),
            "/docker/".to_owned(),
            "docker-.scope".to_owned(),
            format!("/system.slice/containerd.service/kubepods-pod{UID_}.slice:cri-containerd:{}", &ID[..63]),
            ":cri-containerd:".to_owned(),
        ];
        for path in paths {
            assert_eq!(of(&path), None, "{path:?}");
        }
    }

    /// Paths stitched from the forms' pieces and odd bytes: whatever comes back is well formed.
    #[test]
    fn stitched_paths_give_well_formed_answers_or_none() {
        let pieces = [
            "/",
            "/",
            "docker",
            "docker-",
            "cri-containerd-",
            "crio-",
            "libpod-",
            "libpod-conmon-",
            ".scope",
            ".slice",
            "kubepods",
            "kubepods-besteffort-pod",
            "pod",
            "-",
            "_",
            ID,
            INNER,
            UID,
            UID_,
            &ID[..40],
            "\u{0}",
            "\u{e9}",
            "\u{1b}[2J",
            "..",
            "actions_job",
            "default",
            "g",
            ":cri-containerd:",
            ":",
        ];
        let mut state: u64 = 0x9e37_79b9_7f4a_7c15;
        let mut next = |bound: usize| {
            state ^= state << 13;
            state ^= state >> 7;
            state ^= state << 17;
            (state % bound as u64) as usize
        };
        let runtimes = [Some("docker"), Some("containerd"), Some("cri-o"), Some("podman"), Some("cri"), None];
        let mut named = 0;
        for _ in 0..20_000 {
            let path: String = (0..next(12)).map(|_| pieces[next(pieces.len())]).collect();
            if let Some(found) = container_of(std::slice::from_ref(&path)) {
                named += 1;
                assert!(is_id(&found.id) && runtimes.contains(&found.runtime), "{path:?}: {found:?}");
                assert!(found.pod_uid.as_deref().is_none_or(is_uuid), "{path:?}: {found:?}");
            }
        }
        // Not a test that cannot fail: some of the stitched paths do name a container.
        assert!(named > 100, "{named}");
    }

    #[test]
    fn a_pod_needs_a_kubepods_parent_and_a_uuid() {
        // Not under kubepods: a `pod<uid>` elsewhere is no pod.
        assert_eq!(of(&format!("/ci/pod{UID}/{ID}")), Some((ID.to_owned(), None, None)));
        // A broken uid names no pod; the container still stands, with the runtime its form says.
        let broken = format!("/kubepods/besteffort/pod{}/crio-{ID}", &UID[..35]);
        assert_eq!(of(&broken), Some((ID.to_owned(), Some("cri-o"), None)));
        let upper = format!("/kubepods.slice/kubepods-pod{}.slice/cri-containerd-{ID}.scope", UID_.to_uppercase());
        assert_eq!(of(&upper), Some((ID.to_owned(), Some("containerd"), None)));
    }

    #[test]
    fn a_stated_container_keeps_well_formed_values_only() {
        let full = stated(&format!("containerd://{ID}"), Some(UID), Some("build-7f9c4d-x2k8q"), Some("ci")).unwrap();
        assert_eq!(
            *full,
            StatedContainer {
                id: ID.into(),
                runtime: Some("containerd".into()),
                pod_uid: Some(UID.into()),
                pod_name: Some("build-7f9c4d-x2k8q".into()),
                namespace: Some("ci".into()),
            }
        );
        assert_eq!(stated(&format!("cri-o://{ID}"), None, None, None).unwrap().runtime.as_deref(), Some("cri-o"));
        assert_eq!(stated(&format!("docker://{ID}"), None, None, None).unwrap().runtime.as_deref(), Some("docker"));
        // A scheme it does not know: the id stands, with no runtime.
        let other = stated(&format!("rkt://{ID}"), None, None, None).unwrap();
        assert_eq!((other.id.as_str(), other.runtime), (ID, None));
        // Tetragon's `docker`: the first 31 digits.
        assert_eq!(stated(&ID[..31], None, None, None).unwrap().id, &ID[..31]);
        // Ids that are none: too short, too long, not lowercase hex, escapes, empty (the host).
        for id in [&ID[..11], &format!("{ID}0"), &ID.to_uppercase(), "\u{1b}[2J0123456789ab", "", "containerd://"] {
            assert_eq!(stated(id, Some(UID), Some("p"), Some("ns")), None, "{id:?}");
        }
        // Odd names, namespaces and uids are dropped, the container kept.
        let long = "a".repeat(254);
        for (uid, name, namespace) in [
            (Some("not-a-uuid"), Some("Build"), Some("ci")),
            (Some(&UID.to_uppercase()[..]), Some("p\x1b[2J"), Some("ci")),
            (None, Some(long.as_str()), Some("ci")),
            (None, Some("-p"), Some("ci")),
            (None, None, Some("ci")),
        ] {
            let found = stated(ID, uid, name, namespace).unwrap();
            assert_eq!((found.pod_uid, found.pod_name, found.namespace), (None, None, None), "{uid:?} {name:?}");
        }
        let odd_namespace = stated(ID, None, Some("p.q-1"), Some(&"n".repeat(64))).unwrap();
        assert_eq!((odd_namespace.pod_name.as_deref(), odd_namespace.namespace), (Some("p.q-1"), None));
    }
}
